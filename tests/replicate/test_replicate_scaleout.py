"""Replication scales out: several `lance-cdf replicate --database-target` processes of one
`--group-id` share a database's tables (replicate/table_shares.py), each table applied by
one of them (its lease), a SIGKILLed one's tables taken up by the others, a new one given a
share, every replica exactly once through every rebalance.

The source is a set of Lance tables; each version's records go to `P.<table>` (two
partitions) and its BEGIN / END to `P.<table>.transaction` with the publisher classes the
Spark sink uses (no Spark: the test is about the replicators). The oracles are the source
tables at the version each replica says it holds (tests/support/oracle.py), and the replicas' own
commit histories: every commit that records a position moves every partition's offset
forward from the one before, so no record range was applied twice.
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
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from lance_cdf.errors import LanceCdfError
from lance_cdf.replicate.table_shares import share_tables, topics_under
from tests.support.oracle import table_state

TABLES = 30  # tables of the database
PARTITIONS = 2  # partitions of each table's topic
MEMBER_TIMEOUT_S = 6  # --member-timeout (the broker's smallest session timeout)
CATCH_UP_S = 120  # longest wait for every replica to reach its source's version


# -- the assignment --------------------------------------------------------------------


def test_every_table_has_one_owner_and_the_shares_are_even():
    tables = [f"db.t{i:03d}" for i in range(103)]
    members = ["m-c", "m-a", "m-b", "m-d"]
    owners = share_tables(tables, members)
    assert sorted(owners) == sorted(tables)
    assert max(list(owners.values()).count(m) for m in members) == 26  # ceil(103 / 4)
    # the same answer whatever order either set comes in (every process computes it)
    assert share_tables(list(reversed(tables)), sorted(members)) == owners


def test_a_member_leaving_or_joining_moves_few_tables():
    tables = [f"db.t{i:03d}" for i in range(90)]
    three = share_tables(tables, ["a", "b", "c"])
    two = share_tables(tables, ["a", "c"])
    assert sorted(list(two.values()).count(m) for m in "ac") == [45, 45]
    # b's tables are shared out; of a's and c's, next to none moves
    stayed = [t for t in tables if three[t] != "b"]
    assert sum(two[t] != three[t] for t in stayed) <= 3
    # d joins: it gets its share, and (next to) only the tables it gets move
    four = share_tables(tables, ["a", "b", "c", "d"])
    assert max(list(four.values()).count(m) for m in "abcd") == 23  # ceil(90 / 4)
    moved = [t for t in tables if four[t] != three[t]]
    assert sum(four[t] != "d" for t in moved) <= 3
    # a table added moves (next to) no other
    more = share_tables([*tables, "db.new"], ["a", "b", "c"])
    assert sum(more[t] != three[t] for t in tables) <= 3


def test_no_members_no_owners_and_one_member_owns_all():
    assert share_tables(["x", "y"], []) == {}
    assert share_tables(["x", "y", "x"], ["only"]) == {"x": "only", "y": "only"}
    assert share_tables([], ["a", "b"]) == {}


def test_the_subscription_matches_the_prefix_topics_only():
    pattern = re.compile(topics_under("shop-1.a_b"))  # (librdkafka reads it as POSIX does)
    assert pattern.match("shop-1.a_b.sales.orders")
    assert pattern.match("shop-1.a_b.items.transaction")
    assert not pattern.match("shopx1.a_b.items")
    assert not pattern.match("shop-1.a_b")
    assert not pattern.match("shop-1xa_b.items")


# -- three processes, one killed, one added ----------------------------------------------


def table_rows(lo: int, hi: int, tag: str) -> pa.Table:
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": [f"{tag}{i}" for i in ids]})


class Source:
    """Lance tables (TABLES, or the qualified `names` given) and their topics, published
    version by version."""

    def __init__(self, root: str, prefix: str, kafka, registry, names: list[str] | None = None):
        self.root, self.prefix, self.kafka, self.registry = root, prefix, kafka, registry
        self.names = names or [f"t{i:02d}" for i in range(TABLES)]
        self.published = dict.fromkeys(self.names, 0)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        topics = [NewTopic(self.topic(n), PARTITIONS, 1) for n in self.names]
        topics += [NewTopic(f"{self.topic(n)}.transaction", 1, 1) for n in self.names]
        for f in admin.create_topics(topics).values():
            f.result(30)
        # (every partition led before the first write: a fresh topic's leader is elected
        # after create_topics returns)
        probe = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "probe"})
        try:
            for t in topics:
                for p in range(t.num_partitions):
                    wait_for(lambda t=t, p=p: led(probe, t.topic, p), 30, f"{t.topic} led")
        finally:
            probe.close()
        for n in self.names:
            lance.write_dataset(table_rows(0, 30, "a"), self.uri(n), enable_stable_row_ids=True)

    def uri(self, name: str) -> str:
        return os.path.join(self.root, f"{name}.lance")

    def topic(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def write(self, round_: int) -> None:
        """An append, an update and a delete in every table."""
        for n in self.names:
            ds = lance.dataset(self.uri(n))
            base = 1000 * (round_ + 1)
            ds = lance.write_dataset(
                table_rows(base, base + 10, f"r{round_}"), self.uri(n), mode="append"
            )
            ds.update({"s": f"'u{round_}'"}, where=f"id % 5 = {round_ % 5}")
            ds.delete(f"id % 7 = {round_ % 7}")

    def publish(self) -> None:
        """Every table's unpublished versions: records, then each version's BEGIN / END
        (as the Spark sink writes them)."""
        import lance_cdf
        from lance_cdf.core.feed import ChangeFeed
        from lance_cdf.core.stream_columns import PARTITION_COLUMN
        from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of
        from lance_cdf.kafka.transactions import TransactionWriter, VersionCounts

        bs, reg = self.kafka.bootstrap_servers, self.registry.url
        for n in self.names:
            uri, topic = self.uri(n), self.topic(n)
            start, end = self.published[n] + 1, lance.dataset(uri).version
            if start > end:
                continue
            feed = ChangeFeed(uri)
            events = lance_cdf.read_changes(uri, start, end).read_all()
            # routed as the Spark sink routes: a row's events to one partition, counted
            # per partition in its version's END
            rowids = events["_rowid"].to_numpy().astype(np.int64)
            events = events.append_column(
                PARTITION_COLUMN, pa.array((rowids % PARTITIONS).astype(np.int32))
            )
            ops = {v: feed.table.manifest(v).operation for v in range(start, end + 1)}
            pub = KafkaChangePublisher(bs, topic, reg, user_schema_of(events.schema), uri)
            pub.publish(events, ops)
            counts = {v: VersionCounts(v) for v in range(start, end + 1)}
            for v, c in pub.version_counts.items():
                counts[v] = c
            TransactionWriter(bs, f"{topic}.transaction", reg, uri).write(list(counts.values()))
            self.published[n] = end


def led(consumer: Consumer, topic: str, partition: int) -> bool:
    try:
        consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
    except KafkaException:
        return False
    return True


def replica_uri(dst: str, name: str) -> str:
    from lance_cdf.format.namespace import resolve_table

    return os.path.join(dst, f"{name}.lance") if "." not in name else resolve_table(dst, name)


def held_version(dst: str, name: str) -> int | None:
    from lance_cdf.replicate.replica import ReplicaTable, source_version_of

    try:
        uri = replica_uri(dst, name)
    except LanceCdfError:  # (a namespaced table not declared yet)
        return None
    if not os.path.isdir(uri):
        return None
    return source_version_of(ReplicaTable(replica_uri(dst, name), []).position())


def position_commits(uri: str) -> list[dict]:
    """The transaction properties of every replica commit that recorded a position."""
    ds = lance.dataset(uri)
    out = []
    for v in sorted(x["version"] for x in ds.versions()):
        try:
            tx = ds.read_transaction(v)
        except TypeError:  # pylance 14: a compaction of an indexed table (see replica.py)
            continue
        props = (tx.transaction_properties or {}) if tx is not None else {}
        if "lance-cdf.offsets" in props:
            out.append(dict(props))
    return out


def check_applied_once(dst: str, name: str, topic: str) -> None:
    """Each position-carrying commit after the first moves the position forward: a record
    range applied twice (two writers from one position) would record a position again."""
    before: dict[str, int] = {}
    version = 0
    for props in position_commits(replica_uri(dst, name)):
        offsets = json.loads(props["lance-cdf.offsets"])[topic]
        held = int(props.get("lance-cdf.source-version", 0))
        assert held >= version, (name, held, version)
        assert all(offsets.get(p, 0) >= o for p, o in before.items()), (name, before, offsets)
        assert offsets != before, (name, "a commit that did not move the position", offsets)
        before, version = offsets, held


def assert_replica_equals_source(src: str, dst: str, name: str, version: int) -> None:
    want = table_state(src, version)
    rows = lance.dataset(replica_uri(dst, name)).to_table().to_pylist()
    got = {r.pop("_source_rowid"): r for r in rows}
    assert len(got) == len(rows), f"{name}: duplicate keys"
    assert got.keys() == want.keys(), name
    diff = [k for k in want if {c: got[k].get(c) for c in want[k]} != want[k]]
    assert not diff, (name, diff[:3])


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def group_cmd(kafka, registry, dst: str, prefix: str, *extra: str) -> list[str]:
    """A database replicator of group `g-<prefix>`."""
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
        "--group-id",
        f"g-{prefix}",
        "--max-batch-interval",
        "0.3",
        "--refresh-interval",
        "2",
        "--member-timeout",
        str(MEMBER_TIMEOUT_S),
        *extra,
    ]


@pytest.mark.timeout(400)
def test_three_replicators_share_the_tables_one_killed_one_added(
    tmp_path, kafka_broker, schema_registry
):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    os.makedirs(src)
    prefix = f"so{uuid.uuid4().hex[:6]}"
    source = Source(src, prefix, kafka_broker, schema_registry)
    source.publish()
    cmd = group_cmd(kafka_broker, schema_registry, dst, prefix)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs: dict[str, subprocess.Popen] = {}
    logs = {name: tmp_path / f"replicate-{name}.log" for name in "abcd"}

    def start(name: str) -> None:
        with open(logs[name], "wb") as out:
            procs[name] = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def caught_up() -> bool:
        return all(held_version(dst, n) == source.published[n] for n in source.names)

    def took(name: str) -> int:
        return logs[name].read_text().count(" -> replica ")

    try:
        for name in "abc":
            start(name)
        wait_for(caught_up, CATCH_UP_S, "every replica")
        assert all(took(n) for n in "abc"), {n: took(n) for n in "abc"}
        # more versions; b is killed while they are being applied
        source.write(1)
        source.publish()
        os.killpg(procs["b"].pid, signal.SIGKILL)
        procs["b"].wait(30)
        source.write(2)
        source.publish()
        wait_for(caught_up, CATCH_UP_S, "b's tables taken up by a and c")
        # d joins: it is given a share, handed over by a and c
        start("d")
        source.write(3)
        source.publish()
        wait_for(lambda: took("d") > 0, CATCH_UP_S, "d given a share")
        source.write(4)
        source.publish()
        wait_for(caught_up, CATCH_UP_S, "every replica, d among the replicators")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        codes = {name: proc.wait(60) for name, proc in procs.items()}
    for name in "acd":
        assert codes[name] == 0, logs[name].read_text()[-3000:]
    assert "handed over to another replicator of the group" in (
        logs["a"].read_text() + logs["c"].read_text()
    )
    for n in source.names:
        assert_replica_equals_source(source.uri(n), dst, n, source.published[n])
        check_applied_once(dst, n, source.topic(n))


@pytest.mark.timeout(300)
def test_replicators_started_together_on_a_fresh_target_of_namespaced_tables(
    tmp_path, kafka_broker, schema_registry
):
    """Replicators of one group started in the same second on a database target that does
    not exist yet, whose tables are all in child namespaces: whichever table each takes up
    first, they declare the namespaces and tables together (the namespace manifest made
    once, a lost race asked again), none fails, and every replica equals its source.
    Several rounds, each on a fresh target: one replicator alone, then three."""
    src = str(tmp_path / "src")
    os.makedirs(src)
    prefix = f"ns{uuid.uuid4().hex[:6]}"
    names = [f"sales.t{i}" for i in range(3)] + [f"sales.eu.t{i}" for i in range(3)]
    source = Source(src, prefix, kafka_broker, schema_registry, names)
    source.publish()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for round_, count in enumerate([1, 3, 3]):
        dst = str(tmp_path / f"dst{round_}")
        cmd = group_cmd(kafka_broker, schema_registry, dst, f"{prefix}", "--idle-timeout", "5")
        cmd[cmd.index("--group-id") + 1] = f"g-{prefix}-{round_}"
        logs = [tmp_path / f"replicate-{round_}-{i}.log" for i in range(count)]
        procs = []
        for log in logs:
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
        codes = [proc.wait(240) for proc in procs]
        for code, log in zip(codes, logs, strict=True):
            text = log.read_text()
            assert code == 0, text[-3000:]
            assert "Traceback" not in text, text[-3000:]
        for n in names:
            assert held_version(dst, n) == source.published[n], (round_, n)
            assert_replica_equals_source(source.uri(n), dst, n, source.published[n])
        # the replica database is one LanceDB reads under the same names
        lancedb = pytest.importorskip("lancedb")
        db = lancedb.connect(dst)
        assert sorted(db.list_tables(namespace_path=["sales"]).tables) == ["t0", "t1", "t2"]
        assert sorted(db.list_tables(namespace_path=["sales", "eu"]).tables) == [
            "t0",
            "t1",
            "t2",
        ]
