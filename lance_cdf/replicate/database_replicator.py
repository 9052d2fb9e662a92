"""Replicate a whole database: every table's topic into a replica database, one consumer.

`lance-cdf publish --database` writes each table of a database to topic
`<prefix>.<qualified name>` (`sales.orders`, a root table `orders`) and its transaction
metadata to `<that topic>.transaction`. `DatabaseReplicator` follows all of them with one
Kafka consumer (manual assignment, refreshed from the broker's topic list every
`refresh_s` seconds: a topic created later is picked up without a restart, one that
disappears is reported and let go), and applies each topic to the table of the same
qualified name in the target database (created as the Lance directory namespace / LanceDB
lays tables out, namespace levels kept: namespace.table_location).

Each table is applied by a `Replicator` of its own that shares the
consumer, the schema decoder, the dead-letter producer and the one thread that renews every
table's lease (lease.LeaseKeeper): its lease, identity checks,
whole source versions (its transaction topic's records are handed to its gate) and
exactly-once position in its own replica's commits are those of a single-topic replica.
A table whose start is refused (its replica follows another topic or table, is leased by
another replicator, or holds a position its topic does not: a topic deleted and created
again) is reported with that error and left out (`refused`; the command exits non-zero
naming it), the other tables go on; a batch that fails stops the whole replicator (nothing
half-applied; every replica resumes from its own position). The poll loop is the one a
single table's replicator runs (`run_polls`); this replicator hands each poll's records
to the tables they belong to.

Several database replicators of one consumer group share the tables (`share_tables`):
each takes up only its share of the listed tables, gives up (between two polls: no batch
half-applied) a table that is no longer its share, and waits for the lease of one that
another member still holds. A table whose lease is lost (this process was cut off for a
TTL and another took it over) is let go alone.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from lance_cdf.errors import (
    ForeignReplicaError,
    LanceCdfError,
    LeaseHeldError,
    LeaseLostError,
    ReplicaPositionError,
    ReplicateError,
    StorageAccessError,
)
from lance_cdf.format.namespace import list_tables, table_location
from lance_cdf.kafka.transactions import SUFFIX as TRANSACTION_SUFFIX
from lance_cdf.ops.clientconfig import redact_url
from lance_cdf.replicate.consumers import check_endpoints, open_clients
from lance_cdf.replicate.counters import Counters, add_counters
from lance_cdf.replicate.poll_loop import consume_error, run_polls
from lance_cdf.replicate.replicate_settings import ReplicateSettings
from lance_cdf.replicate.replicator import Replicator
from lance_cdf.replicate.table_shares import GroupMembers, share_tables, topics_under

if TYPE_CHECKING:
    from confluent_kafka import Message

log = logging.getLogger("lance_cdf.replicate")

# a topic missing from this many topic listings in a row is let go (one listing may be
# served by a broker that has not heard of a topic yet)
GONE_AFTER = 2

# (s) a table of this replicator's share whose lease another replicator of the group still
# holds (handing it over) is asked for again this often
LEASE_RETRY_S = 1.0
# (s) how much longer than --idle-timeout a replicator waits to join its group at start
JOIN_WAIT_S = 60.0


@dataclass(frozen=True)
class TableTopic:
    """A topic of the database's tables: which table it holds."""

    topic: str
    qualified_name: str  # namespace levels and table name joined by "."
    identifier: tuple[str, ...]  # namespace levels, then the table name


def table_topics(
    topics: list[str],
    prefix: str,
    include: re.Pattern[str] | None = None,
    exclude: re.Pattern[str] | None = None,
) -> list[TableTopic]:
    """The topics of `topics` that hold a table: `<prefix>.<qualified name>`, not a
    transaction topic (`*.transaction`) nor Kafka's own (`__*`), the qualified name fully
    matching `include` (if given) and not `exclude`; sorted by topic."""
    out = []
    head = prefix + "."
    for topic in sorted(topics):
        if not topic.startswith(head) or topic.endswith(TRANSACTION_SUFFIX):
            continue
        name = topic[len(head) :]
        identifier = tuple(name.split("."))
        if not all(identifier):
            continue
        if include is not None and not include.fullmatch(name):
            continue
        if exclude is not None and exclude.fullmatch(name):
            continue
        out.append(TableTopic(topic, name, identifier))
    return out


