"""Where each partition of a topic ends: the position of its last record, the high-water
mark an exactly-once publisher (`KafkaChangePublisher`) skips a replayed micro-batch's records
up to. Read from the broker, and remembered between micro-batches while the partition's
watermarks say nothing was appended since."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException

from lance_cdf.errors import PublishError, in_words
from lance_cdf.kafka import clients

if TYPE_CHECKING:
    from confluent_kafka import Consumer  # imported where used: only routed streams need one

    from lance_cdf.ops.clientconfig import KafkaConnection

log = logging.getLogger("lance_cdf.kafka")

# Where a record stands in its partition's sequence (routed streams only): commit version,
# group (0 deletes, 1 updates, 2 inserts and snapshot reads), `_event_order`, and 0 for a
# record, 1 for the tombstone after it, as ASCII "v.g.o.s". A partition's last record is its
# high-water mark: a replayed micro-batch skips every record at or below it.
POSITION_HEADER = "lance-cdf.position"
# (version, group, order, sub) of a record (sub 0) or its tombstone (sub 1)
Position = tuple[int, int, int, int]


def parse_position(value: str | bytes | None) -> Position | None:
    if not isinstance(value, bytes):
        return None
    try:
        v, g, o, t = (int(x) for x in value.decode().split("."))
        return v, g, o, t
    except (AttributeError, ValueError):
        return None


class PartitionMarks:
    """The high-water marks of one topic's partitions, as one publisher knows them.
    `timeout`: how long one read of the broker may take."""

    def __init__(self, topic: str, connection: KafkaConnection, timeout: float):
        self.topic = topic
        self.connection = connection
        self.timeout = timeout
        # per partition ((low, high) watermarks, the position of its last record) as known
        # after the publisher's last successful flush (or last look)
        self.settled: dict[int, tuple[tuple[int, int], Position | None]] = {}

    def read(self, partitions: Collection[int]) -> dict[int, Position | None]:
        """The position of the last record of each partition (None: none with a position).
        With one writer task per partition at a time, a partition holds a prefix of its
        records in order (the idempotent producer neither reorders nor leaves holes), so
        its last record says exactly how far an earlier attempt got.

        A partition whose watermarks are what they were after the publisher's last
        successful flush (or last look) still ends with the record it knew: nothing was
        appended since, so its position is reused without reading the record again."""
        marks: dict[int, Position | None] = {}
        every = self.watermarks(partitions)
        last: dict[int, int] = {}  # partition -> the offset of its last record, to read
        for p in sorted(partitions):
            known = self.settled.get(p)
            marks[p] = known[1] if known is not None and known[0] == every[p] else None
            low, high = every[p]
            if (known is None or known[0] != every[p]) and high > low:
                last[p] = high - 1
        if last:
            marks.update(self._last_records(last))
        for p in partitions:
            self.settled[p] = (every[p], marks[p])
        return marks

    def _last_records(self, last: dict[int, int]) -> dict[int, Position | None]:
        """The positions of the records at `last` (partition -> offset), every partition's
        in one assignment."""
        from confluent_kafka import TopicPartition

        marks: dict[int, Position | None] = {}
        consumer = self.consumer()
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in last.items()])
        waiting = set(last)
        deadline = time.monotonic() + self.timeout
        while waiting and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            part = m.partition() if m is not None else None
            if m is None or m.error() or part is None or part not in waiting:
                continue
            if m.topic() != self.topic:  # (a shared consumer: another table's, earlier)
                continue
            marks[part] = parse_position(dict(m.headers() or []).get(POSITION_HEADER))
            waiting.discard(part)
        consumer.unassign()  # (also when the read fails: the consumer is shared)
        if waiting:
            raise PublishError(
                f"could not read the last record of {self.topic!r} partition(s) "
                f"{sorted(waiting)} within {self.timeout:.0f}s; the micro-batch "
                "fails and is retried."
            )
        return marks

    def settle(self, sent_last: dict[int, Position]) -> None:
        """After a successful flush: each partition written (`sent_last`: partition -> the
        position of the last record sent to it) ends with that position."""
        try:
            every = self.watermarks(sent_last)
        except Exception as exc:  # noqa: BLE001 (only an optimisation: read them next time)
            log.debug("partition watermarks not read (%s); read next time", in_words(exc))
            every = {}
        for p, position in sent_last.items():
            if p in every:
                self.settled[p] = (every[p], position)
            else:
                self.settled.pop(p, None)

    def forget(self) -> None:
        """What the partitions hold is unknown (a failed flush, a close): read them again."""
        self.settled.clear()

    def consumer(self) -> Consumer:
        """The consumer reading partitions' last records (the process's, shared by the
        publishers with the same settings: it is only ever assigned, read and unassigned)."""
        # fetch.wait.max.ms: a fetch after a new assignment otherwise waits out the
        # default 500 ms long poll, and reading a partition's last record with it
        # (docs/benchmarks.md, "Inside the publisher")
        return clients.consumer(
            self.connection.consumer(
                fixed={
                    "group.id": "lance-cdf-high-water-marks",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 10,
                }
            )
        )

    def watermarks(self, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        """(low, high) watermarks of each partition, in two requests for all of them
        (ListOffsets for "earliest" (-2) and "latest" (-1), what `get_watermark_offsets`
        asks one partition at a time)."""
        from confluent_kafka import TopicPartition

        wanted = sorted(partitions)
        if not wanted:
            return {}
        out: dict[int, list[int]] = {p: [0, 0] for p in wanted}
        consumer = self.consumer()
        for i, when in enumerate((-2, -1)):  # earliest, latest
            try:
                answer = consumer.offsets_for_times(
                    [TopicPartition(self.topic, p, when) for p in wanted],
                    timeout=self.timeout,
                )
            except KafkaException:
                # the retry (outage.RideOut) must not ask with the metadata the failure left:
                # the shared consumer is never subscribed, so librdkafka does not refresh the
                # topic by itself, and after a long broker freeze it kept answering "Unknown
                # partition" for minutes (CI, test_publish_failures). Asked afresh here.
                with contextlib.suppress(KafkaException):
                    consumer.list_topics(self.topic, timeout=min(5.0, self.timeout))
                raise
            for tp in answer:
                if tp.error is not None or tp.offset < 0:
                    raise PublishError(
                        f"could not read the offsets of {self.topic!r} partition {tp.partition}"
                        f": {tp.error or tp.offset}; the micro-batch fails and is retried."
                    )
                out[tp.partition][i] = tp.offset
        return {p: (low, high) for p, (low, high) in out.items()}
