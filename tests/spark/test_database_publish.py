"""`lance-cdf publish --database`: one publisher, one Spark query, for every table
of a LanceDB database. While commits keep coming to its tables the publisher is SIGKILLed
once and restarted, a table is dropped, one is created, and one without stable row IDs is
there all along; at the end every live table's topic holds `read_changes` of that table
exactly once, per key in commit order (tombstones included), with its own record names and
its own transaction topic whose BEGIN/END counts equal the topic's records. Decoded with
confluent-kafka's AvroDeserializer and the registry's schemas, not lance-cdf's code."""

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import defaultdict

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from lance_cdf.cli import main
from lance_cdf_devtools.commands import publish
from tests.kafka.test_kafka_order import expected_by_key
from tests.kafka.test_transactions import (
    change_counts,
    check_blocks,
    check_transactions,
    read_all,
    transactions,
)

pytestmark = pytest.mark.integration  # `lance-cdf publish` (Spark) in subprocesses

lancedb = pytest.importorskip("lancedb")
STABLE = {"new_table_enable_stable_row_ids": "true"}  # as test_lancedb


def rows(lo, hi, tag):
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": [f"{tag}{i}" for i in ids]})


def commit(path, rng):
    """One random commit to the table at `path`: an update, a delete + re-insert of the same
    user keys (new row IDs), or a merge-insert."""
    ds = lance.dataset(path)
    ids = rng.sample(range(100), 4)
    kind = rng.random()
    if kind < 0.4:
        ds.update({"s": f"'u{ds.version}'"}, where=f"id IN {tuple(ids)}")
    elif kind < 0.7:
        ds.delete(f"id IN {tuple(ids)}")
        lance.write_dataset(pa.table({"id": ids, "s": [f"b{ds.version}"] * 4}), path, mode="append")
    else:
        src = pa.table({"id": ids, "s": [f"m{ds.version}"] * 4})
        ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)


def writer(paths, stop, commits):
    rng = random.Random(35)
    for _ in range(commits):
        if stop.is_set():
            return
        commit(paths[rng.choice(sorted(paths))], rng)
        time.sleep(0.3)


def by_key(bootstrap, topic, registry_url):
    """Per user key, its records in partition order (as consume_by_key has them)."""
    de = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    out, partition_of = defaultdict(list), {}
    for m in read_all(bootstrap, topic):
        key = de(m.key(), SerializationContext(topic, MessageField.KEY))["id"]
        assert partition_of.setdefault(key, m.partition()) == m.partition()
        if m.value() is None:
            out[key].append((None, None, None))
            continue
        v = de(m.value(), SerializationContext(topic, MessageField.VALUE))
        out[key].append((v["op"], v["source"]["commit_version"], v["after"]))
    return dict(out)


def records(want):
    return sum(len(v) for v in want.values())


