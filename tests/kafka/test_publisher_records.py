"""The records `KafkaChangePublisher.send` queues (no broker): keys, values, partitions and
headers in record order, tombstones after their deletes, records at or below their
partition's mark skipped, and a full local queue neither losing nor reordering a record;
checked against a plain per-record reading of the same events."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lance_cdf.core.stream_columns import EVENT_ORDER, PARTITION_COLUMN
from lance_cdf.kafka.marks import POSITION_HEADER
from lance_cdf.kafka.publisher import (
    OP_HEADER,
    VERSION_HEADER,
    KafkaChangePublisher,
    user_schema_of,
)
from tests.avro.test_avro_encode import OPS, _FakeProducer, random_events

GROUP = {"delete": 0, "update_postimage": 1}
OP = {"insert": b"c", "update_postimage": b"u", "delete": b"d", "snapshot": b"r"}


class _FullQueue(_FakeProducer):
    """Refuses every `every`-th record once (BufferError), as a full local queue does."""

    def __init__(self, every):
        super().__init__()
        self.every, self.calls, self.polls = every, 0, 0

    def produce(self, topic, value=None, key=None, partition=-1, *args, headers=None, **kw):
        self.calls += 1
        if self.calls % self.every == 0:
            raise BufferError("queue full")
        headers = args[3] if len(args) > 3 else headers
        super().produce(topic, value, key, partition, headers=headers)

    def poll(self, timeout):
        self.polls += 1


def publisher(events, producer):
    """A publisher with `producer`, its schemas' ids set (no registry, no broker)."""
    pub = KafkaChangePublisher(
        "127.0.0.1:1", "topic", "http://127.0.0.1:1", user_schema_of(events.schema), "tbl"
    )
    pub.key_writer.header = b"\x00\x00\x00\x00\x07"
    pub.value_writer.header = b"\x00\x00\x00\x01\x02"
    pub.producer = producer
    pub.topic_ready = True
    return pub


def routed(rng, n):
    events = random_events(rng, n)
    events = events.append_column(EVENT_ORDER, pa.array(np.arange(n) * 2, pa.int64()))
    return events.append_column(PARTITION_COLUMN, pa.array(rng.integers(0, 3, n), pa.int32()))


def expected(events, marks):
    """(partition, headers, tombstone?) of each record sent, one event at a time."""
    out = []
    for row in events.to_pylist():
        kind = row["_change_type"]
        if kind == "update_preimage":
            continue
        v, part = row["_commit_version"], row[PARTITION_COLUMN]
        position = (v, GROUP.get(kind, 2), row[EVENT_ORDER])
        mark = marks.get(part) or (-1, -1, -1, -1)
        for sub in (0, 1) if kind == "delete" else (0,):
            if (*position, sub) > mark:
                op = b"tombstone" if sub else OP[kind]
                pos = ".".join(map(str, (*position, sub))).encode()
                head = {VERSION_HEADER: str(v).encode(), OP_HEADER: op, POSITION_HEADER: pos}
                out.append((part, list(head.items()), bool(sub)))
    return out


@pytest.mark.parametrize("every", [0, 7])
@pytest.mark.parametrize("seed", range(3))
def test_records_in_order_with_marks(seed, every):
    rng = np.random.default_rng(seed)
    events = routed(rng, 200)
    pub = publisher(events, _FullQueue(every) if every else _FakeProducer())
    # partition 0 holds up to the middle of version 2, partition 1 nothing, 2 everything
    marks = {0: (2, 1, 0, 0), 1: None, 2: (99, 0, 0, 0)}
    sent = pub.send(events, OPS, marks)
    want = expected(events, marks)
    got = pub.producer.sent
    assert sent == len(got) == len(want)
    assert [(p, list(h.items()), v is None) for _, v, p, h in got] == want
    if every:
        assert pub.producer.calls > len(got)  # some were refused, then queued again


def test_every_record_without_marks_or_positions():
    rng = np.random.default_rng(9)
    events = random_events(rng, 120)  # not routed: no partition, no position
    pub = publisher(events, _FakeProducer())
    pub.send(events, OPS)
    rows = [r for r in events.to_pylist() if r["_change_type"] != "update_preimage"]
    want = []
    for r in rows:
        version = (VERSION_HEADER, str(r["_commit_version"]).encode())
        want.append((-1, [version, (OP_HEADER, OP[r["_change_type"]])]))
        if r["_change_type"] == "delete":
            want.append((-1, [version, (OP_HEADER, b"tombstone")]))
    assert [(p, list(h.items())) for _, _, p, h in pub.producer.sent] == want
