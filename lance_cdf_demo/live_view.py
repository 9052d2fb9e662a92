"""What the demo shows while it runs, per table of the database: versions committed /
published / replicated, Kafka records and lag, and events per second applied, read from
the places a user would look (the tables, the publisher's checkpoint, the topics' offsets,
each replica's recorded position)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lance
from confluent_kafka import Consumer, KafkaException, TopicPartition

from lance_cdf.errors import LanceCdfError
from lance_cdf.format.namespace import resolve_table
from lance_cdf.ops.clientconfig import KafkaConnection
from lance_cdf.replicate.replica import ReplicaTable, offsets_of, source_version_of
from lance_cdf.spark.source.checkpoint import committed_tables

if TYPE_CHECKING:
    from rich.table import Table


@dataclass
class TableSnapshot:
    name: str  # qualified name
    source_version: int
    published_version: int | None
    replicated_version: int | None
    kafka_records: int | None  # None: the topic is not there (or not read) yet
    replicated_records: int

    @property
    def lag_records(self) -> int | None:
        """Records in Kafka the replica has not applied; None (unknown, not 0) until the
        publisher has delivered a version and the topic could be read."""
        if self.published_version is None or self.kafka_records is None:
            return None
        return max(0, self.kafka_records - self.replicated_records)

    @property
    def caught_up(self) -> bool:
        """Every version published, every published record applied (commits that change
        no rows, e.g. a compaction, publish nothing: the replica's version stays behind)."""
        return (
            self.published_version == self.source_version
            and bool(self.kafka_records)
            and self.lag_records == 0
        )


@dataclass
class Snapshot:
    elapsed: float
    tables: list[TableSnapshot]
    events_per_s: float
    last_commit: str

    @property
    def kafka_records(self) -> int:
        return sum(t.kafka_records or 0 for t in self.tables)

    @property
    def replicated_records(self) -> int:
        return sum(t.replicated_records for t in self.tables)

    @property
    def lag_records(self) -> int | None:
        """The tables' lags summed; None while any is unknown."""
        lags = [t.lag_records for t in self.tables]
        return None if any(lag is None for lag in lags) else sum(lag or 0 for lag in lags)

    @property
    def caught_up(self) -> bool:
        return all(t.caught_up for t in self.tables)


class Probe:
    """Reads where each table of the pipeline stands: `sources` (qualified name -> source
    table URI), the publisher's `checkpoint`, the topics `<prefix>.<name>`, and the replica
    database `replica` (its tables appear as the replicator creates them)."""

    def __init__(
        self, sources: dict[str, str], checkpoint: str, replica: str, bootstrap: str, prefix: str
    ):
        self.sources, self.checkpoint, self.replica_root = sources, checkpoint, replica
        self.prefix = prefix
        self.replicas: dict[str, ReplicaTable] = {}
        self.consumer = Consumer(
            KafkaConnection(bootstrap).consumer(fixed={"group.id": "lance-cdf-demo-probe"})
        )
        self.started = time.monotonic()
        self._rate: list[tuple[float, int]] = []

    def topic(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def kafka_records(self, topic: str) -> int | None:
        """The records in `topic`; None while it does not exist or cannot be read."""
        try:
            meta = self.consumer.list_topics(topic, timeout=2).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                return None
            return sum(
                self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=2)[1]
                for p in meta.partitions
            )
        except KafkaException:
            return None

    def _replica(self, name: str) -> ReplicaTable | None:
        """The replica of table `name` once the replicator has created it."""
        if name not in self.replicas:
            try:
                uri = resolve_table(self.replica_root, name)
            except LanceCdfError:  # not created yet
                return None
            self.replicas[name] = ReplicaTable(uri, [])
        return self.replicas[name]

    def snapshot(self, last_commit: str) -> Snapshot:
        now = time.monotonic()
        published = committed_tables(self.checkpoint) or {}
        tables = []
        for name, uri in self.sources.items():
            replica = self._replica(name)
            position = replica.position() if replica is not None else {}  # read once
            tables.append(
                TableSnapshot(
                    name=name,
                    source_version=lance.dataset(uri).version,
                    published_version=published.get(name),
                    replicated_version=source_version_of(position),
                    kafka_records=self.kafka_records(self.topic(name)),
                    replicated_records=sum(offsets_of(position, self.topic(name)).values()),
                )
            )
        replicated = sum(t.replicated_records for t in tables)
        self._rate = [(t, n) for t, n in self._rate if now - t <= 10] + [(now, replicated)]
        (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
        return Snapshot(
            elapsed=now - self.started,
            tables=tables,
            events_per_s=(n1 - n0) / (t1 - t0) if t1 > t0 else 0.0,
            last_commit=last_commit,
        )

    def close(self) -> None:
        self.consumer.close()


def _v(version: int | None) -> str:
    return "-" if version is None else str(version)


def _n(count: int | None) -> str:
    return "-" if count is None else f"{count:,}"


def render(s: Snapshot, total: float, phase: str) -> Table:
    """A rich renderable of one snapshot: a row per table."""
    from rich.table import Table

    table = Table(
        title=f"lance-cdf demo — {phase} ({s.elapsed:.0f}s / {total:.0f}s)",
        show_header=True,
        header_style="bold",
    )
    for column in ("table", "source v", "published v", "replicated v"):
        table.add_column(column, justify="left" if column == "table" else "right")
    table.add_column("Kafka records", justify="right")
    table.add_column("lag", justify="right")
    for t in s.tables:
        table.add_row(
            t.name,
            str(t.source_version),
            _v(t.published_version),
            _v(t.replicated_version),
            _n(t.kafka_records),
            "-" if t.lag_records is None else f"{t.lag_records:,} records",
        )
    table.caption = (
        f"last commit: {s.last_commit}; {s.events_per_s:,.0f} events/s applied (10 s window)"
    )
    return table


def line(s: Snapshot, phase: str) -> str:
    """The same as one plain line, for logs and terminals without rich."""
    tables = "; ".join(
        f"{t.name} v{t.source_version} -> published v{_v(t.published_version)} -> replicated "
        f"v{_v(t.replicated_version)} (lag {_v(t.lag_records)})"
        for t in s.tables
    )
    return (
        f"[{s.elapsed:5.0f}s] {phase}: {tables}; {s.kafka_records} records in Kafka, "
        f"{s.events_per_s:.0f} events/s; last commit: {s.last_commit}"
    )
