"""What the demo shows while it runs: versions committed / published / replicated, Kafka
records, events per second and lag, read from the places a user would look (the table,
the Spark checkpoint, the topic's offsets, the replica's recorded position)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lance
from confluent_kafka import Consumer, KafkaException, TopicPartition

from lance_cdf.replicate.replica import ReplicaTable, offsets_of, source_version_of
from lance_cdf.streaming.checkpoint import checkpoint_version

if TYPE_CHECKING:
    from rich.table import Table


@dataclass
class Snapshot:
    elapsed: float
    source_version: int
    published_version: int | None
    replicated_version: int | None
    kafka_records: int
    replicated_records: int
    events_per_s: float
    last_commit: str

    @property
    def lag_records(self) -> int:
        return max(0, self.kafka_records - self.replicated_records)


class Probe:
    def __init__(self, source: str, checkpoint: str, replica: str, bootstrap: str, topic: str):
        self.source, self.checkpoint, self.topic = source, checkpoint, topic
        self.replica = ReplicaTable(replica, [])
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "lance-cdf-demo-probe"}
        )
        self.started = time.monotonic()
        self._rate: list[tuple[float, int]] = []

    def kafka_records(self) -> int:
        try:
            meta = self.consumer.list_topics(self.topic, timeout=2).topics.get(self.topic)
            parts = list(meta.partitions) if meta is not None and meta.partitions else []
            return sum(
                self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=2)[1]
                for p in parts
            )
        except KafkaException:
            return 0

    def snapshot(self, last_commit: str) -> Snapshot:
        now = time.monotonic()
        position = self.replica.position()  # read once: offsets and source version
        replicated = sum(offsets_of(position, self.topic).values())
        self._rate = [(t, n) for t, n in self._rate if now - t <= 10] + [(now, replicated)]
        (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
        return Snapshot(
            elapsed=now - self.started,
            source_version=lance.dataset(self.source).version,
            published_version=checkpoint_version(self.checkpoint),
            replicated_version=source_version_of(position),
            kafka_records=self.kafka_records(),
            replicated_records=replicated,
            events_per_s=(n1 - n0) / (t1 - t0) if t1 > t0 else 0.0,
            last_commit=last_commit,
        )

    def close(self) -> None:
        self.consumer.close()


def _v(version: int | None) -> str:
    return "-" if version is None else str(version)


def render(s: Snapshot, total: float, phase: str) -> Table:
    """A rich renderable of one snapshot."""
    from rich.table import Table

    table = Table(title=f"lance-cdf demo — {phase} ({s.elapsed:.0f}s / {total:.0f}s)",
                  show_header=True, header_style="bold")  # fmt: skip
    table.add_column("stage")
    table.add_column("version", justify="right")
    table.add_column("records", justify="right")
    table.add_column("lag", justify="right")
    table.add_row("source table (writer)", str(s.source_version), "", s.last_commit)
    table.add_row(
        "published to Kafka", _v(s.published_version), f"{s.kafka_records:,}",
        "" if s.published_version is None else f"{s.source_version - s.published_version} versions",
    )  # fmt: skip
    table.add_row(
        "replicated", _v(s.replicated_version), f"{s.replicated_records:,}",
        f"{s.lag_records:,} records",
    )  # fmt: skip
    table.caption = f"{s.events_per_s:,.0f} events/s applied (10 s window)"
    return table


def line(s: Snapshot, phase: str) -> str:
    """The same as one plain line, for logs and terminals without rich."""
    return (
        f"[{s.elapsed:5.0f}s] {phase}: source v{s.source_version}, published "
        f"v{_v(s.published_version)} ({s.kafka_records} records), replicated "
        f"v{_v(s.replicated_version)} ({s.replicated_records} records, lag {s.lag_records}), "
        f"{s.events_per_s:.0f} events/s; last commit: {s.last_commit}"
    )
