"""The lance-cdf stream published to a real Kafka broker and schema registry."""

import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

import lance_cdf
import lance_cdf.spark
from lance_cdf.kafka.endpoints import PublishError, check_broker, check_registry
from lance_cdf.spark.sink import kafka_sink as spark_sink
from tests.support.publish_process import publish_args, start_cli

pytestmark = pytest.mark.integration  # a broker of its own, `lance-cdf publish` in a subprocess

DIM = 768


def make(tmp_path):
    uri = str(tmp_path / "t.lance")
    n = 12
    vec = pa.FixedSizeListArray.from_arrays(
        pa.array(np.random.default_rng(0).random(n * DIM, dtype=np.float32)), DIM
    )
    table = pa.table({"id": np.arange(n), "s": [f"s{i}" for i in range(n)], "vec": vec})
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=5)
    ds = lance.dataset(uri)
    ds.update({"s": "'u'"}, where="id < 3")
    lance.dataset(uri).delete("id IN (5, 6)")
    src = pa.table(
        {
            "id": [1, 40],
            "s": ["m", "new"],
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(np.ones(2 * DIM, dtype=np.float32)), DIM
            ),
        }
    )
    lance.dataset(uri).merge_insert(
        "id"
    ).when_matched_update_all().when_not_matched_insert_all().execute(src)
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=100)
    return uri


def consume_all(
    bootstrap, topic, registry_url, expected_count, with_headers=False, with_partitions=False
):
    client = SchemaRegistryClient({"url": registry_url})
    key_de, value_de = AvroDeserializer(client), AvroDeserializer(client)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    out = []
    idle = 0
    try:
        while idle < 120:  # a minute without news
            m = c.poll(0.5)
            if m is None or m.error():
                if len(out) >= expected_count:
                    break
                idle += 1
                continue
            key = key_de(m.key(), SerializationContext(topic, MessageField.KEY))
            value = (
                None
                if m.value() is None
                else value_de(m.value(), SerializationContext(topic, MessageField.VALUE))
            )
            if with_headers:
                out.append((key, value, dict(m.headers() or [])))
            elif with_partitions:
                out.append((key, value, m.partition()))
            else:
                out.append((key, value))
    finally:
        c.close()
    return out


def expected_records(uri):
    events = lance_cdf.read_changes(uri, 1).read_all().to_pylist()
    out, pre = [], None
    for e in events:
        image = {"id": e["id"], "s": e["s"], "vec": e["vec"]}
        kind = e["_change_type"]
        if kind == "update_preimage":
            pre = image
            continue
        op = {"insert": "c", "update_postimage": "u", "delete": "d"}[kind]
        before = pre if op == "u" else (image if op == "d" else None)
        after = None if op == "d" else image
        out.append(({"_rowid": e["_rowid"]}, op, before, after, e["_commit_version"]))
        if op == "d":
            out.append(({"_rowid": e["_rowid"]}, None, None, None, None))  # tombstone
    return out


