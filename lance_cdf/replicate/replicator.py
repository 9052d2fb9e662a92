"""Replicator: consume a lance-cdf Kafka topic and keep a Lance table equal to the source.

    Kafka records -> decode (Avro, schema from the registry) -> one Arrow table per batch
    -> last state per key (Arrow group-by) -> ReplicaTable.apply (deletes, upserts)
    -> Kafka offsets committed

The jobs live apart: `ReplicateSettings` (what it is told), `StartChecks` (lease, whose
replica, where it resumes), `run_polls` (the poll loop a database replicator shares),
`VersionGate` (which records form whole source versions), `FinalStatesDecoder` (records ->
the last state of each key; `SchemaDecoder` fetches the schemas), `BatchApplier` (one
batch into the replica, its position and counters), `ReplicaTable` (the Lance commit).
`Replicator` puts them together for one topic and one replica.

Exactly once in effect: each batch's Kafka position (next offset per partition)
is stored in the same Lance commit as the rows it describes (see `ReplicaTable.apply`);
Kafka offsets are committed only after that commit; on start and on every
partition assignment the consumer is positioned from the replica itself, and
records below the replica's position are skipped. A crash anywhere therefore
replays at most the one batch that was not committed to Lance, and replaying
it is idempotent.

New rows need no lookup. Keyed by `_source_rowid` (the default), in a replica the
replicator created (every row came from a record), an upserted key cannot be in the
replica when
  * it is above the highest `_source_rowid` ever upserted (recorded in every commit
    as `lance-cdf.max-source-rowid`): Lance hands out row IDs in increasing order
    and never reuses one, so a source insert's row ID usually is; or
  * its first record in the batch is an insert (op "c") at a source version above
    the one the replica recorded before the batch: an insert carries a row ID the
    source did not hold at the version before, and a row that comes back (a
    `restore`) was deleted first, by a delete record earlier in the same partition.
Such keys are written without a key-index probe. A re-published range or a replay
has keys and versions at or below the recorded ones and is looked up as before; so
is everything with a user key (a user key can come back with a new row ID) and
everything in a replica the replicator did not create.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from lance_cdf.errors import ConsumerFatalError, LanceCdfError
from lance_cdf.kafka.endpoints import DENIED, check_consumer_access, denied
from lance_cdf.kafka.transactions import TransactionDecoder, default_topic
from lance_cdf.ops.lease import Lease
from lance_cdf.replicate import unfinished
from lance_cdf.replicate.applier import BatchApplier
from lance_cdf.replicate.consumers import (
    DeadLetters,
    Renewals,
    ReplicaClients,
    check_endpoints,
    open_clients,
    replica_consumer_config,
    replica_instance_id,
)
from lance_cdf.replicate.counters import Counters
from lance_cdf.replicate.final_states import FinalStatesDecoder
from lance_cdf.replicate.index_keeper import IndexKeeper
from lance_cdf.replicate.poll_loop import consume_error, run_polls
from lance_cdf.replicate.replica import (
    RECORDS_THROUGH_PROPERTY,
    SOURCE_ROWID,
    SOURCE_VERSION_PROPERTY,
    TRANSACTION_OFFSET_PROPERTY,
    VERSION_OFFSETS_PROPERTY,
    ReplicaTable,
    source_version_of,
)
from lance_cdf.replicate.replica_identity import ReplicaIdentity
from lance_cdf.replicate.replicate_settings import ReplicateSettings
from lance_cdf.replicate.start_checks import StartChecks
from lance_cdf.replicate.unfinished import Unfinished
from lance_cdf.replicate.wholeversions import VersionGate

if TYPE_CHECKING:
    from confluent_kafka import Message

log = logging.getLogger("lance_cdf.replicate")

# (s) while records wait for their version's END, the transaction topic is read again
# after at most this long without new records
END_LOOK_S = 0.05


class ApplyMode(StrEnum):
    """How a replicator applies the records it polls: whole source versions (through its
    `VersionGate`, from the transaction topic's END records), or each record as it comes."""

    VERSIONS = "versions"
    RECORDS = "records"


class Replicator:
    """Consume `topic` (records published by `lance-cdf publish`) and apply them to the
    Lance table at `target`, as `ReplicateSettings` say (each setting named as its
    `lance-cdf replicate` flag): `Replicator(settings)`, or the keyword form
    `Replicator(bootstrap_servers, topic, schema_registry, target, key=["id"],
    max_batch_rows=50_000, ...)` (`ReplicateSettings.of`). Run with `run()`; `stop()`
    ends it after the current batch (it installs no signal handler: `lance-cdf
    replicate` calls `stop()` on SIGTERM / Ctrl-C).

    `shared`: a database replicator's clients (`DatabaseReplicator`). The database
    replicator then polls their one consumer itself and drives this table's replicator
    with `start`, `positioned`, `take`, `feed_transactions` and `finish` instead of `run`.
    """

    def __init__(
        self,
        settings: ReplicateSettings | str,
        *args: Any,
        shared: ReplicaClients | None = None,
        **kwargs: Any,
    ):
        self.settings = s = ReplicateSettings.given(settings, args, kwargs)
        self.topic, self.target = s.topic, s.target
        self.group_id = s.kafka.group_id or f"lance-cdf-replicate-{s.topic}"
        # whole versions (`VersionGate`): the transaction topic read beside `topic`
        # (None: records applied as they come, no source version recorded)
        txn = s.batching.transaction_topic or default_topic(s.topic)
        self.transaction_topic = txn if s.batching.transaction_metadata else None
        self.key = list(s.replica.key) if s.replica.key else [SOURCE_ROWID]
        if shared is None:  # (a shared consumer's owner checked the broker and registry;
            # a denial on one table's topics is named by the poll loop)
            check_endpoints(s.kafka)
            # the topics' and the group's ACLs, named before anything is applied
            check_consumer_access(
                s.kafka.bootstrap_servers,
                s.topic,
                self.group_id,
                s.kafka.consumer_config,
                self.transaction_topic,
            )
        r = s.replica
        self.replica = ReplicaTable(
            s.target,
            self.key,
            r.storage_options,
            keep_row_ids=r.keep_row_ids,
            prewarm=r.preload_index,
            key_map=r.key_map,
            keeper=IndexKeeper(r.source_indexes, r.replica_indexes),
            **({} if r.index_rows_max is None else {"index_rows_max": r.index_rows_max}),
        )
        # (one table's own consumer: a static member of the group, see replica_instance_id)
        self.instance_id = (
            None if shared is not None else replica_instance_id(self.group_id, s.target)
        )
        self.clients = (
            shared
            if shared is not None
            else open_clients(s.kafka, self.group_id, self._on_commit, instance_id=self.instance_id)
        )
        self.consumer: Consumer = self.clients.consumer
        self.counters = Counters()
        self.renewals = Renewals(s.target, self.counters)
        self.identity = ReplicaIdentity(s.topic, s.target)
        letters = DeadLetters(
            s.topic, s.kafka.dead_letter_topic, self.clients.dead_letters, self.counters
        )
        states = FinalStatesDecoder(s.topic, self.key, self.clients.schemas, letters, self.identity)
        self.applier = BatchApplier(
            self.replica, states, self.consumer, r, self.counters, self._on_commit
        )
        if self.clients.shared:  # (one log for every table: each line names its topic)
            self.applier.prefix = f"{s.topic}: "
        self.checks = StartChecks(
            s.topic, self.group_id, self.replica, self.consumer, self.clients.connection, r.rebuild
        )
        self._lease: Lease | None = None
        # None: decided at the first records after an assignment (the transaction topic
        # exists once records do)
        self._mode: ApplyMode | None = None
        self._gate: VersionGate | None = None
        self._position: dict[str, str] = {}
        self._paused: set[int] = set()  # partitions paused by _pace
        self._stop = threading.Event()
        self._assigned: float | None = None
        # assignments so far, the partitions of the last, and the count when the poll in
        # hand started: a batch polled within one assignment of one partition holds that
        # partition's records in offset order (applier.batch_positions)
        self._assignments = 0
        self._partitions: list[int] = []
        self._polled_in = 0
        self._waiting_for_topic = False
        self._started = 0.0

    # -- position -------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(self.positioned(partitions))

    def positioned(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The topic's partitions (about to be assigned) at the replica's position; the
        replicator's state reset to it."""
        self._assigned = time.monotonic()
        self._assignments += 1
        self._partitions = [tp.partition for tp in partitions]
        position = self.replica.position()
        self._position, self._mode = position, None
        self._paused = set()  # (a new assignment starts unpaused)
        self.applier.reset(position)
        self.counters.source_version = max(
            self.counters.source_version, int(position.get(SOURCE_VERSION_PROPERTY, 0))
        )
        for tp in partitions:
            # the replica's own position, never the group's committed offsets (which a
            # deleted or replaced replica does not hold): a partition the replica holds
            # nothing of starts at the beginning (StartChecks refused a start where that
            # would not be the whole history)
            tp.offset = self.applier.applied.get(tp.partition, OFFSET_BEGINNING)
        return partitions

    # -- running --------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self, idle_timeout: float | None = None) -> Counters:
        """Apply batches until stop() (`lance-cdf replicate` calls it on SIGTERM / SIGINT),
        or until no record has arrived for `idle_timeout` seconds since partitions were
        assigned. The batch in progress is finished (its Lance commit and offset commit)
        before returning; nothing is half-applied."""
        self._started = time.monotonic()
        try:
            lease = self.start()
        except BaseException:
            self.consumer.close()
            raise
        self.consumer.subscribe([self.topic], on_assign=self._on_assign)
        try:
            while True:
                try:
                    run_polls(self.consumer, self.settings.batching, self._stop, self, idle_timeout)
                    break
                except ConsumerFatalError as exc:
                    self._renew_consumer(exc)
        finally:
            try:
                self.note_unfinished()
                if self._assigned is not None:  # the last position, waited for
                    self.applier.commit_offsets(self.applier.applied, asynchronous=False)
                self.consumer.close()
                if self._gate is not None:
                    self._gate.close()
                if self.clients.dead_letters is not None:
                    self.clients.dead_letters.flush(30)
            finally:
                self.checks.release(lease)
        return self.counters

    def _renew_consumer(self, exc: ConsumerFatalError) -> None:
        """A new consumer (the same settings, group and subscription) for one librdkafka
        made unusable: it is assigned the partitions again and resumes from the replica's
        position (`positioned`), as after any rebalance. Counted, said in one line."""
        if self._lease is not None:
            # (a writer whose lease was taken over is fenced by its successor, the same
            # static member: it stops rather than fence that one in turn)
            self._lease.check()
        self.renewals.allow(exc, self.applier.prefix)
        with contextlib.suppress(KafkaException, RuntimeError):
            self.consumer.close()
        consumer = Consumer(
            replica_consumer_config(
                self.clients.connection, self.group_id, self._on_commit, self.instance_id
            )
        )
        self.clients.consumer = consumer
        self.use_consumer(consumer)
        if self._assigned is not None:  # (idle counted from the renewal)
            self._assigned = time.monotonic()
        consumer.subscribe([self.topic], on_assign=self._on_assign)

    def use_consumer(self, consumer: Consumer, requests: Consumer | None = None) -> None:
        """Read with `consumer` from now on; the group's offsets committed and the start's
        broker requests (topic metadata, watermarks, committed offsets) made through
        `requests` (default: the same consumer). The one place a replicator's consumers
        are changed: a renewed consumer, or a database replicator's shared consumer and
        its group member."""
        self.consumer = self.applier.consumer = consumer
        self.applier.committer = self.checks.consumer = requests or consumer

    def start(self) -> Lease:
        """One writer per replica (its lease, renewed from a thread), then whose replica it
        is and where it resumes: all refused before anything is applied."""
        try:
            ttl = self.settings.replica.lease_ttl_s
            self._lease = lease = self.checks.acquire_lease(ttl, self.clients.leases)
            self._waiting_for_topic = self.checks.check(self.identity)
        except BaseException:
            if self._lease is not None:
                self.checks.release(self._lease)
            raise
        return lease

    def finish(self, commit: bool = True) -> None:
        """(A shared consumer's replicator) the last position committed to the consumer
        group (`commit`: the topic still exists), the transaction partition let go and
        the lease given up."""
        try:
            self.note_unfinished()
            if commit and self._assigned is not None:
                self.applier.commit_offsets(self.applier.applied, asynchronous=False)
            if self._gate is not None:
                self._gate.close()
        finally:
            if self._lease is not None:
                self.checks.release(self._lease)

    def note_unfinished(self) -> Unfinished | None:
        """On stopping: records held whose version's END never came (the publisher stopped
        before completing their versions) said in one line and kept for `status`
        (`Unfinished`); what an earlier run kept is removed when there are none."""
        found = None
        gate, txn = self._gate, self.transaction_topic
        try:
            held = gate.without_end() if gate is not None and txn is not None else None
            if held is not None and txn is not None:
                found = Unfinished(*held, self.topic, txn, time.time())
                log.warning("%s%s", self.applier.prefix, found.line())
            unfinished.record(self.target, found)
        except Exception as exc:  # noqa: BLE001 (a report only: the stop goes on)
            log.debug("unfinished versions not looked at: %s", exc)
        self.counters.unfinished_records = 0 if found is None else found.records
        return found

    def take(self, msgs: list[Message], one_partition: int | None = None) -> None:
        """Apply what may be applied of the topic's records polled so far: all of them
        without transaction metadata, else whole versions only (`VersionGate`); the
        lease checked first (LeaseLostError: nothing more is applied). `one_partition`:
        the partition all of `msgs` came from within one assignment, if so."""
        if self._lease is not None:
            self._lease.check()
        if self._mode is None:
            if not msgs:
                return
            self._mode = self._start_mode()
        if self._mode == ApplyMode.RECORDS or self._gate is None:
            if msgs:
                self.applier.apply(msgs, one_partition=one_partition)
            return
        gate = self._gate
        gate.add(msgs, one_partition)
        while not self._stop.is_set():
            take = gate.take(self.settings.batching.max_batch_rows)
            if take is None:
                break
            self.applier.apply(take.msgs, take)  # (records of several polls)
            gate.done(take)
        self._pace(gate, arrived=bool(msgs))

    # (a shared consumer's replicator: its owner polls, these take what it polled)
    def feed_transactions(self, msgs: list[Message]) -> bool:
        """Records of the transaction topic polled by the shared consumer, for the gate;
        False: no gate reads them (yet)."""
        if self._gate is None:
            return False
        self._gate.feed(msgs)
        return True

    def added_partitions(self, partitions: list[int]) -> list[TopicPartition]:
        """Partitions the topic gained since assigned (of `partitions`, its partitions
        now), at the replica's position (from the beginning: they are new)."""
        new = sorted(set(partitions) - set(self._partitions))
        self._partitions = sorted([*self._partitions, *new])
        applied = self.applier.applied
        return [TopicPartition(self.topic, p, applied.get(p, OFFSET_BEGINNING)) for p in new]

    def topic_partitions(self) -> list[int] | None:
        """The topic's partitions (None: no such topic)."""
        return self.checks.topic_partitions()

    # -- what the poll loop (poll_loop.run_polls) asks of its own consumer's replicator --
    def next_wait(self) -> float:
        self._polled_in = self._assignments
        wait = self.settings.batching.max_batch_interval
        if self._gate is not None and self._gate.waiting():
            # records wait for their version's END, read from the transaction topic
            # between polls: look again soon rather than after a quiet topic's wait
            wait = min(wait, END_LOOK_S)
        return wait

    def topic_missing(self, m: Message) -> None:
        if not self._waiting_for_topic:  # the publisher has not created it yet
            log.warning("topic %r does not exist yet; waiting for it", self.topic)
        self._waiting_for_topic = True

    def consume_failed(self, m: Message, err: KafkaError) -> LanceCdfError:
        return consume_error(
            err, self.topic, self.group_id, self.settings.kafka.bootstrap_servers, "--topic"
        )

    def handle(self, msgs: list[Message], poll_s: float) -> None:
        self.counters.poll_s += poll_s
        same = self._polled_in == self._assignments and len(self._partitions) == 1
        self.take(msgs, self._partitions[0] if same else None)

    def idle(self, idle_timeout: float, last_data: float) -> bool:
        """Whether `idle_timeout` has passed without a record: counted from the partition
        assignment (a restart may wait for a rebalance), or from start while the topic
        does not exist (it may never come)."""
        now = time.monotonic()
        if self._assigned is not None:
            return now - max(last_data, self._assigned) > idle_timeout
        if self._waiting_for_topic and now - self._started > idle_timeout:
            log.warning(
                "topic %r still does not exist %.0f s after start: --idle-timeout reached, "
                "stopping (nothing applied)",
                self.topic,
                now - self._started,
            )
            return True
        return False

    # -- whole versions -------------------------------------------------------------
    def _pace(self, gate: VersionGate, arrived: bool) -> None:
        """Pause the partitions that hold a batch's worth of waiting records while another
        holds less: librdkafka hands a backlog over partition by partition (a whole fetch
        of one first), and a version needs its records from every partition. Never all of
        them, so the bound on waiting records (a piece) is still reached; and none after a
        poll that brought nothing (`arrived` False): the others have nothing more to give
        now, and a version whose last records are on a paused partition would wait for
        ever."""
        limit = self.settings.batching.max_batch_rows
        ahead = {p for p, held in gate.pending.items() if len(held) >= limit}
        if len(ahead) >= len(self._partitions) or not arrived:
            ahead = set()
        if ahead == self._paused:
            return
        pause, resume = ahead - self._paused, self._paused - ahead
        if pause:
            self.consumer.pause([TopicPartition(self.topic, p) for p in sorted(pause)])
        if resume:
            self.consumer.resume([TopicPartition(self.topic, p) for p in sorted(resume)])
        self._paused = ahead

    def _start_mode(self) -> ApplyMode:
        """VERSIONS when the transaction topic exists (the gate positioned from the
        replica), else RECORDS."""
        txn = self.transaction_topic
        found = None
        if txn is not None:
            found = self.consumer.list_topics(txn, timeout=10).topics.get(txn)
            if found is not None and found.error is not None and found.error.code() in DENIED:
                # not "no transaction topic": applying records as they come would be a guess
                raise denied(
                    "topic",
                    txn,
                    "Describe and Read",
                    self.settings.kafka.bootstrap_servers,
                    "consumer",
                    found.error,
                    "--transaction-topic (or --no-transaction-topic)",
                )
        if txn is not None and found is not None and found.error is None and self._compacted():
            return ApplyMode.RECORDS
        if txn is None or found is None or found.error is not None:
            log.warning(
                "no transaction topic%s: records are applied as they come and the replica "
                "records no source version (it cannot tell a complete one); it records the "
                "highest version applied as %s",
                f" {txn!r}" if txn else "",
                RECORDS_THROUGH_PROPERTY,
            )
            return ApplyMode.RECORDS
        if self._gate is None:
            self._gate = VersionGate(
                self.clients.connection,
                self.topic,
                txn,
                TransactionDecoder(self.clients.schemas.registry),
                self.settings.batching.max_pending_records,
                consumer=self.consumer if self.clients.shared else None,
            )
        position, applied = self._position, self.applier.applied
        bounds = json.loads(position.get(VERSION_OFFSETS_PROPERTY, "{}")).get(self.topic)
        self._gate.reset(
            source_version_of(position) or 0,
            int(position.get(TRANSACTION_OFFSET_PROPERTY, 0)),
            {int(p): int(o) for p, o in bounds.items()} if bounds is not None else dict(applied),
            applied,
        )
        log.info("applying whole source versions (transaction topic %r)", txn)
        return ApplyMode.VERSIONS

    def _compacted(self) -> bool:
        """Whether the change topic is compacted: compaction keeps only the last record of
        each key, so a version's records may be gone and its END can never be matched; the
        replica is then built from the records as they come (the last state of each key),
        said once in one line, and records no source version."""
        policy = self.checks.cleanup_policy()
        if "compact" not in policy.split(","):
            return False
        log.warning(
            "topic %r is compacted (cleanup.policy=%s): a version's records may have been "
            "compacted away, so whole versions cannot be proven; applying records as they "
            "come (the last state of each key) and recording no source version. For whole "
            "versions publish into a topic with cleanup.policy=delete",
            self.topic,
            policy,
        )
        return True

    def _on_commit(
        self, err: KafkaError | KafkaException | None, partitions: list[TopicPartition]
    ) -> None:
        """Offset commit results (librdkafka calls this from consume / close)."""
        failed = [tp for tp in partitions if tp.error is not None]
        if err is None and not failed:
            return
        self.counters.failed()
        log.warning(
            "offset commit failed (the replica's position is kept): %s", err or failed[0].error
        )


def replicate(
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    target: str,
    idle_timeout: float | None = None,
    **options: Any,
) -> Counters:
    """Run a `Replicator` until stopped (or idle for `idle_timeout` seconds)."""
    return Replicator(bootstrap_servers, topic, schema_registry, target, **options).run(
        idle_timeout
    )
