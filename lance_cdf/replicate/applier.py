"""One batch of a topic's records applied to its replica: the records below the replica's
position dropped, the rest decoded to final states (`FinalStatesDecoder`), applied by
`ReplicaTable.apply` in one Lance commit carrying the Kafka position they reach (and the
source version, for whole versions), then the consumer group's offsets committed, the
counters updated and the replica's upkeep run when due."""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaException, TopicPartition

from lance_cdf.errors import LanceCdfError
from lance_cdf.ops import malloc
from lance_cdf.replicate.counters import Counters
from lance_cdf.replicate.final_states import FinalStates, FinalStatesDecoder
from lance_cdf.replicate.replica import (
    DEFINITION_PROPERTY,
    INSIDE_VERSION_PROPERTY,
    MAX_ROWID_PROPERTY,
    OFFSETS_PROPERTY,
    ORIGIN_PROPERTY,
    RECORDS_THROUGH_PROPERTY,
    SOURCE_ROWID,
    SOURCE_VERSION_PROPERTY,
    TRANSACTION_OFFSET_PROPERTY,
    VERSION_OFFSETS_PROPERTY,
    ReplicaTable,
    crash_point,
    offsets_of,
    source_version_of,
)
from lance_cdf.replicate.replica_definition import definition_json, definition_of_json
from lance_cdf.replicate.replica_identity import ReplicaIdentity
from lance_cdf.replicate.replicate_settings import ReplicaSettings
from lance_cdf.replicate.wholeversions import Take

if TYPE_CHECKING:
    from confluent_kafka import Message

log = logging.getLogger("lance_cdf.replicate")


class Positions(NamedTuple):
    """Where a batch's records lie (`batch_positions`)."""

    parts: np.ndarray  # per record: its partition
    offsets: np.ndarray  # per record: its offset, or a rank ordering a partition's records
    keep: np.ndarray  # per record: at or above the replica's position
    next_offsets: dict[int, int]  # per partition: the next offset after the batch


def _offset(m: Message) -> int:
    """A consumed record's offset (librdkafka gives every record it hands out one)."""
    offset = m.offset()
    if offset is None:
        raise LanceCdfError(f"Kafka handed out a record of {m.topic()!r} without an offset")
    return offset


def batch_positions(
    msgs: list[Message], applied: dict[int, int], one_partition: int | None = None
) -> Positions:
    """(partition, rank, keep) per message and the next offset per partition, given the
    replica's position (`applied`: next offset per partition): `rank` orders a partition's
    records as their offsets do, `keep` marks those at or above the position. A batch
    polled from `one_partition` within one assignment (librdkafka hands a partition's
    records over in offset order) reads just the offsets at its ends and, when it starts
    below the position, a binary search's worth; any other batch reads every record's
    partition and offset."""
    n, next_offsets = len(msgs), dict(applied)
    if one_partition is None or not n:
        parts = np.fromiter((m.partition() for m in msgs), np.int64, n)
        offsets = np.fromiter((m.offset() for m in msgs), np.int64, n)
        keep = np.ones(n, bool)
        for p in np.unique(parts).tolist():
            in_p = parts == p
            keep[in_p] = offsets[in_p] >= applied.get(p, 0)
            next_offsets[p] = max(next_offsets.get(p, 0), int(offsets[in_p].max()) + 1)
        return Positions(parts, offsets, keep, next_offsets)
    one = one_partition
    first, last, held = _offset(msgs[0]), _offset(msgs[-1]), applied.get(one, 0)
    if last < first:  # not in offset order after all: read them all
        return batch_positions(msgs, applied)
    next_offsets[one] = max(next_offsets.get(one, 0), last + 1)
    keep = np.ones(n, bool)
    if first < held:
        keep[: bisect.bisect_left(msgs, held, key=_offset)] = False
    ranks = np.arange(n, dtype=np.int64)
    return Positions(np.full(n, one, np.int64), ranks, keep, next_offsets)


def take_positions(take: Take, n: int, applied: dict[int, int]) -> Positions | None:
    """`batch_positions` of the `n` records a `VersionGate` handed out in `take`, from the
    offsets it knows them at (None: `take` does not account for `n` records)."""
    first = take.first
    counts = np.fromiter((take.upto[p] - o for p, o in first.items()), np.int64, len(first))
    if int(counts.sum()) != n or (counts < 0).any():
        return None
    parts = np.repeat(np.fromiter(first, np.int64, len(first)), counts)
    # each partition's offsets: its first, then one apart (`block`: where its records
    # start in the batch)
    block = np.cumsum(counts) - counts
    starts = np.fromiter(first.values(), np.int64, len(first))
    offsets = np.repeat(starts - block, counts) + np.arange(n, dtype=np.int64)
    held = np.repeat(np.fromiter((applied.get(p, 0) for p in first), np.int64, len(first)), counts)
    next_offsets = dict(applied)
    for p, o in take.upto.items():
        if p in first:
            next_offsets[p] = max(next_offsets.get(p, 0), o)
    return Positions(parts, offsets, offsets >= held, next_offsets)