def test_stream_to_kafka_equals_read_changes(spark, tmp_path, kafka_broker, schema_registry):
    uri = make(tmp_path)
    topic = f"cdf-{uuid.uuid4().hex[:8]}"
    lance_cdf.spark.register(spark)
    changes = spark.readStream.format("lance-cdf").option("path", uri)
    writer = (
        changes.option("startingVersion", 1)
        .load()
        .coalesce(1)
        .writeStream.format("lance-cdf-kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("topic", topic)
        .option("schema.registry.url", schema_registry.url)
        .option("table", uri)
        .option("checkpointLocation", str(tmp_path / "ck"))
    )
    q = writer.trigger(availableNow=True).start()
    q.awaitTermination(180)
    assert q.exception() is None
    want = expected_records(uri)
    got = consume_all(
        kafka_broker.bootstrap_servers, topic, schema_registry.url, len(want), with_headers=True
    )
    # the headers repeat the record's commit version and op (a tombstone: its delete's)
    previous = None
    for _, v, headers in got:
        if v is None:
            want_headers = {"lance-cdf.commit-version": previous, "lance-cdf.op": b"tombstone"}
        else:
            previous = str(v["source"]["commit_version"]).encode()
            want_headers = {"lance-cdf.commit-version": previous, "lance-cdf.op": v["op"].encode()}
        assert headers == want_headers
    got = [(k, v) for k, v, _ in got]
    flat = [
        (k, v["op"], v["before"], v["after"], v["source"]["commit_version"])
        if v
        else (k, None, None, None, None)
        for k, v in got
    ]
    key = lambda r: (r[4] or 0, r[0]["_rowid"], r[1] or "~")  # noqa: E731
    # a tombstone directly follows its delete on the same key (one partition: total order)
    for i, (k, op, *_rest) in enumerate(flat):
        if op == "d":
            assert flat[i + 1] == (k, None, None, None, None)
    assert sorted([r for r in flat if r[1]], key=key) == sorted([r for r in want if r[1]], key=key)
    assert sum(1 for r in flat if r[1] is None) == sum(1 for r in want if r[1] is None)
    values = [v for _, v in got if v]
    # source.operation names the Lance operation of each commit (pylance's own transaction log)
    for v in values:
        version = v["source"]["commit_version"]
        op = type(lance.dataset(uri).read_transaction(version).operation).__name__
        assert v["source"]["operation"] == op
    # Debezium's common source fields: the table named after its directory, db its URI
    table = uri.rstrip("/").rsplit("/", 1)[-1].removesuffix(".lance")
    assert all(
        v["source"]["connector"] == "lance-cdf"
        and v["source"]["db"] == uri
        and v["source"]["name"] == "lancecdf"
        and v["source"]["table"] == table
        and v["source"]["snapshot"] == "false"
        and v["source"]["ts_ms"] == round(v["source"]["commit_timestamp"].timestamp() * 1000)
        for v in values
    )


def test_unreachable_broker_and_registry_fail_fast_naming_the_address():
    with pytest.raises(PublishError, match="127.0.0.1:9"):
        check_broker("127.0.0.1:9", timeout=3)
    with pytest.raises(PublishError, match="http://127.0.0.1:9/apis"):
        check_registry("http://127.0.0.1:9/apis/ccompat/v7")


def test_cli_publish_available_now(tmp_path, kafka_broker, schema_registry):
    from lance_cdf.cli import main

    uri = str(tmp_path / "c.lance")
    lance.write_dataset(pa.table({"id": [1, 2, 3]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).delete("id = 2")
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    args = publish_args(
        uri,
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        tmp_path / "ck",
        "--starting-version",
        "1",
        "--available-now",
        "--key",
        "id",
        "--producer-config",
        "client.id=cli-test",
    )
    assert main(args) == 0
    got = consume_all(kafka_broker.bootstrap_servers, topic, schema_registry.url, 5)
    assert [(k["id"], v and v["op"]) for k, v in got] == [
        (1, "c"),
        (2, "c"),
        (3, "c"),
        (2, "d"),
        (2, None),
    ]
    # headers, read with a plain consumer and no Avro decoding
    assert raw_headers(kafka_broker.bootstrap_servers, topic, 5) == [
        {"lance-cdf.commit-version": b"1", "lance-cdf.op": b"c"},
        {"lance-cdf.commit-version": b"1", "lance-cdf.op": b"c"},
        {"lance-cdf.commit-version": b"1", "lance-cdf.op": b"c"},
        {"lance-cdf.commit-version": b"2", "lance-cdf.op": b"d"},
        {"lance-cdf.commit-version": b"2", "lance-cdf.op": b"tombstone"},
    ]


def raw_headers(bootstrap, topic, count):
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    out, idle = [], 0
    try:
        while len(out) < count and idle < 60:
            m = c.poll(0.5)
            if m is None or m.error():
                idle += 1
                continue
            headers = dict(m.headers() or [])
            out.append({k: headers[k] for k in ("lance-cdf.commit-version", "lance-cdf.op")})
    finally:
        c.close()
    return out


def test_broker_restart_while_publishing_loses_nothing(
    spark, tmp_path, kafka_broker, schema_registry
):
    import time

    uri = str(tmp_path / "r.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(5), "n": np.zeros(5)}), uri, enable_stable_row_ids=True
    )
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    lance_cdf.spark.register(spark)
    q = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 1)
        .load()
        .coalesce(1)  # one writer per micro-batch: versions are produced in order
        .writeStream.format("lance-cdf-kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("topic", topic)
        .option("schema.registry.url", schema_registry.url)
        .option("table", uri)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        for round_ in range(6):
            lance.dataset(uri).update({"n": f"{round_ + 1}"}, where="id < 3")
            if round_ == 2:
                kafka_broker.restart()  # same ports and data; the producer reconnects
            time.sleep(0.5)
        deadline = time.monotonic() + 120
        latest = lance.dataset(uri).version
        while time.monotonic() < deadline and not _reached(q, latest):
            time.sleep(0.3)
    finally:
        q.stop()
    want = expected_records_simple(uri)
    got = consume_all(kafka_broker.bootstrap_servers, topic, schema_registry.url, len(want))
    seen = [
        (k["_rowid"], v["source"]["commit_version"], v["op"], _frozen(v["after"]))
        for k, v in got
        if v
    ]
    assert set(seen) >= set(want)  # every change arrived at least once
    for rowid in {r[0] for r in seen}:
        versions = [v for r, v, _, _ in seen if r == rowid]
        assert versions == sorted(versions)  # per-key order kept (duplicates adjacent at most)


def expected_records_simple(uri):
    out = []
    for e in lance_cdf.read_changes(uri, 1).read_all().to_pylist():
        if e["_change_type"] == "update_preimage":
            continue
        op = {"insert": "c", "update_postimage": "u", "delete": "d"}[e["_change_type"]]
        after = None if op == "d" else _frozen({"id": e["id"], "n": e["n"]})
        out.append((e["_rowid"], e["_commit_version"], op, after))
    return out


def _reached(query, version):
    import json

    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return False
    end = progress["sources"][0]["endOffset"]
    return end is not None and json.loads(end)["version"] >= version


def _frozen(image):
    return None if image is None else tuple(sorted(image.items()))


def publish_until_caught_up(
    table: str,
    bootstrap_servers: str,
    topic: str,
    registry: str,
    checkpoint: str,
    starting_version: str | None = None,
) -> int:
    """`publish` (the code path of `lance-cdf publish`) of one table with --available-now."""
    from lance_cdf.spark.publish.runner import publish
    from lance_cdf.spark.publish.settings import (
        KafkaTarget,
        PublishSettings,
        RunSettings,
        SourceSettings,
    )

    return publish(
        PublishSettings(
            SourceSettings(table, starting_version=starting_version),
            KafkaTarget(bootstrap_servers, topic, registry),
            RunSettings(checkpoint, available_now=True),
        )
    )


def test_schema_evolution_under_backward_compatibility(tmp_path, kafka_broker, schema_registry):
    from lance_cdf.errors import LanceCdfError

    uri = str(tmp_path / "evo.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(3), "s": ["a", "b", "c"]}), uri, enable_stable_row_ids=True
    )
    topic = f"evo-{uuid.uuid4().hex[:8]}"
    client = SchemaRegistryClient({"url": schema_registry.url})
    client.set_compatibility(subject_name=f"{topic}-value", level="BACKWARD")
    ck = str(tmp_path / "ck")
    run = (kafka_broker.bootstrap_servers, topic, schema_registry.url, ck)
    publish_until_caught_up(uri, *run, starting_version="1")
    assert len(client.get_versions(f"{topic}-value")) == 1
    # additive: a new nullable column is a new schema version the registry accepts
    lance.dataset(uri).add_columns({"extra": "id * 2"})
    publish_until_caught_up(uri, *run)
    assert len(client.get_versions(f"{topic}-value")) == 2
    latest = client.get_latest_version(f"{topic}-value").schema.schema_str
    assert '"extra"' in latest
    # incompatible: a retyped column is refused by the registry and publishing stops, saying so
    lance.dataset(uri).alter_columns({"path": "id", "data_type": pa.int32()})
    lance.dataset(uri).update({"s": "'z'"})
    with pytest.raises(LanceCdfError, match="compatibility rules forbid"):
        publish_until_caught_up(uri, *run)
    assert len(client.get_versions(f"{topic}-value")) == 2


def test_publish_snapshot_bootstrap_then_changes(tmp_path, kafka_broker, schema_registry):
    """publish --snapshot on a table whose first versions were cleaned up: op="r"
    records with the full row in `after`, then the later changes, each once."""
    from datetime import timedelta

    from lance_cdf.cli import main

    uri = str(tmp_path / "boot.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(10), "s": [f"s{i}" for i in range(10)]}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=4,
    )
    lance.dataset(uri).delete("id = 0")  # v2
    lance.dataset(uri).update({"s": "'u'"}, where="id > 6")  # v3
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=1)
    v0 = lance.dataset(uri).version
    topic = f"boot-{uuid.uuid4().hex[:8]}"
    args = publish_args(
        uri,
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        tmp_path / "ck",
        "--snapshot",
        "--available-now",
        "--max-rows-per-trigger",
        "4",
    )
    # a snapshot split over micro-batches has no transaction metadata (one version's BEGIN
    # and END cannot be written before its last micro-batch): publish refuses without this
    assert main(args) == 2
    args.append("--no-transaction-metadata")
    assert main(args) == 0
    lance.dataset(uri).delete("id = 5")  # v0 + 1
    lance.dataset(uri).update({"s": "'w'"}, where="id = 8")  # v0 + 2
    assert main(args) == 0  # same checkpoint: continues after the snapshot
    want = lance_cdf.read_changes(uri, v0, snapshot=True).read_all().to_pylist()
    got = consume_all(kafka_broker.bootstrap_servers, topic, schema_registry.url, 9 + 3)
    snap = [(k, v) for k, v in got if v is not None and v["op"] == "r"]
    assert len(snap) == 9  # the rows at v0, each once
    assert {k["_rowid"]: v["after"] for k, v in snap} == {
        e["_rowid"]: {"id": e["id"], "s": e["s"]} for e in want if e["_change_type"] == "snapshot"
    }
    assert all(
        v["before"] is None
        and v["source"]["snapshot"] == "true"
        and v["source"]["commit_version"] == v0
        for _, v in snap
    )
    rest = [(k["_rowid"], v and v["op"], v and v["source"]["commit_version"]) for k, v in got[9:]]
    deleted = next(e["_rowid"] for e in want if e["_change_type"] == "delete")
    updated = next(e["_rowid"] for e in want if e["_change_type"] == "update_postimage")
    assert got[:9] == snap  # snapshot records come first
    assert rest == [(deleted, "d", v0 + 1), (deleted, None, None), (updated, "u", v0 + 2)]
    assert all(v["source"]["snapshot"] == "false" for _, v in got[9:] if v is not None)
    # and a replica bootstrapped from the topic equals the source, version 1 long gone
    from lance_cdf.replicate.replicator import Replicator
    from tests.replicate.test_replicate import assert_replica_equals_source

    replica = str(tmp_path / "replica.lance")
    Replicator(
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        replica,
        group_id=f"g-{topic}",
        max_batch_rows=5,
        max_batch_interval=0.5,
    ).run(2)
    assert_replica_equals_source(uri, replica)


def test_publish_killed_mid_snapshot_resumes_and_the_replica_equals_the_source(
    tmp_path, kafka_broker, schema_registry
):
    """The publisher's driver is SIGKILLed part-way through the snapshot of a table whose
    first versions are gone; the restarted publish resumes from its checkpoint and a
    replica bootstrapped from the topic equals the source (duplicates allowed, no gap)."""
    import os
    import signal
    import subprocess
    import time
    from datetime import timedelta

    from lance_cdf.cli import main
    from lance_cdf.replicate.replicator import Replicator
    from tests.replicate.test_replicate import assert_replica_equals_source

    uri = str(tmp_path / "big.lance")
    n = 400
    lance.write_dataset(
        pa.table({"id": np.arange(n), "s": [f"s{i}" for i in range(n)]}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=25,
    )
    lance.dataset(uri).update({"s": "'u'"}, where="id % 7 = 0")  # v2
    lance.dataset(uri).delete("id % 11 = 0")  # v3
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=1)
    assert lance.dataset(uri).versions()[0]["version"] == 3  # versions 1 and 2 are gone
    topic = f"kill-{uuid.uuid4().hex[:8]}"
    ck = tmp_path / "ck"
    args = publish_args(
        uri,
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        ck,
        "--snapshot",
        "--max-rows-per-trigger",
        "30",
        "--no-transaction-metadata",
    )
    proc = start_cli(
        [*args, "--trigger-interval", "0 seconds"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            done = (
                len([f for f in os.listdir(ck / "commits") if f.isdigit()])
                if (ck / "commits").is_dir()
                else 0
            )
            if done >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and workers, mid-snapshot
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = len([f for f in os.listdir(ck / "commits") if f.isdigit()])
    rows = lance.dataset(uri).count_rows()
    assert 2 <= done and done * 30 < rows  # really stopped before the snapshot's end
    lance.dataset(uri).delete("id < 40")  # v4, while the publisher is down
    lance.dataset(uri).update({"s": "'late'"}, where="id > 300")  # v5
    assert main([*args, "--available-now"]) == 0  # resumes from the checkpoint
    replica = str(tmp_path / "replica.lance")
    rep = Replicator(
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        replica,
        group_id=f"g-{topic}",
        max_batch_rows=100,
        max_batch_interval=0.5,
    )
    rep.run(3)
    assert_replica_equals_source(uri, replica)
    # every row of the snapshot reached the topic (at least once)
    got = consume_all(kafka_broker.bootstrap_servers, topic, schema_registry.url, rows)
    snap_ids = {v["after"]["id"] for _, v in got if v is not None and v["op"] == "r"}
    assert snap_ids == {i for i in range(n) if i % 11}


def test_records_of_a_renamed_and_a_blob_column(tmp_path, kafka_broker, schema_registry):
    uri = str(tmp_path / "rb.lance")
    blob = pa.field("img", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string()), blob])
    data = pa.table({"id": [1, 2], "s": ["a", "b"], "img": [b"one", None]}, schema=schema)
    lance.write_dataset(data, uri, enable_stable_row_ids=True)
    lance.dataset(uri).alter_columns({"path": "s", "name": "t"})  # v2
    renamed = pa.schema([schema.field("id"), pa.field("t", pa.string()), blob])
    new = pa.table({"id": [2], "t": ["B"], "img": [b"two"]}, schema=renamed)
    lance.dataset(uri).merge_insert("id").when_matched_update_all().execute(new)  # v3
    topic = f"rb-{uuid.uuid4().hex[:8]}"
    publish_until_caught_up(
        uri,
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        str(tmp_path / "ck"),
        starting_version="1",
    )
    got = consume_all(kafka_broker.bootstrap_servers, topic, schema_registry.url, 3)
    flat = sorted(
        ((v["source"]["commit_version"], v["op"], v["before"], v["after"]) for _, v in got if v),
        key=lambda r: (r[0], r[3]["id"]),
    )
    assert flat == [
        (1, "c", None, {"id": 1, "t": "a", "img": b"one"}),
        (1, "c", None, {"id": 2, "t": "b", "img": None}),
        (3, "u", {"id": 2, "t": "b", "img": None}, {"id": 2, "t": "B", "img": b"two"}),
    ]


def test_publish_then_replicate_keeps_the_tables_types(tmp_path, kafka_broker, schema_registry):
    """Through `lance-cdf publish` (Spark widens uint32 to long, fixed-size lists to
    lists, fixed_size_binary to binary) and `lance-cdf replicate`, the replica's schema
    equals the source's type for type: the sink takes the types from the table."""
    from lance_cdf.cli import main

    n = 20
    rng = np.random.default_rng(3)
    ids = np.arange(n)
    table = pa.table(
        {
            "id": ids,
            "s": [f"s{i}" for i in range(n)],
            "i8": pa.array(ids - 10, pa.int8()),
            "i16": pa.array(ids * -300, pa.int16()),
            "u8": pa.array(ids + 200, pa.uint8()),
            "u16": pa.array(ids + 65_000, pa.uint16()),
            "u32": pa.array(ids + 2**32 - n, pa.uint32()),
            "u64": pa.array(ids + 2**62, pa.uint64()),
            "h": pa.array(ids.astype(np.float16) / 4, pa.float16()),
            "fx": pa.array([i.to_bytes(16, "big") for i in range(n)], pa.binary(16)),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(n * DIM, dtype=np.float32)), DIM
            ),
            "tags": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.uint16())),
        }
    )
    uri = str(tmp_path / "types.lance")
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=8)
    lance.dataset(uri).update({"u32": "u32 - 1", "s": "'u'"}, where="id < 4")
    lance.dataset(uri).delete("id IN (5, 6)")
    topic = f"types-{uuid.uuid4().hex[:8]}"
    endpoint = [
        "--bootstrap-servers",
        kafka_broker.bootstrap_servers,
        "--topic",
        topic,
        "--schema-registry",
        schema_registry.url,
    ]
    assert (
        main(
            [
                "publish",
                "--table",
                uri,
                *endpoint,
                "--checkpoint",
                str(tmp_path / "ck"),
                "--snapshot",
                "--available-now",
                "--table-name",
                "shop.types",
            ]
        )
        == 0
    )
    # the registered value schema is the table's, named as Debezium names it
    client = SchemaRegistryClient({"url": schema_registry.url})
    import json

    value = json.loads(client.get_latest_version(f"{topic}-value").schema.schema_str)
    assert value["namespace"] == "shop.types" and value["name"] == "Envelope"
    replica = str(tmp_path / "replica.lance")
    assert main(["replicate", *endpoint, "--target", replica, "--idle-timeout", "3"]) == 0
    source = lance.dataset(uri).schema
    got = lance.dataset(replica).schema
    assert [(f.name, f.type) for f in got if f.name != "_source_rowid"] == [
        (f.name, f.type) for f in source
    ]
    from tests.replicate.test_replicate import assert_replica_equals_source

    assert_replica_equals_source(uri, replica)


