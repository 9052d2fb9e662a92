"""Transaction metadata: `lance-cdf publish` SIGKILLed at random points while
commits keep coming, then finished with --available-now; the transaction topic then holds,
for every commit version with events on the change topic, one BEGIN and one END whose
counts (total, per table, per partition) equal the records on the change topic. Decoded with
confluent-kafka's AvroDeserializer (fastavro, the registry's schema), not lance-cdf's code."""

import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from lance_cdf.cli import main
from tests.kafka.test_exactly_once import killable_publish, publish_under_kills
from tests.support.publish_process import cli_env, publish_args

pytestmark = pytest.mark.integration  # `lance-cdf publish` (Spark) in subprocesses

PARTITIONS = 3


def read_all(bootstrap, topic):
    """Every record of every partition of `topic`, in partition order."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    meta = c.list_topics(topic, timeout=10).topics[topic]
    ends = {}
    for p in meta.partitions:
        low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if high > low:
            ends[p] = high
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    out, deadline = [], time.monotonic() + 60
    left = dict(ends)
    while left and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        out.append(m)
        if m.offset() + 1 >= left.get(m.partition(), 0):
            left.pop(m.partition(), None)
    c.close()
    assert not left, f"partitions {left} not read to their end"
    return out


def change_counts(bootstrap, topic):
    """version -> partition -> [events, records] as found on the change topic (headers)."""
    counts = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for m in read_all(bootstrap, topic):
        h = dict(m.headers() or [])
        c = counts[int(h["lance-cdf.commit-version"])][m.partition()]
        c[1] += 1
        if m.value() is not None:
            c[0] += 1
    return counts


def transactions(bootstrap, topic, registry_url):
    client = SchemaRegistryClient({"url": registry_url})
    key_de, value_de = AvroDeserializer(client), AvroDeserializer(client)
    out = []
    for m in read_all(bootstrap, topic):
        key = key_de(m.key(), SerializationContext(topic, MessageField.KEY))
        value = value_de(m.value(), SerializationContext(topic, MessageField.VALUE))
        assert key == {"id": value["id"]}
        out.append(value)
    return out


def check_transactions(txns, counts, name):
    """One BEGIN then one END per version with events, in version order, END's counts
    equal to the change topic's records."""
    assert Counter((t["id"], t["status"]) for t in txns) == Counter(
        {(f"{name}:{v}", s): 1 for v in counts for s in ("BEGIN", "END")}
    )
    versions = [int(t["id"].rsplit(":", 1)[1]) for t in txns]
    assert versions == sorted(versions)
    for t in txns:
        v = int(t["id"].rsplit(":", 1)[1])
        if t["status"] == "BEGIN":
            assert t["event_count"] is None and t["data_collections"] is None
            continue
        events = sum(e for e, _ in counts[v].values())
        assert t["event_count"] == events
        assert t["data_collections"] == [{"data_collection": name, "event_count": events}]
        assert {
            p["partition"]: [p["event_count"], p["record_count"]] for p in t["lance_cdf_partitions"]
        } == dict(counts[v])


def check_blocks(bootstrap, topic, registry_url, txns, name):
    """Every change event's `transaction` block (decoded with fastavro and the registry's
    schema): id that of its version's BEGIN/END, and the version's blocks numbered
    1..N exactly once each, N = END's event_count; data_collection_order = total_order."""
    value_de = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    orders = defaultdict(list)
    for m in read_all(bootstrap, topic):
        if m.value() is None:
            continue  # a tombstone
        value = value_de(m.value(), SerializationContext(topic, MessageField.VALUE))
        block = value["transaction"]
        version = value["source"]["commit_version"]
        assert block["id"] == f"{name}:{version}"
        assert block["data_collection_order"] == block["total_order"]
        orders[version].append(block["total_order"])
    ends = {int(t["id"].rsplit(":", 1)[1]): t["event_count"] for t in txns if t["status"] == "END"}
    assert set(orders) == set(ends)
    for version, n in ends.items():
        assert sorted(orders[version]) == list(range(1, n + 1)), version