def topic_size(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    if found is None or found.error is not None:
        return 0
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        return sum(
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in found.partitions
        )
    finally:
        c.close()


def wait_for(sizes, bootstrap, proc, timeout=150):
    """Until each topic holds at least its expected records (the publisher must stay up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the publisher stopped"
        if all(topic_size(bootstrap, t) >= n for t, n in sizes.items()):
            return
        time.sleep(1)
    got = {t: topic_size(bootstrap, t) for t in sizes}
    raise AssertionError(f"topics not caught up: want {sizes}, have {got}")


def test_database_publish_follows_every_table_exactly_once(
    tmp_path, kafka_broker, schema_registry, capsys
):
    bootstrap = kafka_broker.bootstrap_servers
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_namespace(["sales"])
    tables = {
        "items": db.create_table("items", rows(0, 100, "a"), storage_options=STABLE),
        "sales.orders": db.create_table(
            "orders", rows(0, 100, "o"), namespace_path=["sales"], storage_options=STABLE
        ),
        "archive": db.create_table("archive", rows(0, 50, "x"), storage_options=STABLE),
    }
    db.create_table("legacy", rows(0, 10, "l"))  # no stable row IDs: skipped, not a crash
    paths = {name: t.uri.removeprefix("file://") for name, t in tables.items()}
    rng = random.Random(1)
    for name in paths:
        commit(paths[name], rng)
    prefix = f"db{uuid.uuid4().hex[:6]}"
    topic = {name: f"{prefix}.{name}" for name in [*paths, "sales.returns"]}
    checkpoint = tmp_path / "ck"
    cmd = publish(
        bootstrap,
        schema_registry.url,
        checkpoint,
        database=root,
        prefix=prefix,
        extra=[
            *("--starting-version", "1", "--key", "id", "--exclude", "skip.*"),
            # quiet tables looked at least every second (default 10)
            *("--idle-poll-max", "1"),
        ],
    )
    args = cmd[3:]  # (for main() in this process)
    cmd += ["--trigger-interval", "500ms", "--master", "local[2,100]"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    with socket.socket() as s:  # a free port for the restarted publisher's metrics
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def start(*more):
        return subprocess.Popen(
            [*cmd, *more],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "publish.err", "a"),
            start_new_session=True,
        )

    stop = threading.Event()
    live = {n: p for n, p in paths.items() if n != "archive"}
    thread = threading.Thread(target=writer, args=(live, stop, 40), daemon=True)
    proc = start()
    try:
        # the archive table: published, then dropped while the publisher runs
        archive = expected_by_key(paths["archive"])
        wait_for({topic["archive"]: records(archive)}, bootstrap, proc)
        thread.start()
        db.drop_table("archive")
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGKILL)  # driver, JVM and workers at once
        proc.wait(30)
        proc = start("--metrics-port", str(port))
        # a table created while publishing: published from its first version
        returns = db.create_table(
            "returns", rows(0, 100, "r"), namespace_path=["sales"], storage_options=STABLE
        )
        live["sales.returns"] = paths["sales.returns"] = returns.uri.removeprefix("file://")
        for _ in range(3):
            commit(live["sales.returns"], rng)
        thread.join(120)
        want = {name: expected_by_key(path) for name, path in live.items()}
        wait_for({topic[n]: records(w) for n, w in want.items()}, bootstrap, proc)
        # the query's report: its reader writes it at its first plan (the head start, which
        # publishes the commits made while the query starts, can have sent them all before)
        report, deadline = {}, time.monotonic() + 120
        while sorted(report.get("followed") or {}) != sorted(live):
            assert proc.poll() is None and time.monotonic() < deadline, report
            time.sleep(0.5)
            with contextlib.suppress(FileNotFoundError, ValueError):
                report = json.loads((checkpoint / "database-tables.json").read_text())
        # metrics: the lag gauges once per followed table (a bounded `table` label), once
        # the query has committed a micro-batch (a head start's records can reach the topics
        # before: until then the lag is not known and has no gauge)
        deadline = time.monotonic() + 120
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                scraped = r.read().decode()
            labels = re.findall(r'^lance_cdf_lag_versions\{table="([^"]+)"\}', scraped, re.M)
            if sorted(labels) == sorted(live) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert sorted(labels) == sorted(live)
    finally:
        stop.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    # every live table: exactly read_changes, once, per key in commit order
    for name, expected in want.items():
        assert by_key(bootstrap, topic[name], schema_registry.url) == expected, name
    assert by_key(bootstrap, topic["archive"], schema_registry.url) == archive
    # each table's own record names, source.table and transaction topic
    registry = SchemaRegistryClient({"url": schema_registry.url})
    de = AvroDeserializer(registry)
    for name in want:
        schema = json.loads(registry.get_latest_version(f"{topic[name]}-value").schema.schema_str)
        assert (schema["namespace"], schema["name"]) in [
            (f"{prefix}.{name}", "Envelope"),
            (None, f"{prefix}.{name}.Envelope"),
        ]
        first = next(m for m in read_all(bootstrap, topic[name]) if m.value() is not None)
        value = de(first.value(), SerializationContext(topic[name], MessageField.VALUE))
        assert value["source"]["table"] == name
        counts = change_counts(bootstrap, topic[name])
        txns = transactions(bootstrap, f"{topic[name]}.transaction", schema_registry.url)
        check_transactions(txns, counts, f"{prefix}.{name}")
        check_blocks(bootstrap, topic[name], schema_registry.url, txns, f"{prefix}.{name}")
    # the table without stable row IDs: left out, in one line, and in the report
    assert "legacy" in report["skipped"] and "stable row IDs" in report["skipped"]["legacy"]
    assert sorted(report["followed"]) == sorted(live)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert f"{prefix}.legacy" not in admin.list_topics(timeout=10).topics
    # a finished publisher picks up from the checkpoint: nothing new, nothing sent again
    assert main([*args, "--available-now"]) == 0
    for name, expected in want.items():
        assert by_key(bootstrap, topic[name], schema_registry.url) == expected, name
    # status: every followed table with its lag (none now), and the skipped one
    capsys.readouterr()
    assert main(["status", "--database", root, "--checkpoint", str(checkpoint), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert sorted(status["tables"]) == sorted(live)
    for name, path in live.items():
        latest = lance.dataset(path).version
        assert status["tables"][name] == {
            "latest_version": latest,
            "checkpoint_version": latest,
            "checkpoint_lag": 0,
        }, name
    assert list(status["skipped"]) == ["legacy"]
