"""One replicator for a whole database: `lance-cdf replicate
--database-target URI --topic-prefix P` follows every topic `P.<qualified name>` with one
consumer and keeps a replica database whose tables, opened by the same qualified names
(LanceDB, `namespace.resolve_table`), equal the source's.

The source is a LanceDB database (stable row IDs) of three tables, one in a child
namespace, each published by the single-table publisher (Spark sink, transaction metadata)
to `P.<qualified name>`. The oracle is the source table itself at the version each
replica says it holds (`lance-cdf.source-version`), scanned with pylance (tests/support/oracle.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient

from lance_cdf.errors import LanceCdfError
from lance_cdf.format.namespace import list_tables, resolve_table, table_location
from lance_cdf.replicate.database_replicator import table_topics
from lance_cdf.replicate.replica import SOURCE_ROWID, ReplicaTable, source_version_of
from tests.support.oracle import table_state

lancedb = pytest.importorskip("lancedb")

STABLE = {"new_table_enable_stable_row_ids": "true"}  # per table (see test_lancedb)
TABLES = [("items", None), ("users", None), ("orders", ["sales"])]


def rows(lo: int, hi: int, tag: str) -> pa.Table:
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": [f"{tag}{i}" for i in ids], "x": ids * 0.5})


def qualified(name: str, namespace: list[str] | None) -> str:
    return ".".join([*(namespace or []), name])


def publish_all(src: str, prefix: str, kafka, registry, ck: str, only: str | None = None):
    """Each table of the database published by the single-table publisher (until caught
    up) to `prefix.<qualified name>`, as `publish --database` names its topics."""
    from lance_cdf.spark.publish.runner import publish
    from lance_cdf.spark.publish.settings import (
        KafkaTarget,
        PublishSettings,
        RunSettings,
        SourceSettings,
    )

    for ref in list_tables(src):
        if only is not None and ref.qualified_name != only:
            continue
        topic = f"{prefix}.{ref.qualified_name}"
        publish(
            PublishSettings(
                SourceSettings(ref.uri, starting_version="1"),
                KafkaTarget(kafka.bootstrap_servers, topic, registry.url, table_name=topic),
                RunSettings(os.path.join(ck, ref.qualified_name), available_now=True),
            )
        )


def write_round(db, i: int) -> None:
    """A few commits to every table: an append, an update, a delete, an upsert."""
    for name, ns in TABLES:
        t = db.open_table(name, namespace_path=ns)
        base = 1000 * (i + 1)
        t.add(rows(base, base + 40, f"r{i}"))
        t.update(where=f"id % 7 = {i % 7}", values={"s": f"u{i}"})
        t.delete(f"id % 11 = {i % 11}")
        src = pa.concat_tables([rows(3 + i, 9 + i, f"m{i}"), rows(base + 50, base + 53, "n")])
        t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)


def replicate_cmd(kafka, registry, prefix: str, dst: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "replicate",
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--schema-registry",
        registry.url,
        "--database-target",
        dst,
        "--topic-prefix",
        prefix,
        "--max-batch-rows",
        "50",
        "--max-batch-interval",
        "0.3",
        "--refresh-interval",
        "1",
        *extra,
    ]


def replica_equals_source(src: str, dst: str, name: str) -> int:
    """The replica of table `name` (opened by its qualified name in the replica database)
    equals the source at the version it says it holds; that version."""
    replica_uri = resolve_table(dst, name)
    held = source_version_of(ReplicaTable(replica_uri, []).position())
    assert held is not None, f"{name}: the replica holds no whole source version"
    want = table_state(resolve_table(src, name), held)
    replica = lance.dataset(replica_uri).to_table().to_pylist()
    got = {r.pop(SOURCE_ROWID): r for r in replica}
    assert len(got) == len(replica), f"{name}: duplicate keys in the replica"
    assert got.keys() == want.keys(), name
    diff = [k for k in want if {c: got[k].get(c) for c in want[k]} != want[k]]
    assert not diff, (name, held, diff[:3])
    return held


def create_topic(admin, topic: str) -> bool:
    """Whether `topic` could be created (False: its deletion is still under way)."""
    from confluent_kafka.admin import NewTopic

    try:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    except Exception:  # noqa: BLE001 (TOPIC_ALREADY_EXISTS while being deleted)
        return False
    return True


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_table_topics_naming():
    topics = [
        "p.items",
        "p.items.transaction",
        "p.sales.orders",
        "p.sales.orders.transaction",
        "q.items",
        "p",
        "p..x",
        "__consumer_offsets",
        "p.tmp_x",
    ]
    got = [(t.topic, t.identifier) for t in table_topics(topics, "p")]
    assert got == [
        ("p.items", ("items",)),
        ("p.sales.orders", ("sales", "orders")),
        ("p.tmp_x", ("tmp_x",)),
    ]
    got = table_topics(
        topics, "p", include=re.compile(r"sales\..*|items|tmp_x"), exclude=re.compile(r"tmp_.*")
    )
    assert [t.qualified_name for t in got] == ["items", "sales.orders"]


def caught_up(src: str, dst: str, name: str) -> bool:
    """Whether the replica of `name` holds the source's latest version."""
    try:
        replica_uri = resolve_table(dst, name)
    except LanceCdfError:
        return False
    held = source_version_of(ReplicaTable(replica_uri, []).position())
    return held == lance.dataset(resolve_table(src, name)).version


