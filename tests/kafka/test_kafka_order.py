"""Parallel writers keep per-key order: records routed to Kafka partitions by key hash,
≥ 2 writer tasks on local[2], one user key under several `_rowid`s in one micro-batch
(overwrite; delete and re-insert; an update that changes the key)."""

import uuid
from collections import Counter, defaultdict

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

import lance_cdf
import lance_cdf.spark
from lance_cdf.kafka.publisher import commit_order
from lance_cdf.spark.publish.runner import route
from lance_cdf.spark.sink.work import SlotWork
from lance_cdf.spark.source.handoff import WorkItem

PARTITIONS = 4


def make_table(uri, seed):
    """Versions where user keys move between row IDs; returns the table's URI."""
    rng = np.random.default_rng(seed)
    n = 60
    lance.write_dataset(
        pa.table({"id": np.arange(n), "s": [f"a{i}" for i in range(n)]}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=17,
    )
    ids = rng.choice(n, 12, replace=False).tolist()
    lance.dataset(uri).update({"s": "'u1'"}, where=f"id IN {tuple(ids[:6])}")
    lance.dataset(uri).delete(f"id IN {tuple(ids[6:])}")  # deleted here ...
    lance.write_dataset(  # ... and re-inserted under new row IDs
        pa.table({"id": ids[6:], "s": ["back"] * 6}), uri, mode="append"
    )
    lance.dataset(uri).update({"id": "id + 1000"}, where=f"id = {ids[0]}")  # the key changes
    # overwrite: every key gets a new row ID (delete + insert of each id in one version)
    kept = rng.choice(n, 40, replace=False)
    lance.write_dataset(
        pa.table({"id": kept, "s": [f"o{i}" for i in kept]}),
        uri,
        mode="overwrite",
        max_rows_per_file=13,
    )
    lance.dataset(uri).update({"s": "'u2'"}, where="id % 3 = 0")
    return uri


def expected_by_key(uri):
    """Per user key: the records it should get, in order (read_changes is the oracle)."""
    out = defaultdict(list)
    for e in lance_cdf.read_changes(uri, 1).read_all().to_pylist():
        kind = e["_change_type"]
        if kind == "update_preimage":
            continue
        op = {"insert": "c", "update_postimage": "u", "delete": "d"}[kind]
        after = None if op == "d" else {"id": e["id"], "s": e["s"]}
        out[e["id"]].append((op, e["_commit_version"], after))
        if op == "d":
            out[e["id"]].append((None, None, None))
    return dict(out)


def consume_by_key(
    bootstrap,
    topic,
    registry_url,
    count,
    isolation="read_uncommitted",
    config=None,
    registry_config=None,
):
    """Per key: its records in partition order; stops after `count` records or 60 s idle.
    `config` / `registry_config`: client settings (a secured broker and registry).

    A caller proving that no record is extra asks for one more than it expects: at
    `count - 1` records the read goes on until every partition is read to its end (the
    topic holds nothing more), or 10 s idle; a record beyond its end would be counted."""
    client = SchemaRegistryClient({"url": registry_url, **(registry_config or {})})
    key_de, value_de = AvroDeserializer(client), AvroDeserializer(client)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            **(config or {}),
        }
    )
    partitions = len(c.list_topics(topic, timeout=30).topics[topic].partitions)
    c.subscribe([topic])
    out, partition_of, seen, idle = defaultdict(list), {}, 0, 0
    at_end: set[int] = set()  # partitions read to their end (since their last record)
    try:
        while seen < count and idle < (120 if seen < count - 1 else 20):
            m = c.poll(0.5)
            if m is not None and m.error() and m.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(m.partition())
                if seen == count - 1 and len(at_end) == partitions:
                    break  # the whole topic is read: the one more asked for is not there
                continue
            if m is None or m.error():
                idle += 1
                continue
            at_end.discard(m.partition())
            seen += 1
            key = key_de(m.key(), SerializationContext(topic, MessageField.KEY))["id"]
            assert partition_of.setdefault(key, m.partition()) == m.partition()
            if m.value() is None:
                out[key].append((None, None, None))
                continue
            v = value_de(m.value(), SerializationContext(topic, MessageField.VALUE))
            out[key].append((v["op"], v["source"]["commit_version"], v["after"]))
    finally:
        c.close()
    return dict(out), partition_of


