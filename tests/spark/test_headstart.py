"""`publish`'s head start (spark/publish/headstart.py): where it may start, and that what it
publishes is then skipped by the writers that publish the same versions again, so a
read_committed consumer finds each change once, in per-key order (read_changes is the
oracle). Real broker and registry; the writers are the sink's own code, run in-process."""

import os
import uuid

import lance
import numpy as np
import pyarrow as pa
from confluent_kafka.admin import AdminClient, NewTopic

from lance_cdf.spark.publish import headstart
from lance_cdf.spark.publish.headstart import head_start, start_offset
from lance_cdf.spark.sink.sink_options import SinkOptions
from tests.kafka.test_kafka_order import consume_by_key, expected_by_key

PARTITIONS = 3


def _checkpoint(root, offsets: dict[int, str], commits: list[int]) -> str:
    os.makedirs(root / "offsets")
    os.makedirs(root / "commits")
    for batch, offset in offsets.items():
        (root / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{offset}\n')
    for batch in commits:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return str(root)


def test_head_start_begins_only_where_the_query_will(tmp_path):
    fresh = str(tmp_path / "none")
    assert start_offset(fresh, "5", snapshot=False) == {"version": 4}
    assert start_offset(fresh, "latest", snapshot=False) is None  # known at query start only
    assert start_offset(fresh, "earliest", snapshot=False) is None
    assert start_offset(fresh, "5", snapshot=True) is None
    planned = _checkpoint(tmp_path / "planned", {0: '{"version":7}'}, [])
    assert start_offset(planned, "5", snapshot=False) == {"version": 4}  # batch 0 re-planned
    done = _checkpoint(tmp_path / "done", {0: '{"version":7}', 1: '{"version":9}'}, [0])
    assert start_offset(done, "latest", snapshot=False) == {"version": 7}
    snap = '{"version":3,"snapshot":{"fragment":1,"offset":10}}'
    midway = _checkpoint(tmp_path / "snap", {0: snap}, [0])
    assert start_offset(midway, "latest", snapshot=False) is None
    assert start_offset("s3://bucket/ck", "5", snapshot=False) is None


def _history(uri):
    """Versions 1-6: user keys move between row IDs (delete + re-insert, merge_insert)."""
    lance.write_dataset(
        pa.table({"id": np.arange(20), "s": ["a"] * 20}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=8,
    )
    ds = lance.dataset(uri)
    ds.update({"s": "'u2'"}, where="id < 5")
    ds.delete("id IN (3, 7, 11)")
    lance.write_dataset(pa.table({"id": [3, 7], "s": ["b4", "b4"]}), uri, mode="append")
    src = pa.table({"id": [1, 7, 30], "s": ["m5"] * 3})
    ds = lance.dataset(uri)
    ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)
    lance.dataset(uri).update({"s": "'u6'"}, where="id >= 15")


def test_writers_skip_what_the_head_start_published(
    tmp_path, kafka_broker, schema_registry, monkeypatch
):
    uri = str(tmp_path / "t.lance")
    _history(uri)
    topic = f"hs-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    source = {
        "path": uri,
        "startingVersion": "1",
        "keyHash": "id",
        "kafkaPartitions": str(PARTITIONS),
    }
    sink = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": kafka_broker.bootstrap_servers,
            "topic": topic,
            "schema.registry.url": schema_registry.url,
            "table": uri,
            "key": "id",
        }
    )

    # the first version (20 inserts) alone is over the limit: no head start at all
    monkeypatch.setattr(headstart, "HEAD_START_EVENTS", 19)
    assert head_start(source, sink, {"version": 0}) is None
    # whole versions up to the limit: 1 (20 events) and 2 (5 pre- and post-images)
    monkeypatch.setattr(headstart, "HEAD_START_EVENTS", 32)
    first = head_start(source, sink, {"version": 0})
    assert (first.first, first.last) == (1, 2)
    assert first.records == 25  # one record per insert and per update (no tombstones yet)
    # the writers then publish versions 1-6 from the same start: 1-2 are skipped
    monkeypatch.setattr(headstart, "HEAD_START_EVENTS", 10_000)
    rest = head_start(source, sink, {"version": 0})
    assert (rest.first, rest.last) == (1, 6)
    want = expected_by_key(uri)
    count = sum(len(v) for v in want.values())
    assert first.records + rest.records == count
    got, _ = consume_by_key(
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        count + 1,
        isolation="read_committed",
    )
    assert got == want  # every change once, per key in commit order