class BatchApplier:
    """Applies batches of `topic`'s records to `replica`, keyed by `states.key`, from the
    position the replica recorded (`reset`, on every partition assignment)."""

    def __init__(
        self,
        replica: ReplicaTable,
        states: FinalStatesDecoder,
        consumer: Consumer,
        settings: ReplicaSettings,
        counters: Counters,
        on_commit: Callable[[KafkaException, list[TopicPartition]], None],
    ):
        self.topic, self.replica, self.states = states.topic, replica, states
        self.identity: ReplicaIdentity = states.identity
        self.consumer, self.settings, self.counters = consumer, settings, counters
        # the consumer the group's offsets are committed with (a database replicator
        # sharing its tables in a group: its member's, the group's offsets being only
        # its members' to commit)
        self.committer = consumer
        self.on_commit = on_commit  # (a failed offset commit: counted and logged)
        self.prefix = ""  # (a database replicator's tables: each log line names its topic)
        self.applied: dict[int, int] = {}  # partition -> next offset the replica holds
        self.through = 0  # the highest source version of any record applied
        # (source version, highest _source_rowid) the replica holds: above them a key
        # cannot be there (None: unknown, look every upsert up); read from the replica
        # on assignment, advanced per batch
        self.fresh: tuple[int, int] | None = None
        self.since_compaction = 0
        # the source's definition the replica recorded (JSON; None: none received yet)
        self.definition: str | None = None
        self.batch_rows = 0  # rows the last batch wrote (a bound on unindexed rows)

    def reset(self, position: dict[str, str]) -> None:
        """Resume from what the replica recorded (`ReplicaTable.position`)."""
        through = position.get(RECORDS_THROUGH_PROPERTY)
        self.through = int(through) if through is not None else (source_version_of(position) or 0)
        self.applied = offsets_of(position, self.topic)
        keyed_by_rowid = self.states.key == [SOURCE_ROWID]
        self.fresh = self.replica.fresh_bounds(position) if keyed_by_rowid else None
        self.definition = position.get(DEFINITION_PROPERTY)
        if self.definition is not None and self.replica.keeper is not None:
            self.replica.keeper.want(definition_of_json(self.definition))

    def apply(
        self, msgs: list[Message], take: Take | None = None, one_partition: int | None = None
    ) -> None:
        """Apply `msgs` (those below the replica's position skipped) in one replica commit;
        `take`: whole versions (what the commit records of them), else records as they
        come; `one_partition`: the partition all of `msgs` were polled from within one
        assignment, if so (`batch_positions`)."""
        t0 = time.perf_counter()
        # `offsets` may be ranks (only their order within a partition is used below)
        known = None if take is None else take_positions(take, len(msgs), self.applied)
        positions = known or batch_positions(msgs, self.applied, one_partition)
        parts, offsets, keep, next_offsets = positions
        if keep.all():
            unapplied = msgs
        else:
            unapplied = [msgs[i] for i in np.flatnonzero(keep).tolist()]
            parts, offsets = parts[keep], offsets[keep]
        states = self.states.final_states(unapplied, parts, offsets, self.fresh)
        self.counters.registry_retries = self.states.schemas.outages
        t1 = time.perf_counter()
        props, fresh = self._properties(states, next_offsets, take)
        self.replica.apply(states.upserts, states.deletes, props, fresh=states.new_rows)
        if take is not None and self.replica.keeper is not None:
            # (made the replica's by the upkeep below, now that the version is applied)
            self.replica.keeper.want(take.definition)
        self.batch_rows = 0 if states.upserts is None else states.upserts.num_rows
        self.applied = next_offsets
        self.fresh = fresh
        crash_point("after-lance-commit")
        t2 = time.perf_counter()
        # asynchronous: the replica's commit holds the position (a restart reads it from
        # there), Kafka's committed offsets only follow it for tools that watch the group;
        # a synchronous commit waited a broker round trip per batch. Failures arrive in
        # on_commit; the replicator commits synchronously at the end.
        self.commit_offsets(next_offsets, asynchronous=True)
        c = self.counters
        c.decode_s += t1 - t0
        c.apply_s += t2 - t1
        c.offset_commit_s += time.perf_counter() - t2
        c.lag = self._lag(next_offsets)
        self._count(states, len(msgs), len(msgs) - len(unapplied), take)
        t3 = time.perf_counter()
        self.maintain()
        c.upkeep_s += time.perf_counter() - t3

    def _properties(
        self, states: FinalStates, next_offsets: dict[int, int], take: Take | None
    ) -> tuple[dict[str, str], tuple[int, int] | None]:
        """What the batch's replica commit records (position, identity, versions), and the
        replica's fresh bounds after it."""
        props = {OFFSETS_PROPERTY: json.dumps({self.topic: next_offsets})}
        props.update(self.identity.properties())
        if take is not None:  # whole versions: the last whole one, never a later one
            if take.version:
                props[SOURCE_VERSION_PROPERTY] = str(take.version)
            props[TRANSACTION_OFFSET_PROPERTY] = str(take.transaction_offset)
            props[VERSION_OFFSETS_PROPERTY] = json.dumps({self.topic: take.version_offsets})
            if take.inside is not None:
                props[INSIDE_VERSION_PROPERTY] = str(take.inside)
            if take.definition is not None:
                self.definition = definition_json(take.definition)
        if self.definition is not None:  # (carried forward)
            props[DEFINITION_PROPERTY] = self.definition
        self.through = max(self.through, states.version)
        props[RECORDS_THROUGH_PROPERTY] = str(self.through)
        fresh = self.fresh
        if fresh is not None:
            upserts = states.upserts
            top = pc.max(upserts[SOURCE_ROWID]).as_py() if upserts is not None else None
            fresh = (max(fresh[0], states.version), max(fresh[1], -1 if top is None else top))
            props[MAX_ROWID_PROPERTY] = str(fresh[1])
            props[ORIGIN_PROPERTY] = "records"  # created here, or carried forward
        return props, fresh

    def _count(self, states: FinalStates, records: int, skipped: int, take: Take | None) -> None:
        """The batch in the counters and its progress line."""
        upserts, deletes = states.upserts, states.deletes
        c = self.counters
        c.fresh_upserts += 0 if states.new_rows is None else int(states.new_rows.sum())
        c.batches += 1
        c.records += records
        c.skipped += skipped
        c.tombstones += states.tombstones
        c.upserts += 0 if upserts is None else upserts.num_rows
        c.deletes += 0 if deletes is None else deletes.num_rows
        # no transaction metadata: no version is known to be complete (the highest seen)
        c.source_version = (
            take.version if take is not None else max(c.source_version, states.version)
        )
        log.info(
            "%sbatch %d: %d records (%d skipped), %d upserts, %d deletes, source version %d, "
            "lag %d",
            self.prefix,
            c.batches,
            records,
            skipped,
            0 if upserts is None else upserts.num_rows,
            0 if deletes is None else deletes.num_rows,
            c.source_version,
            c.lag,
        )

    def maintain(self) -> None:
        """Replica upkeep after a batch (its Lance and offset commits are done, so a
        crash here loses nothing): every index kept current in at most
        INDEX_SEGMENTS_MAX segments, and the small fragments compacted when the
        replica's shape calls for it (`compaction_due`); with `compact_every` set,
        every that many batches instead (0: never)."""
        self.since_compaction += 1
        every = self.settings.compact_every
        compact: bool | None = None  # (as the replica's shape says)
        if every is not None:
            compact = 0 < every <= self.since_compaction
        done = self.replica.maintain(compact=compact, batch_rows=self.batch_rows)
        if "fragments_removed" in done:
            self.since_compaction = 0
            # what the compaction's threads freed, back to the kernel (in `lance-cdf
            # replicate`, whose process holds glibc to two arenas; lance_cdf.ops.malloc)
            malloc.release_freed_memory()
        keeper = self.replica.keeper
        if keeper is not None:
            c, w = self.counters, keeper.work
            c.index_builds, c.index_optimizes = w.builds, w.optimizes
            c.indexes_unbuilt = len(w.unbuilt)
        if done:
            crash_point("after-maintenance")
            log.info("replica upkeep: %s", done)

    def commit_offsets(self, offsets: dict[int, int], asynchronous: bool) -> None:
        """The consumer group's offsets of the topic moved to `offsets`."""
        if not offsets:
            return
        try:
            # confluent-kafka's stub overloads commit() on Literal[True] / Literal[False]
            # only, with no overload for a plain bool
            self.committer.commit(  # type: ignore[call-overload]
                offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                asynchronous=asynchronous,
            )
        except KafkaException as exc:  # the replica holds the position: safe to go on
            self.on_commit(exc, [])

    def _lag(self, next_offsets: dict[int, int]) -> int:
        """Records behind the partitions' high watermarks, as of the consumer's last
        fetch responses (cached): asking the broker would wait behind the consumer's
        pending long-poll fetch (docs/benchmarks.md, "Inside the replicator")."""
        lag = 0
        for p, o in next_offsets.items():
            try:
                _, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), cached=True
                )
            except KafkaException:
                continue
            if high is not None and high >= 0:  # negative: no fetch response yet
                lag += max(0, high - o)
        return lag
