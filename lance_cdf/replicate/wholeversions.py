"""Whole commit versions: which of the polled change records the replicator may apply now.

The records of one source commit version are spread over the change topic's partitions;
the transaction topic's END record of the version (`TransactionRecord`) says how many
records it has in each partition. Records of a partition are in commit order, so version
v's records in partition p are the next `record_count` records after the end of the
version before it. `VersionGate` keeps the polled records in memory per partition and
hands out the longest run of complete versions (at least one; at most about
`max_records` records), so every replica commit is the source at exactly one version,
the last one handed out.

Records of a version whose END has not arrived, or whose records have not all been
polled, wait. Memory is bounded by `max_pending` records: beyond that (a version larger
than the bound, e.g. a 10M-row append) everything waiting is handed out as a *piece*: the
replica then records the last whole version it holds and that it is inside the next
one (`lance-cdf.inside-version`), until a later commit completes it. A version whose END
is read before its records and counts more than the bound is cut into pieces of a batch's
size as its records come, rather than held up to the bound first: holding costs a
garbage-collected Python object per record, and a large piece's decode outlasts what the
consumer fetches ahead meanwhile.

Nothing is guessed: the first and the last record of each version's range in each
partition must carry that version (`lance-cdf.commit-version` header), and the record
after the range a later one; a change topic whose records the transaction topic does not
describe (records published without transaction metadata, offsets with holes) stops
the replicator with `TransactionMetadataError` rather than applying a mix.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from confluent_kafka import Consumer, TopicPartition

from lance_cdf.errors import TransactionMetadataError
from lance_cdf.format.definitions import TableDefinition
from lance_cdf.kafka.endpoints import DENIED, denied
from lance_cdf.kafka.publisher import VERSION_HEADER
from lance_cdf.kafka.transactions import TransactionDecoder, TransactionRecord, TransactionStatus
from lance_cdf.ops.clientconfig import KafkaConnection

if TYPE_CHECKING:
    from confluent_kafka import Message

log = logging.getLogger("lance_cdf.replicate")


@dataclass(frozen=True)
class Take:
    """Records to apply in one replica commit, and what that commit records."""

    msgs: list[Message]
    version: int  # the whole source version the replica holds after the commit (0: none)
    transaction_offset: int  # the transaction topic's next offset after that version's END
    version_offsets: dict[int, int]  # per partition: where the records after `version` start
    inside: int | None  # the first version after `version`, partly applied (None: none)
    upto: dict[int, int]  # per partition: the next offset after the records handed out
    # per partition with records in `msgs`: the offset of its first; `msgs` holds them
    # partition after partition in this order, each partition's at consecutive offsets
    first: dict[int, int]
    # the source table's definition as of `version`, when an END handed out carried one
    # (the newest of them); None: unchanged
    definition: TableDefinition | None = None


def _version_of(m: Message) -> int | None:
    for header in m.headers() or []:
        k, v = header[0], header[1]
        if k == VERSION_HEADER and isinstance(v, bytes):
            try:
                return int(v)
            except ValueError:
                return None
    return None


class VersionGate:
    """The polled, not yet applied records of `topic` and the END records of its
    transaction topic; `take()` says what to apply next."""

    def __init__(
        self,
        connection: KafkaConnection,
        topic: str,
        transaction_topic: str,
        decoder: TransactionDecoder,
        max_pending: int,
        consumer: Consumer | None = None,
    ):
        self.topic, self.transaction_topic = topic, transaction_topic
        self.decoder, self.max_pending = decoder, max_pending
        self.connection = connection
        # a consumer of its own; or, given (a `DatabaseReplicator`'s, shared by every
        # table), one that the caller polls: it hands the transaction topic's
        # records over with `feed`, and this gate only (un)assigns its partition
        self.shared = consumer is not None
        self.consumer = (
            consumer
            if consumer is not None
            else Consumer(
                connection.consumer(
                    defaults={"auto.offset.reset": "earliest"},
                    fixed={
                        "group.id": f"lance-cdf-replicate-{transaction_topic}",
                        "enable.auto.commit": False,
                        "isolation.level": "read_committed",
                    },
                )
            )
        )
        self._fed: list[Message] = []  # (shared consumer) polled, not yet read
        self._assigned = False
        self.version = 0
        self.transaction_offset = 0
        self.base: dict[int, int] = {}  # partition -> where the records after `version` start
        self.applied: dict[int, int] = {}  # partition -> next offset applied
        self.pending: dict[int, list[Message]] = {}  # partition -> records from `applied` on
        self.ends: list[tuple[TransactionRecord, int]] = []  # (END, its offset), in order
        self._read = 0  # the transaction topic's next offset to read

    def reset(
        self,
        version: int,
        transaction_offset: int,
        version_offsets: dict[int, int],
        applied: dict[int, int],
    ) -> None:
        """Start over from what the replica recorded (on every partition assignment)."""
        self.version, self.transaction_offset = version, transaction_offset
        self.base, self.applied = dict(version_offsets), dict(applied)
        self.pending, self.ends = {}, []
        self._read = transaction_offset
        at = TopicPartition(self.transaction_topic, 0, transaction_offset)
        if not self.shared:
            self.consumer.assign([at])
            return
        self._fed = []
        if self._assigned:
            self.consumer.incremental_unassign([TopicPartition(self.transaction_topic, 0)])
        self.consumer.incremental_assign([at])
        self._assigned = True

    def feed(self, msgs: list[Message]) -> None:
        """Records of the transaction topic polled by the shared consumer."""
        self._fed.extend(msgs)

    def close(self) -> None:
        if not self.shared:
            self.consumer.close()
        elif self._assigned:
            self._assigned = False
            self.consumer.incremental_unassign([TopicPartition(self.transaction_topic, 0)])

    def waiting(self) -> int:
        return sum(len(v) for v in self.pending.values())

    def add(self, msgs: list[Message], one_partition: int | None = None) -> None:
        """Polled records, in each partition's offset order (older ones, replays below what
        is applied or held, are dropped). `one_partition`: the partition all of `msgs`
        were polled from within one assignment, if so: librdkafka hands a partition's
        records over in offset order, so a batch whose end offsets are its length apart
        has no hole and only those two offsets are read."""
        if not msgs:
            return
        if one_partition is not None:
            first, last = msgs[0].offset(), msgs[-1].offset()
            if first is not None and last is not None and last - first + 1 == len(msgs):
                self._hold(one_partition, msgs, first)
                return
        parts = np.fromiter((m.partition() for m in msgs), np.int64, len(msgs))
        offsets = np.fromiter((m.offset() for m in msgs), np.int64, len(msgs))
        for p in np.unique(parts).tolist():
            idx = np.flatnonzero(parts == p)
            got = offsets[idx]
            expected = self._expected(p, int(got[0]))
            keep = got >= expected
            idx, got = idx[keep], got[keep]
            if not idx.size:
                continue
            if got[0] != expected or (np.diff(got) != 1).any():
                raise self._hole(p, expected)
            self.pending[p].extend(map(msgs.__getitem__, idx.tolist()))

    def _hold(self, p: int, msgs: list[Message], first: int) -> None:
        """`msgs`: partition p's records at offsets first, first + 1, ..."""
        expected = self._expected(p, first)
        if first > expected:
            raise self._hole(p, expected)
        skip = expected - first  # (replays of records applied or held)
        if skip < len(msgs):
            self.pending[p].extend(msgs[skip:] if skip else msgs)

    def _expected(self, p: int, first: int) -> int:
        """The offset of partition p's next record to hold (`first`: the first offset
        polled, where a partition the replica holds nothing of starts)."""
        held = self.pending.setdefault(p, [])
        start = self.applied.get(p)
        if start is None:
            start = self.applied[p] = first
            self.base.setdefault(p, start)
        return start + len(held)

    def _hole(self, p: int, expected: int) -> TransactionMetadataError:
        return TransactionMetadataError(
            f"{self.topic!r} partition {p} has a hole near offset {expected} (a "
            "compacted or truncated topic): whole versions cannot be told apart; "
            "replicate with --no-transaction-topic"
        )

    def _poll_transactions(self) -> None:
        while True:
            if self.shared:
                got, self._fed = self._fed, []
            else:
                # (a zero timeout never hands out what the fetcher holds: 10 ms does)
                got = self.consumer.consume(10_000, 0.01)
            if not got:
                return
            for m in got:
                err = m.error()
                if err is not None and err.code() in DENIED:  # no END would ever come
                    raise denied(
                        "topic",
                        self.transaction_topic,
                        "Describe and Read",
                        self.connection.bootstrap_servers,
                        "consumer",
                        err,
                        "--transaction-topic (or --no-transaction-topic)",
                    )
                if err is not None:
                    continue
                offset = m.offset()
                if offset is None or offset < self._read:
                    continue
                self._read = offset + 1
                value = m.value()
                if value is None:
                    continue
                rec = self.decoder.decode(value)
                if rec.status != TransactionStatus.END or rec.version <= self.version:
                    continue
                if rec.partitions is None:
                    raise TransactionMetadataError(
                        f"the END of {rec.id} on {self.transaction_topic!r} has no "
                        "per-partition counts (published without lance-cdf's routing); "
                        "replicate with --no-transaction-topic"
                    )
                if self.ends and rec.version <= self.ends[-1][0].version:
                    continue  # (a duplicate END: at most once per version is used)
                self.ends.append((rec, offset))

    def without_end(self) -> tuple[int, int, int] | None:
        """(records, first version, last version) of the waiting records whose version's
        END has not been read (the transaction topic read once more first); None: none."""
        with contextlib.suppress(Exception):  # (what was read already still answers)
            self._poll_transactions()
        ended = self.ends[-1][0].version if self.ends else self.version
        versions = [v for held in self.pending.values() for m in held if (v := _version_of(m))]
        late = np.asarray([v for v in versions if v > ended], np.int64)
        if not late.size:
            return None
        return int(late.size), int(late.min()), int(late.max())

    def _have(self, p: int) -> int:
        return self.applied.get(p, 0) + len(self.pending.get(p, []))

    def _check(self, version: int, start: int, end: int, p: int) -> None:
        """Version `version`'s records in partition p are offsets [start, end)."""
        held, first = self.pending.get(p, []), self.applied.get(p, 0)
        looks = [(start, True), (end - 1, True), (end, False)]  # (offset, must be `version`)
        for offset, same in looks:
            i = offset - first
            if not 0 <= i < len(held):
                continue  # applied already (a piece), or not polled yet
            found = _version_of(held[i])
            if found is None or (found != version if same else found <= version):
                raise TransactionMetadataError(
                    f"{self.topic!r} partition {p} offset {offset} holds version {found}, "
                    f"but {self.transaction_topic!r} puts version {version} at offsets "
                    f"{start}-{end - 1}: the topics disagree (records published without "
                    "transaction metadata?); replicate with --no-transaction-topic, or "
                    "into a new replica from a topic published with it"
                )

    def take(self, max_records: int) -> Take | None:
        """The next records to apply, or None: wait for more."""
        chosen, cur, blocked = self._walk(max_records)
        if not blocked:  # every END read so far is complete: read the newer ones
            self._poll_transactions()
            chosen, cur, blocked = self._walk(max_records)
        if chosen >= 0:
            return self._whole(chosen, cur)
        if self._piece_due(max_records):
            inside = self.ends[0][0].version if self.ends else self.version + 1
            upto = {p: self._have(p) for p in self.pending}
            msgs, first = self._handout(upto)
            log.warning(
                "%d records of unfinished versions waiting (more than %d, or of a version "
                "of more than that): applying them as a piece of version %d; the replica "
                "holds source version %d plus part of what follows until that version "
                "completes",
                len(msgs),
                self.max_pending,
                inside,
                self.version,
            )
            base = dict(self.base)
            return Take(msgs, self.version, self.transaction_offset, base, inside, upto, first)
        return None

    def _piece_due(self, max_records: int) -> bool:
        """Whether the waiting records (no run of whole versions among them) go as a
        piece: more than the bound wait and every END written so far has been read (an
        END read but not complete is enough: what it waits for is records, not ENDs);
        or the next version's END, read, counts more records than the bound, so that
        version is applied in pieces in any case: each as soon as a batch's worth waits,
        rather than the bound's worth held first."""
        waiting = self.waiting()
        if waiting > self.max_pending and (self.ends or self._caught_up()):
            return True
        if waiting < max_records or not self.ends:
            return False
        counts = self.ends[0][0].partitions or {}
        return sum(records for _, records in counts.values()) > self.max_pending

    def _walk(self, max_records: int) -> tuple[int, dict[int, int], bool]:
        """(index in `ends` of the last END of the longest run of complete versions from
        the one after `version`, about `max_records` records at most: -1 none; where that
        run ends per partition; whether the run stopped at an END whose records are not
        all held, or at the bound, rather than at the last END read)."""
        cur = dict(self.base)
        chosen = -1
        count = 0
        for i, (end, _) in enumerate(self.ends):
            assert end.partitions is not None  # (_poll_transactions refuses others)
            need: dict[int, int] = {}
            for p, (_, records) in end.partitions.items():
                if records:
                    if p not in cur:  # its first records: not polled yet
                        need = {}
                        break
                    need[p] = cur[p] + records
            if len(need) != sum(1 for _, r in end.partitions.values() if r):
                return chosen, cur, True
            if any(self._have(p) < o for p, o in need.items()):
                return chosen, cur, True
            for p, o in need.items():
                self._check(end.version, cur[p], o, p)
                count += o - max(cur[p], self.applied.get(p, 0))
            cur.update(need)
            chosen = i
            if count >= max_records:
                return chosen, cur, True
        return chosen, cur, False

    def _whole(self, chosen: int, cur: dict[int, int]) -> Take:
        """The records of the versions up to `ends[chosen]` (`cur`: where they end)."""
        end, offset = self.ends[chosen]
        upto = {p: max(o, self.applied.get(p, o)) for p, o in cur.items()}
        msgs, first = self._handout(cur)
        handed = [e.definition for e, _ in self.ends[: chosen + 1]]
        definition = next((d for d in reversed(handed) if d is not None), None)
        self.ends = self.ends[chosen + 1 :]
        # pieces applied earlier may reach past this version in some partition: the
        # replica then still holds part of what follows
        beyond = any(o > cur.get(p, o) for p, o in self.applied.items())
        inside = (self.ends[0][0].version if self.ends else end.version + 1) if beyond else None
        return Take(msgs, end.version, offset + 1, cur, inside, upto, first, definition)

    def _caught_up(self) -> bool:
        """Whether every END written so far has been read (so the waiting records are
        really of unfinished versions, not of versions whose END is still on its way)."""
        try:
            _, high = self.consumer.get_watermark_offsets(
                TopicPartition(self.transaction_topic, 0), timeout=10
            )
        except Exception:  # noqa: BLE001 (unknown: wait, the next batch asks again)
            return False
        return high is not None and self._read >= high

    def _handout(self, upto: dict[int, int]) -> tuple[list[Message], dict[int, int]]:
        """The held records below `upto` per partition, and the offset of each
        partition's first of them (those of a partition follow each other)."""
        out: list[Message] = []
        first: dict[int, int] = {}
        for p, o in upto.items():
            held, start = self.pending.get(p, []), self.applied.get(p, 0)
            n = o - start
            if n > 0:
                out.extend(held[:n])
                first[p] = start
        return out, first

    def done(self, take: Take) -> None:
        """`take` is committed to the replica."""
        for p, upto in take.upto.items():
            held, first = self.pending.get(p, []), self.applied.get(p, 0)
            n = max(0, upto - first)
            if n:
                self.pending[p] = held[n:]
                self.applied[p] = first + n
        self.version, self.transaction_offset = take.version, take.transaction_offset
        self.base = dict(take.version_offsets)