@dataclass
class TableReplica:
    """One table being replicated: its topic, replica location and replicator."""

    table: TableTopic
    target: str
    replicator: Replicator
    partitions: list[TopicPartition]
    missing: int = 0  # topic listings in a row without the topic


class DatabaseReplicator:
    """Apply every table topic `<topic prefix>.<qualified name>` (matching `include` /
    not `exclude`, regexes over qualified names) to the table of that name in the
    database at `target`, as `ReplicateSettings` say (`topic`: the topic prefix;
    `database`: include, exclude, refresh interval); the rest of the settings are each
    table's `Replicator`'s (key, batch sizes, compaction, lease TTL, ...). Also the
    keyword form `DatabaseReplicator(bootstrap_servers, topic_prefix, schema_registry,
    target, include=..., ...)`. Run with `run()`; `stop()` ends it after the current
    batch (it installs no signal handler: `lance-cdf replicate` calls `stop()` on
    SIGTERM / Ctrl-C)."""

    def __init__(self, settings: ReplicateSettings | str, *args: Any, **kwargs: Any):
        self.settings = s = ReplicateSettings.given(settings, args, kwargs)
        prefix = s.topic
        if not prefix or prefix != prefix.strip("."):
            raise ReplicateError(
                f"--topic-prefix {prefix!r} is empty or starts / ends with a dot; give "
                "the publisher's --topic-prefix (topics are PREFIX.namespace.table)"
            )
        try:
            self.include = re.compile(s.database.include) if s.database.include else None
            self.exclude = re.compile(s.database.exclude) if s.database.exclude else None
        except re.error as exc:
            raise ReplicateError(f"--include / --exclude is not a regex: {exc}") from None
        self.topic_prefix, self.target = prefix, s.target
        self.group_id = s.kafka.group_id or f"lance-cdf-replicate-db-{prefix}"
        check_endpoints(s.kafka)
        self.shared = open_clients(s.kafka, self.group_id, _on_commit, shared=True)
        self.consumer = self.shared.consumer
        # the group's members share the tables (`GroupMembers`); the group's offsets are
        # committed through this member
        self.members = GroupMembers(
            self.shared.connection,
            self.group_id,
            topics_under(prefix),
            s.database.member_timeout_s,
        )
        # (each table's replicator: the shared consumer's group)
        self._kafka = replace(s.kafka, group_id=self.group_id)
        self.tables: dict[str, TableReplica] = {}  # topic -> its table
        self._by_transaction_topic: dict[str, TableReplica] = {}
        self.gone: list[str] = []  # qualified names of tables whose topic disappeared
        self._retired = Counters()  # the counters of the tables let go, summed (totals())
        self.refused: dict[str, str] = {}  # topic -> why its table's start was refused
        # tables of this replicator's share whose lease another of the group still holds
        self.waiting: dict[str, TableTopic] = {}
        self._next_retry = 0.0
        self._shared_out = False  # the group's members known at least once
        self._stop = threading.Event()
        self._changed = time.monotonic()  # the last table picked up
        self._started = self._next_refresh = 0.0

    # -- tables -----------------------------------------------------------------------
    def refresh(self) -> None:
        """Pick up the topics that appeared, let go of those that disappeared."""
        try:
            meta = self.consumer.list_topics(timeout=10)
        except KafkaException as exc:
            log.warning(
                "cannot list the topics (%s); asked again in %.0f s",
                exc,
                self.settings.database.refresh_s,
            )
            return
        listed = [
            t
            for t, m in meta.topics.items()
            # (the dead-letter topic is never a table's, also under the prefix)
            if m.error is None and m.partitions and t != self.settings.kafka.dead_letter_topic
        ]
        found = {
            t.topic: t for t in table_topics(listed, self.topic_prefix, self.include, self.exclude)
        }
        for topic, table in list(self.tables.items()):
            if topic in found:
                table.missing = 0
                added = table.replicator.added_partitions(sorted(meta.topics[topic].partitions))
                if added:  # (a topic's partitions can be increased, never decreased)
                    log.info(
                        "table %s: topic %r gained partitions %s",
                        table.table.qualified_name,
                        topic,
                        [tp.partition for tp in added],
                    )
                    self.consumer.incremental_assign(added)
                    table.partitions.extend(added)
                continue
            table.missing += 1
            if table.missing >= GONE_AFTER:
                self._let_go(table)
        for topic in [t for t in self.refused if t not in found]:
            del self.refused[topic]  # (deleted: taken up again if it comes back)
        mine = self._share(found)
        if mine is None:
            return  # (the group is rebalancing: nothing changes hands meanwhile)
        for topic, entry in list(self.tables.items()):
            if topic in found and topic not in mine:  # (one missing: gone, above)
                self._drop(entry, "handed over to another replicator of the group")
        self.waiting = {t: w for t, w in self.waiting.items() if t in mine}
        for topic, table_topic in mine.items():
            if topic not in self.tables and topic not in self.refused:
                self._take_up(table_topic)

    def _share(self, found: dict[str, TableTopic]) -> dict[str, TableTopic] | None:
        """This replicator's share of the tables `found` (None: the group's members are
        not settled now)."""
        members = self.members.members()
        if members is None:
            return None
        if not self._shared_out:
            self._shared_out, self._changed = True, time.monotonic()
        owners = share_tables(list(found), members)
        me = self.members.me
        return {t: table for t, table in found.items() if owners.get(t) == me}

    def _take_up(self, table: TableTopic) -> None:
        try:
            target = table_location(
                self.target, table.identifier, self.settings.replica.storage_options
            )
        except StorageAccessError as exc:
            # (the target's storage refused or did not answer: asked again, LEASE_RETRY_S
            # apart, the other tables go on)
            if table.topic not in self.waiting:
                log.warning("table %s: not taken up yet: %s", table.qualified_name, exc)
            self.waiting[table.topic] = table
            return
        settings = replace(self.settings, kafka=self._kafka, topic=table.topic, target=target)
        replicator = Replicator(settings, shared=self.shared)
        # the group's offsets committed, and the start's broker requests made, through the
        # member: its partitions are paused, so its requests do not queue behind the shared
        # consumer's long-poll fetch
        replicator.use_consumer(self.shared.consumer, requests=self.members.consumer)
        try:
            replicator.start()
        except LeaseHeldError as exc:
            if exc.holder_command is None or not exc.holder_command.endswith(
                f" --group-id {self.group_id}"
            ):
                self._refuse(table, exc)
                return
            # another replicator of the group has it still (handing it over, or it died
            # and its lease has not expired): asked for again, LEASE_RETRY_S apart
            if table.topic not in self.waiting:
                log.info("table %s: waiting for its lease (%s)", table.qualified_name, exc)
            self.waiting[table.topic] = table
            return
        except (ForeignReplicaError, ReplicaPositionError) as exc:
            self._refuse(table, exc)
            return
        self.waiting.pop(table.topic, None)
        try:
            partitions = replicator.topic_partitions()
            if partitions is None:  # (deleted since the listing: the next one says so)
                replicator.finish(commit=False)
                return
            tps = replicator.positioned([TopicPartition(table.topic, p) for p in partitions])
            self.consumer.incremental_assign(tps)
        except BaseException:
            replicator.finish(commit=False)
            raise
        entry = TableReplica(table, target, replicator, tps)
        self.tables[table.topic] = entry
        if replicator.transaction_topic is not None:
            self._by_transaction_topic[replicator.transaction_topic] = entry
        self._changed = time.monotonic()
        log.info("table %s: topic %r -> replica %s", table.qualified_name, table.topic, target)

    def _refuse(self, table: TableTopic, exc: LanceCdfError) -> None:
        self.refused[table.topic] = f"{table.qualified_name}: {exc}"
        log.error("table %s not replicated, the others go on: %s", table.qualified_name, exc)
        self._changed = time.monotonic()

    def _let_go(self, entry: TableReplica) -> None:
        log.warning(
            "table %s: topic %r no longer exists; its replica %s is let go as it stands "
            "(source version %d); the other tables go on",
            entry.table.qualified_name,
            entry.table.topic,
            entry.target,
            entry.replicator.counters.source_version,
        )
        self.gone.append(entry.table.qualified_name)
        self._drop(entry, None)

    def _drop(self, entry: TableReplica, why: str | None) -> None:
        """Stop applying `entry`'s table: its partitions unassigned (what was polled and
        not applied, records of unfinished versions included, is dropped: whoever applies
        it next resumes from the replica's own position) and its lease released. `why`:
        given up while its topic exists (then the group's offsets follow the replica);
        None: its topic is gone, or its lease was lost."""
        topic = entry.table.topic
        if why is not None:
            log.info(
                "table %s: %s (source version %d)",
                entry.table.qualified_name,
                why,
                entry.replicator.counters.source_version,
            )
        del self.tables[topic]
        self._by_transaction_topic.pop(entry.replicator.transaction_topic or "", None)
        add_counters(self._retired, entry.replicator.counters)
        try:
            self.consumer.incremental_unassign(
                [TopicPartition(topic, tp.partition) for tp in entry.partitions]
            )
        finally:
            entry.replicator.finish(commit=why is not None)

    # -- running ----------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    @property
    def counters(self) -> dict[str, Counters]:
        """Each table's progress (by qualified name)."""
        return {t.table.qualified_name: t.replicator.counters for t in self.tables.values()}

    def totals(self) -> Counters:
        """The counters summed over every table replicated since start, those let go
        included (so they only grow: the metrics' counters). Read from any thread."""
        out = Counters(started=self._retired.started)
        add_counters(out, self._retired)
        for entry in list(self.tables.values()):  # (a copy: the poll loop may change it)
            add_counters(out, entry.replicator.counters)
        return out

    def table_positions(self) -> dict[str, tuple[int | None, int]]:
        """Per table replicated now (qualified name): the source version its replica
        applied through (None: none yet) and the records of its topic not yet consumed.
        Read from any thread (the metrics endpoint)."""
        return {
            e.table.qualified_name: (
                e.replicator.counters.source_version or None,
                e.replicator.counters.lag,
            )
            for e in list(self.tables.values())
        }

    def run(self, idle_timeout: float | None = None) -> dict[str, Counters]:
        """Apply batches until stop() (`lance-cdf replicate` calls it on SIGTERM /
        SIGINT), or until no record has arrived (and no table appeared) for `idle_timeout`
        seconds. Each table's batch in progress is finished before returning. Returns each
        table's counters; the tables left out are in `refused` (topic -> why)."""
        self._started, self._next_refresh = time.monotonic(), 0.0
        try:
            run_polls(self.consumer, self.settings.batching, self._stop, self, idle_timeout)
        finally:
            finished = self.counters
            try:
                for entry in list(self.tables.values()):
                    entry.replicator.finish()
            finally:
                self.tables.clear()
                if self.shared.leases is not None:
                    self.shared.leases.close()
                self.members.close()  # (after the leases' release: the group moves on at once)
                self.consumer.close()
                if self.shared.dead_letters is not None:
                    self.shared.dead_letters.flush(30)
        return finished

    # -- what the poll loop (poll_loop.run_polls) asks of it ---------------------------
    def next_wait(self) -> float:
        """The topic list read again when due; a poll waits for a batch's interval (the
        transaction topics come through this consumer too: an END ends the wait)."""
        self.members.poll()
        if self.members.changed.is_set():  # a rebalance: the tables shared out again now
            self.members.changed.clear()
            self._next_refresh = 0.0
        now = time.monotonic()
        if now >= self._next_refresh:
            self.refresh()
            self._next_refresh = time.monotonic() + self.settings.database.refresh_s
        elif self.waiting and now >= self._next_retry:
            for table in list(self.waiting.values()):
                self._take_up(table)
            self._next_retry = now + LEASE_RETRY_S
        return self.settings.batching.max_batch_interval

    def topic_missing(self, m: Message) -> None:
        """(a deleted topic: the next refresh lets its table go)"""

    def consume_failed(self, m: Message, err: KafkaError) -> LanceCdfError:
        bootstrap = self.settings.kafka.bootstrap_servers
        return consume_error(err, str(m.topic()), self.group_id, bootstrap, "--exclude")

    def handle(self, msgs: list[Message], poll_s: float) -> None:
        self._dispatch(msgs)

    def idle(self, idle_timeout: float, last_data: float) -> bool:
        """No record (and no new table) for `idle_timeout` seconds since start."""
        now = time.monotonic()
        if not self._shared_out and now - self._started < idle_timeout + JOIN_WAIT_S:
            return False  # (not in the group yet: its share of the tables is not known)
        quiet_since = max(last_data, self._changed, self._started)
        return now - quiet_since > idle_timeout

    def _dispatch(self, msgs: list[Message]) -> None:
        """Each table's records to its replicator, its transaction records to its gate;
        every table that got any applies what it may."""
        data: dict[str, list[Message]] = {}
        for m in msgs:  # (runs of one partition: a dict lookup per record)
            topic = m.topic()
            if topic is not None:
                data.setdefault(topic, []).append(m)
        touched: dict[str, TableReplica] = {}
        for topic, got in data.items():
            entry = self.tables.get(topic)
            if entry is not None:
                touched[topic] = entry
                continue
            owner = self._by_transaction_topic.get(topic)
            if owner is not None and owner.replicator.feed_transactions(got):
                touched[owner.table.topic] = owner
        for topic, entry in touched.items():
            try:
                entry.replicator.take(data.get(topic, []))  # (its lease checked first)
            except LeaseLostError as exc:
                # another replicator took this table over (this one was cut off for a
                # lease's TTL): nothing more of it is applied here, the others go on
                log.error("table %s: %s", entry.table.qualified_name, exc)
                self._drop(entry, None)


