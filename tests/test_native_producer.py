"""The publisher's compiled producer loop (lance_cdf/kafka/_produce.c) against a real broker:
it must send exactly the records confluent-kafka's Python `produce()` loop sends (keys,
values, tombstones, partitions, headers, in order, with exactly-once marks skipping some),
and refuse or fail a batch the same way."""

import uuid

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from test_avro_encode import NOW_MS, OPS, random_events

from lance_cdf.kafka import native
from lance_cdf.kafka import publisher as kafka
from lance_cdf.kafka.endpoints import PublishError
from lance_cdf.kafka.publisher import KafkaChangePublisher, record_positions, user_schema_of
from lance_cdf.keyhash import EVENT_ORDER, PARTITION_COLUMN

PARTITIONS = 4


def _topic(bootstrap):
    topic = f"native-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    return topic


def _consume(bootstrap, topic):
    """Every record of `topic`, per partition: [(key, value, headers)]."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False})  # fmt: skip
    out = {}
    try:
        for p in range(PARTITIONS):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            c.assign([TopicPartition(topic, p, low)])
            rows = []
            while len(rows) < high - low:
                m = c.poll(5)
                assert m is not None and not m.error(), m and m.error()
                rows.append((m.key(), m.value(), m.headers()))
            out[p] = rows
    finally:
        c.close()
    return out


def _publisher(monkeypatch, bootstrap, registry, topic, schema, compiled, **kwargs):
    monkeypatch.setenv(native.DISABLE_ENV, "1" if compiled else "0")
    pub = KafkaChangePublisher(bootstrap, topic, registry, schema, "tbl", ["i64"], **kwargs)
    assert (pub.native is not None) == compiled  # the extension must have been built
    return pub


def _routed(rng, n):
    events = random_events(rng, n)
    events = events.append_column(
        PARTITION_COLUMN, pa.array(rng.integers(0, PARTITIONS, n), pa.int32())
    )
    return events.append_column(EVENT_ORDER, pa.array(np.arange(n), pa.int64()))


def test_compiled_and_python_loops_send_the_same_records(
    monkeypatch, kafka_broker, schema_registry
):
    monkeypatch.setattr(kafka.time, "time", lambda: NOW_MS / 1000)
    bs, reg = kafka_broker.bootstrap_servers, schema_registry.url
    rng = np.random.default_rng(11)
    tombstones = skipped = 0
    for round_ in range(4):
        events = _routed(rng, int(rng.integers(40, 400)))
        if round_ == 3:  # a slice: Arrow buffers that start at an offset
            events = events.slice(7, events.num_rows - 20)
        schema = user_schema_of(events.schema)
        positions = record_positions(events)
        parts = events.filter(kafka._record_rows(events))[PARTITION_COLUMN].to_numpy()
        # exactly-once marks (rounds 2, 3): per partition, a random record of it (or its
        # tombstone) is the last one the partition holds, so it and those before are skipped
        marks = None
        if round_ >= 2:
            marks = {}
            for p in range(PARTITIONS):
                mine = np.flatnonzero(parts == p)
                i = mine[rng.integers(len(mine))] if len(mine) else None
                marks[p] = None if i is None else (*positions[i].tolist(), int(rng.integers(2)))
        topic = _topic(bs)
        sent = []
        for compiled in (False, True):  # each partition: Python's records, then compiled's
            pub = _publisher(monkeypatch, bs, reg, topic, schema, compiled)
            pub.begin()
            sent.append(pub.send(events, OPS, marks))
            pub.flush()
            pub.close()
        assert sent[0] == sent[1] > 0
        skipped += 2 * len(parts) - sent[0]  # records + tombstones at most
        got = _consume(bs, topic)
        assert sum(map(len, got.values())) == 2 * sent[0]
        for p, rows in got.items():
            half = len(rows) // 2
            assert rows[half:] == rows[:half], f"round {round_}, partition {p}"
            for _, value, headers in rows[:half]:
                h = dict(headers)
                assert set(h) == {kafka.VERSION_HEADER, kafka.OP_HEADER, kafka.POSITION_HEADER}
                assert (value is None) == (h[kafka.OP_HEADER] == b"tombstone")
                tombstones += value is None
    assert tombstones and skipped


@pytest.mark.parametrize("compiled", [False, True])
def test_refused_and_failed_records_fail_the_batch(
    monkeypatch, kafka_broker, schema_registry, compiled
):
    bs, reg = kafka_broker.bootstrap_servers, schema_registry.url
    rng = np.random.default_rng(3)
    events = _routed(rng, 30)
    schema = user_schema_of(events.schema)
    topic = _topic(bs)
    # a record larger than the producer's limit is refused when it is produced
    pub = _publisher(monkeypatch, bs, reg, topic, schema, compiled,
                     producer_config={"message.max.bytes": 1000})  # fmt: skip
    big = events.set_column(
        events.schema.get_field_index("s"), "s", pa.array(["x" * 5000] * events.num_rows)
    )
    with pytest.raises(PublishError, match="too large"):
        pub.send(big, OPS)
    pub.close()
    # a partition the topic does not have fails in delivery (or at once, metadata known)
    pub = _publisher(monkeypatch, bs, reg, topic, schema, compiled)
    wrong = events.set_column(
        events.schema.get_field_index(PARTITION_COLUMN), PARTITION_COLUMN,
        pa.array([PARTITIONS + 3] * events.num_rows, pa.int32()),
    )  # fmt: skip
    with pytest.raises(PublishError, match="[Uu]nknown partition"):
        pub.send(wrong, OPS)
        pub.flush()
    pub.close()