def test_every_version_one_begin_and_end_with_the_topics_counts_under_kills(
    tmp_path, kafka_broker, schema_registry
):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(200), "s": ["a"] * 200}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=50,
    )
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    args = publish_args(
        uri,
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        tmp_path / "ck",
        "--starting-version",
        "1",
        "--key",
        "id",
        "--max-rows-per-trigger",
        "30",
        "--table-name",
        "shop.items",
    )
    kills = publish_under_kills(
        killable_publish(args),
        cli_env(),
        uri,
        random.Random(32),
        kills_total=6,
        group_most=3,
        group_p=0.5,
        pause=(2, 6),
        commits=30,
    )
    assert kills["group"] >= 2
    assert main([*args, "--available-now"]) == 0  # the rest, from the checkpoint
    counts = change_counts(kafka_broker.bootstrap_servers, topic)
    assert len(counts) >= 20  # the writer's commits, with events
    txns = transactions(kafka_broker.bootstrap_servers, f"{topic}.transaction", schema_registry.url)
    check_transactions(txns, counts, "shop.items")
    check_blocks(kafka_broker.bootstrap_servers, topic, schema_registry.url, txns, "shop.items")


def test_no_transaction_metadata_writes_no_transaction_topic(
    tmp_path, kafka_broker, schema_registry
):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(10)}), uri, enable_stable_row_ids=True)
    lance.write_dataset(pa.table({"id": np.arange(10, 15)}), uri, mode="append")
    topic = f"notxn-{uuid.uuid4().hex[:8]}"
    bootstrap, registry = kafka_broker.bootstrap_servers, schema_registry.url
    once = ("--starting-version", "1", "--available-now", "--master", "local[2]")
    args = publish_args(uri, bootstrap, topic, registry, tmp_path / "a", *once)
    assert main([*args, "--no-transaction-metadata"]) == 0
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    assert f"{topic}.transaction" not in admin.list_topics(timeout=10).topics
    # the same table to another topic, with a named transaction topic: versions 1 and 2
    other = f"{topic}-b"
    args = publish_args(uri, bootstrap, other, registry, tmp_path / "b", *once)
    assert main([*args, "--transaction-topic", f"{other}-tx"]) == 0
    counts = change_counts(kafka_broker.bootstrap_servers, other)
    assert sorted(counts) == [1, 2]
    txns = transactions(kafka_broker.bootstrap_servers, f"{other}-tx", schema_registry.url)
    check_transactions(txns, counts, "lancecdf.t")
    check_blocks(kafka_broker.bootstrap_servers, other, schema_registry.url, txns, "lancecdf.t")
    meta = admin.list_topics(timeout=10).topics[f"{other}-tx"]
    assert len(meta.partitions) == 1


def docs_example() -> str:
    """The consumer example of the publish guide's "Transaction metadata" section (the
    snippet docs/guides/publish.md includes)."""
    return (
        Path(__file__).resolve().parents[2] / "docs/snippets/transaction_example.py"
    ).read_text()


def test_docs_consumer_example_sees_each_version_complete(tmp_path, kafka_broker, schema_registry):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(10)}), uri, enable_stable_row_ids=True)
    lance.write_dataset(pa.table({"id": np.arange(10, 15)}), uri, mode="append")
    lance.dataset(uri).delete("id < 3")
    topic = f"example-{uuid.uuid4().hex[:8]}"
    args = publish_args(
        uri,
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        tmp_path / "ck",
        "--starting-version",
        "1",
        "--available-now",
        "--master",
        "local[2]",
    )
    assert main(args) == 0
    script = tmp_path / "transaction_example.py"
    script.write_text(docs_example())
    env = {
        **os.environ,
        "BOOTSTRAP": kafka_broker.bootstrap_servers,
        "TOPIC": topic,
        "REGISTRY": schema_registry.url,
        "GROUP": uuid.uuid4().hex,
    }
    run = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(run.stdout.splitlines()) == [
        "version 1 complete: 10 events",
        "version 2 complete: 5 events",
        "version 3 complete: 3 events",
    ]