class SourceTables:
    """The source database's tables by qualified name (for the lag metrics of a database
    replicator: `replicate --source-database`), listed again when asked for a name not
    known yet (a table created since); a name it does not hold is None."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        self.root, self.storage_options = root, storage_options
        self._uris: dict[str, str] = {}

    def uris(self, names: list[str]) -> dict[str, str | None]:
        if any(n not in self._uris for n in names):
            try:
                listed = list_tables(self.root, self.storage_options)
            except (LanceCdfError, OSError) as exc:
                log.warning(
                    "cannot list the source database %s (%s); asked again on the next scrape",
                    redact_url(self.root),
                    exc,
                )
            else:
                self._uris = {ref.qualified_name: ref.uri for ref in listed}
        return {n: self._uris.get(n) for n in names}


def _on_commit(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
    """Offset commit results: a failure is logged (every replica holds its own position;
    the group's offsets only follow it for tools that watch the group)."""
    failed = [tp for tp in partitions if tp.error is not None]
    if err is not None or failed:
        log.warning(
            "offset commit failed (the replicas' positions are kept): %s", err or failed[0].error
        )


def replicate_database(
    bootstrap_servers: str,
    topic_prefix: str,
    schema_registry: str,
    target: str,
    idle_timeout: float | None = None,
    **options: Any,
) -> dict[str, Counters]:
    """Run a `DatabaseReplicator` until stopped (or idle for `idle_timeout` seconds)."""
    return DatabaseReplicator(
        bootstrap_servers, topic_prefix, schema_registry, target, **options
    ).run(idle_timeout)