def test_the_sink_restores_the_types_spark_widened(tmp_path):
    """Unit check of the sink's type restoration: Spark's forms of the columns (as
    spark/source/types makes them) go back to the table's own types, values intact."""
    from lance_cdf.core.feed import ChangeFeed
    from lance_cdf.spark.source.types import sparkable

    table = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "u32": pa.array([2**32 - 1, 0], pa.uint32()),
            "fx": pa.array([b"a" * 16, b"b" * 16], pa.binary(16)),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8, dtype=np.float32)), 4),
            "tags": pa.array([[1], []], pa.list_(pa.uint16())),
            "ts": pa.array([0, 1000], pa.timestamp("ns")),  # Spark's form is kept
        }
    )
    uri = str(tmp_path / "w.lance")
    lance.write_dataset(table, uri, enable_stable_row_ids=True)
    widened = pa.schema([f.with_type(sparkable(f.type)) for f in table.schema])
    widened = widened.set(5, widened.field("ts").with_type(pa.timestamp("us")))
    assert [f.type for f in widened] != [f.type for f in table.schema]
    exact = spark_sink.table_types(widened, ChangeFeed(uri), 1)
    assert [f.type for f in exact] == [*table.schema.types[:5], pa.timestamp("us")]
    events = pa.Table.from_arrays(
        [table[c].cast(widened.field(c).type) for c in table.column_names], schema=widened
    )
    restored = spark_sink.restore_types(events, exact)
    assert restored.select(table.column_names[:5]) == table.select(table.column_names[:5])