def test_table_location_declares_tables_lancedb_finds(tmp_path):
    """Replica tables declared by qualified name (namespace levels created) are where the
    Lance directory namespace puts them: LanceDB and list_tables find them by name."""
    root = str(tmp_path / "db")
    where = {
        ident: table_location(root, ident)
        for ident in [("items",), ("sales", "orders"), ("sales", "eu", "orders")]
    }
    assert where[("items",)] == os.path.join(root, "items.lance")
    for ident, uri in where.items():
        assert table_location(root, ident) == uri  # found again, not declared twice
        lance.write_dataset(rows(0, len(ident), "a"), uri, enable_stable_row_ids=True)
    assert {r.qualified_name: r.uri for r in list_tables(root)} == {
        ".".join(ident): uri for ident, uri in where.items()
    }
    db = lancedb.connect(root)
    assert db.list_tables().tables == ["items"]
    assert db.list_tables(namespace_path=["sales"]).tables == ["orders"]
    assert db.open_table("orders", namespace_path=["sales", "eu"]).count_rows() == 3


def test_database_replica_equals_source_after_a_kill(
    tmp_path, kafka_broker, schema_registry, spark
):
    src, dst, ck = str(tmp_path / "src"), str(tmp_path / "dst"), str(tmp_path / "ck")
    prefix = f"db{uuid.uuid4().hex[:6]}"
    db = lancedb.connect(src)
    db.create_namespace(["sales"])
    for name, ns in TABLES:
        db.create_table(name, rows(0, 120, "a"), namespace_path=ns, storage_options=STABLE)
    write_round(db, 0)
    publish_all(src, prefix, kafka_broker, schema_registry, ck)
    names = sorted(qualified(n, ns) for n, ns in TABLES)
    first = {n: lance.dataset(resolve_table(src, n)).version for n in names}

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = replicate_cmd(kafka_broker, schema_registry, prefix, dst)
    with open(tmp_path / "replicate-1.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            wait_for(lambda: all(caught_up(src, dst, n) for n in names), 120, "every replica")
            # more commits published while it runs; it is killed once the first table's
            # replica moves on (the others in whatever state they are)
            write_round(db, 1)
            publish_all(src, prefix, kafka_broker, schema_registry, ck)
            wait_for(
                lambda: any(
                    source_version_of(ReplicaTable(resolve_table(dst, n), []).position())
                    != first[n]
                    for n in names
                ),
                120,
                "a replica to move on",
            )
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # a real crash, wherever it is
            proc.wait(30)

    # restarted: every table resumes from its own replica's position; a table created
    # later is picked up, and a topic deleted is let go, without a restart
    with open(tmp_path / "replicate-2.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            wait_for(lambda: all(caught_up(src, dst, n) for n in names), 120, "every replica")
            db.create_table(
                "returns", rows(0, 30, "r"), namespace_path=["sales"], storage_options=STABLE
            )
            publish_all(src, prefix, kafka_broker, schema_registry, ck, only="sales.returns")
            wait_for(lambda: caught_up(src, dst, "sales.returns"), 60, "the new table")
            # a second replicator of the same database in another group (one of the same
            # group would share the tables): every table's lease is held
            second = subprocess.run(
                [*cmd, "--idle-timeout", "2", "--group-id", f"other-{prefix}"],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert second.returncode == 2, second.stderr[-3000:]
            assert "4 table(s) not replicated" in second.stderr
            assert second.stderr.count("is being written by") >= 4
            admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
            gone = [f"{prefix}.users", f"{prefix}.users.transaction"]
            for f in admin.delete_topics(gone).values():
                f.result(30)
            wait_for(
                lambda: b"no longer exists" in (tmp_path / "replicate-2.log").read_bytes(),
                60,
                "the deleted topic to be let go",
            )
            # created again (empty): its replica holds offsets the new topic does not, so
            # that table is refused and left out, the others go on
            wait_for(lambda: create_topic(admin, f"{prefix}.users"), 60, "the topic again")
            wait_for(
                lambda: (
                    b"table users not replicated" in (tmp_path / "replicate-2.log").read_bytes()
                ),
                60,
                "users refused",
            )
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # a clean stop, then the refusal: exit 2
            code = proc.wait(60)
    out = (tmp_path / "replicate-2.log").read_text()
    assert code == 2, out[-3000:]
    assert "let go users: its topic was deleted" in out
    assert "1 table(s) not replicated (the others were): users: " in out
    assert "deleted and created again" in out
    names = sorted([*names, "sales.returns"])
    assert [r.qualified_name for r in list_tables(dst)] == names
    for name in names:
        held = replica_equals_source(src, dst, name)
        assert held == lance.dataset(resolve_table(src, name)).version, name
    # LanceDB sees the replica database under the same names, namespaces kept
    replica_db = lancedb.connect(dst)
    assert sorted(replica_db.list_tables().tables) == ["items", "users"]
    assert sorted(replica_db.list_tables(namespace_path=["sales"]).tables) == ["orders", "returns"]
    orders = replica_db.open_table("orders", namespace_path=["sales"]).to_arrow()
    source = lancedb.connect(src).open_table("orders", namespace_path=["sales"]).to_arrow()
    assert orders.select(source.column_names).sort_by("id").equals(source.sort_by("id"))
    # status: one line per replica table, with the source version it holds
    status = subprocess.run(
        [sys.executable, "-m", "lance_cdf.cli", "status", "--database-target", dst, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = {r["table"]: r for r in json.loads(status.stdout)["replicas"]}
    assert sorted(report) == names
    for name in names:
        assert report[name]["source_version"] == lance.dataset(resolve_table(src, name)).version
        assert report[name]["topic"] == f"{prefix}.{name}"


def test_a_topic_created_again_is_refused(tmp_path, kafka_broker, schema_registry):
    """A replica whose topic was deleted and created again (a table dropped and published
    anew under its name) holds offsets the new topic does not: refused at start rather than
    skip the new topic's first records."""
    from confluent_kafka.admin import NewTopic

    import lance_cdf
    from lance_cdf.errors import ReplicaPositionError
    from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of
    from lance_cdf.replicate.replicator import Replicator

    uri, dst = str(tmp_path / "t.lance"), str(tmp_path / "replica.lance")
    lance.write_dataset(rows(0, 20, "a"), uri, enable_stable_row_ids=True)
    topic = f"again-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})

    def publish(lo: int, hi: int) -> None:
        """Records lo..hi-1 of the table's first version (its 20 inserts)."""
        events = lance_cdf.read_changes(uri, 1, 1).read_all()
        pub = KafkaChangePublisher(
            kafka_broker.bootstrap_servers,
            topic,
            schema_registry.url,
            user_schema_of(events.schema),
            uri,
        )
        pub.publish(events.slice(lo, hi - lo), {1: "Append"})

    def replicate() -> None:
        Replicator(
            kafka_broker.bootstrap_servers,
            topic,
            schema_registry.url,
            dst,
            transaction_metadata=False,
            group_id=f"g-{topic}",
            max_batch_interval=0.3,
        ).run(idle_timeout=3)

    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    publish(0, 20)
    replicate()
    assert lance.dataset(dst).count_rows() == 20
    admin.delete_topics([topic])[topic].result(30)

    wait_for(lambda: create_topic(admin, topic), 60, "the topic to be created again")
    publish(0, 5)  # fewer records than the replica applied of the old topic
    with pytest.raises(ReplicaPositionError, match="deleted and created again"):
        replicate()
    assert lance.dataset(dst).count_rows() == 20  # nothing applied


def test_publish_database_then_replicate_database_gives_an_equal_database(
    tmp_path, kafka_broker, schema_registry
):
    """The two database commands together, as a user runs them: `publish --database` (one
    Spark application for every table) then `replicate --database-target` (one consumer);
    every replica table, opened by its qualified name, equals its source table."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    db = lancedb.connect(src)
    db.create_namespace(["sales"])
    for i, (name, ns) in enumerate(TABLES):
        db.create_table(name, rows(0, 60, f"t{i}"), namespace_path=ns, storage_options=STABLE)
    for i in range(2):
        write_round(db, i)
    prefix = f"e2e{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    publish = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf.cli",
            "publish",
            "--database",
            src,
            "--topic-prefix",
            prefix,
            "--bootstrap-servers",
            kafka_broker.bootstrap_servers,
            "--schema-registry",
            schema_registry.url,
            "--checkpoint",
            str(tmp_path / "ck"),
            "--starting-version",
            "1",
            "--available-now",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert publish.returncode == 0, publish.stderr[-3000:]
    replicate = subprocess.run(
        replicate_cmd(kafka_broker, schema_registry, prefix, dst, "--idle-timeout", "8"),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert replicate.returncode == 0, replicate.stderr[-3000:]
    names = [qualified(name, ns) for name, ns in TABLES]
    assert sorted(r.qualified_name for r in list_tables(dst)) == sorted(names)
    for name in names:
        latest = lance.dataset(resolve_table(src, name)).version
        assert replica_equals_source(src, dst, name) == latest, name