def test_a_database_head_start_publishes_each_table_once_with_its_transactions(
    tmp_path, kafka_broker, schema_registry, monkeypatch
):
    """The database head start (spark/publish/database_headstart.py): every table's waiting
    versions from the database reader's own plan, each table's share to its own topic with
    its BEGIN/END; a second head start from the same start (as the query after it) skips
    what the first published: every change once, per key in commit order, and one BEGIN and
    END per version."""
    from lance_cdf.spark.publish import database_headstart
    from lance_cdf.spark.publish.database_headstart import (
        database_head_start,
        database_start_offset,
    )
    from lance_cdf.spark.source.database_stream import DatabaseReader
    from tests.kafka.test_transactions import change_counts, check_transactions, transactions

    root = tmp_path / "db"
    names = ("orders", "users")
    for name in names:
        _history(str(root / f"{name}.lance"))
    prefix = f"dbhs{uuid.uuid4().hex[:6]}"
    source = {
        "database": str(root),
        "startingVersion": "1",
        "keyHash": "id",
        "kafkaPartitions": str(PARTITIONS),
    }
    sink = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": kafka_broker.bootstrap_servers,
            "schema.registry.url": schema_registry.url,
            "database": str(root),
            "topic.prefix": prefix,
            "topic.partitions": str(PARTITIONS),
            "key": "id",
            "checkpointLocation": str(tmp_path / "ck"),
        }
    )
    start = DatabaseReader({**source, "writerSlots": "1"}).initialOffset()
    assert set(start["tables"]) == set(names)

    # no time at all (its plan alone takes some): none
    monkeypatch.setattr(database_headstart, "HEAD_START_SECONDS", 0.0)
    assert database_head_start(source, sink, start) is None
    monkeypatch.setattr(database_headstart, "HEAD_START_SECONDS", 600.0)  # (not the subject)
    # each table's first version (20 inserts) alone, both tables' in one head start
    monkeypatch.setattr(database_headstart, "HEAD_START_EVENTS", 20)
    # a new checkpoint (startingVersion 1): the head start takes each table as the query will
    new = database_start_offset(str(tmp_path / "ck"), "1")
    assert new == {"from": "1"}
    first = database_head_start(source, sink, new)
    assert (first.records, first.tables, first.left) == (40, 2, 0)
    # all together over the bound: none
    monkeypatch.setattr(database_headstart, "HEAD_START_EVENTS", 10_000)
    monkeypatch.setattr(database_headstart, "HEAD_START_EVENTS_IN_ALL", 39)
    assert database_head_start(source, sink, start) is None
    # everything from the same start: what the first sent is skipped
    monkeypatch.setattr(database_headstart, "HEAD_START_EVENTS_IN_ALL", 100_000)
    rest = database_head_start(source, sink, start)
    assert rest.tables == 2
    for name in names:
        uri = str(root / f"{name}.lance")
        topic = f"{prefix}.{name}"
        want = expected_by_key(uri)
        count = sum(len(v) for v in want.values())
        got, _ = consume_by_key(
            kafka_broker.bootstrap_servers,
            topic,
            schema_registry.url,
            count + 1,
            isolation="read_committed",
        )
        assert got == want, name  # every change once, per key in commit order
        txns = transactions(
            kafka_broker.bootstrap_servers, f"{topic}.transaction", schema_registry.url
        )
        check_transactions(
            txns, change_counts(kafka_broker.bootstrap_servers, topic), f"{prefix}.{name}"
        )
    assert first.records + rest.records == sum(
        sum(len(v) for v in expected_by_key(str(root / f"{n}.lance")).values()) for n in names
    )
    # where a restarted query starts: the committed offset, none while a table snapshots
    # (a new one: where something waits, and it is known before the query starts)
    none = str(tmp_path / "none")
    assert database_start_offset(none, "earliest") == {"from": "earliest"}
    for starting in (None, "latest", "snapshot"):
        assert database_start_offset(none, starting) is None
    ck = _checkpoint(tmp_path / "ck2", {0: '{"tables":{"a":{"version":3}},"from":"1"}'}, [0])
    assert database_start_offset(ck, "1") == {"tables": {"a": {"version": 3}}, "from": "1"}
    snap = '{"tables":{"a":{"version":3,"snapshot":{"fragment":1,"offset":10}}},"from":"1"}'
    assert database_start_offset(_checkpoint(tmp_path / "ck3", {0: snap}, [0]), "1") is None