def new_topic(bootstrap):
    topic = f"order-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    return topic


MECHANISMS = ["handoff", "route"]


def publish_routed(
    spark, uri, tasks, checkpoint, kafka_broker, schema_registry, mechanism, **source
):
    """The table's changes from version 1, keyed by `id`, to a new PARTITIONS-partition topic
    by `tasks` writer tasks (until caught up); returns the topic. `mechanism`: "handoff"
    (option writerSlots: each task reads its own share, as `lance-cdf publish` does) or
    "route" (publish.route: a repartition of the events by partition)."""
    topic = new_topic(kafka_broker.bootstrap_servers)
    lance_cdf.spark.register(spark)
    reader = spark.readStream.format("lance-cdf").option("path", uri)
    for k, v in {"startingVersion": 1, "keyHash": "id", **source}.items():
        reader = reader.option(k, v)
    if mechanism == "handoff":
        changes = reader.option("writerSlots", tasks).option("kafkaPartitions", PARTITIONS).load()
    else:
        changes = route(reader.load(), PARTITIONS, tasks)
    q = (
        changes.writeStream.format("lance-cdf-kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("topic", topic)
        .option("schema.registry.url", schema_registry.url)
        .option("table", uri)
        .option("key", "id")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None
    return topic


def check_shares(uri, shares):
    """Each writer task's share (its rows as the sink gets them): put in commit order by the
    task, the shares own disjoint Kafka partitions, cover them all and every event once, in
    commit order with each preimage before its postimage."""
    tasks = [commit_order(pa.Table.from_pylist(rows)).to_pylist() for rows in shares]
    owned = [{r["_kafka_partition"] for r in rows} for rows in tasks]
    assert not owned[0] & owned[1] and owned[0] | owned[1] == set(range(PARTITIONS))
    events = lance_cdf.read_changes(uri, 1).read_all().to_pylist()
    rank = {"delete": 0, "update_preimage": 1, "update_postimage": 1, "insert": 2}
    for rows in tasks:
        order = [(r["_commit_version"], rank[r["_change_type"]]) for r in rows]
        assert order == sorted(order)
        for i, r in enumerate(rows):  # a preimage is followed by its postimage
            assert i == 0 or (r["_commit_version"], r["_event_order"]) != (
                rows[i - 1]["_commit_version"],
                rows[i - 1]["_event_order"],
            )
            if r["_change_type"] == "update_preimage":
                assert rows[i + 1]["_change_type"] == "update_postimage"
                assert rows[i + 1]["_rowid"] == r["_rowid"]
    assert sum(len(rows) for rows in tasks) == len(events)
    cols = ("_rowid", "_change_type", "_commit_version", "id", "s")
    got = sorted(tuple(r[c] for c in cols) for rows in tasks for r in rows)
    assert got == sorted(tuple(e[c] for c in cols) for e in events)  # the same events


def test_route_gives_each_task_disjoint_partitions_in_commit_order(spark, tmp_path):
    uri = make_table(str(tmp_path / "t.lance"), 1)
    changes = (
        spark.read.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 1)
        .option("rowsPerPartition", 7)
        .option("keyHash", "id")
        .load()
    )
    assert changes.rdd.getNumPartitions() > 4  # big versions are cut into slices
    routed = route(changes, PARTITIONS, 2)
    shares = routed.rdd.glom().map(lambda rows: [r.asDict() for r in rows]).collect()
    assert len(shares) == 2
    check_shares(uri, shares)


def test_handoff_gives_each_slot_disjoint_partitions_in_commit_order(spark, tmp_path):
    """Option writerSlots: a micro-batch is one work item per slot; what each item reads is
    what a routed writer task gets, whatever the slices the versions are cut in."""
    uri = make_table(str(tmp_path / "t.lance"), 3)
    q = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 1)
        .option("rowsPerPartition", 7)
        .option("keyHash", "id")
        .option("writerSlots", 2)
        .option("kafkaPartitions", PARTITIONS)
        .load()
        .writeStream.format("memory")
        .queryName("work_items")
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None
    items = spark.sql("SELECT * FROM work_items").collect()
    assert sorted(r["_writer_slot"] for r in items) == [0, 1]  # one micro-batch, two slots
    works = [
        SlotWork(
            WorkItem.of(r["_writer_slot"], r["_events"], r["_work"], bytes(r["_read_schema"])),
            uri,
            {},
        )
        for r in items
    ]
    assert len(works[0].parts) > 4  # the versions' slices
    shares = [pa.Table.from_batches(list(w.events())).to_pylist() for w in works]
    check_shares(uri, shares)
    # each record's `_total_order`: its 1-based place among its version's records in the
    # order read_changes yields them (an update pair: one record, at its postimage)
    expected, seen = {}, Counter()
    for e in lance_cdf.read_changes(uri, 1).read_all().to_pylist():
        if e["_change_type"] != "update_preimage":
            seen[e["_commit_version"]] += 1
            expected[(e["_commit_version"], e["_rowid"], e["_change_type"])] = seen[
                e["_commit_version"]
            ]
    got = {
        (r["_commit_version"], r["_rowid"], r["_change_type"]): r["_total_order"]
        for rows in shares
        for r in rows
        if r["_change_type"] != "update_preimage"
    }
    assert got == expected


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_parallel_writers_keep_per_key_order(
    spark, tmp_path, kafka_broker, schema_registry, mechanism
):
    uri = make_table(str(tmp_path / "t.lance"), 2)
    topic = publish_routed(
        spark, uri, 2, tmp_path / "ck", kafka_broker, schema_registry, mechanism, rowsPerPartition=7
    )
    want = expected_by_key(uri)
    count = sum(len(v) for v in want.values())
    got, partition_of = consume_by_key(
        kafka_broker.bootstrap_servers, topic, schema_registry.url, count
    )
    assert got == want  # every key's records, each once, in commit order
    assert set(partition_of.values()) == set(range(PARTITIONS))  # all partitions used


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_writer_task_with_an_empty_share(
    spark, tmp_path, kafka_broker, schema_registry, mechanism
):
    """Small commits leave some writer tasks nothing to write: the micro-batch still
    succeeds (an empty share once failed the task, so the query retried it for ever)."""
    uri = str(tmp_path / "one.lance")
    lance.write_dataset(pa.table({"id": [7], "s": ["x"]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).update({"s": "'y'"}, where="id = 7")
    topic = publish_routed(spark, uri, 3, tmp_path / "ck", kafka_broker, schema_registry, mechanism)
    got, _ = consume_by_key(kafka_broker.bootstrap_servers, topic, schema_registry.url, 2)
    assert got == expected_by_key(uri)  # one key, one partition: two tasks had nothing


def test_handoff_numbers_a_snapshot_over_its_micro_batches(spark, tmp_path):
    """A snapshot read spans micro-batches (maxRowsPerTrigger): its records' `_total_order`
    counts over the whole version (1..N once each), not from 1 in each micro-batch."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(50), "s": ["a"] * 50}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=17,
    )
    lance.dataset(uri).delete("id % 7 = 0")  # live rows, not physical ones, count
    q = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", "snapshot")
        .option("maxRowsPerTrigger", 10)
        .option("rowsPerPartition", 4)
        .option("keyHash", "id")
        .option("writerSlots", 2)
        .option("kafkaPartitions", PARTITIONS)
        .load()
        .writeStream.format("memory")
        .queryName("snapshot_items")
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None
    items = spark.sql("SELECT * FROM snapshot_items").collect()
    assert len(items) > 4  # several micro-batches of two slots
    rows = [
        r
        for item in items
        for batch in SlotWork(
            WorkItem.of(
                item["_writer_slot"], item["_events"], item["_work"], bytes(item["_read_schema"])
            ),
            uri,
            {},
        ).events()
        for r in batch.to_pylist()
    ]
    live = lance.dataset(uri).count_rows()
    assert len(rows) == live
    assert sorted(r["_total_order"] for r in rows) == list(range(1, live + 1))
