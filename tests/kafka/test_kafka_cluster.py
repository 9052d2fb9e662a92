"""Publish and replicate on a three-broker cluster (replication factor 3,
`min.insync.replicas=2`) whose brokers are SIGKILLed while records flow: a partition
leader mid-publish, the broker the micro-batch commit writes to, the replicator's group
coordinator, one broker down for a while. Afterwards a read_committed consumer finds every
change once, per key in commit order (read_changes is the oracle), and the replica equals
the source table."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from lance_cdf.cli import main
from lance_cdf.replicate.replica import SOURCE_ROWID, ReplicaTable
from lance_cdf_devtools.connect import KafkaConnect
from tests.kafka.test_debezium import postgres, sink_follows_changes  # noqa: F401 (a fixture)
from tests.kafka.test_exactly_once import killable_publish, publish_killed_and_check, writer
from tests.kafka.test_kafka_order import consume_by_key, expected_by_key
from tests.replicate.test_replicate import (
    _replicate_cmd,
    assert_replica_equals_source,
    publish,
    run_to_the_end_and_compare,
)
from tests.replicate.test_whole_versions import replicate_killed_and_check
from tests.support.workload import Workload

PARTITIONS = 3
# how long a broker stays down in the "one broker down" test; outside runs: 120 s
BROKER_DOWN_S = float(os.environ.get("LANCE_CDF_TEST_BROKER_DOWN_S", "15"))
# how long a stage waits for records (or replica commits) to move on after a fault
PROGRESS_S = 90.0
# publish's --flush-timeout here: a leader election (the broker session timeout) outlasts
# it, so the failover is an outage the writer tasks ride out and record
FLUSH_TIMEOUT = "2s"


class Flow:
    """A table with a writer committing to it, `lance-cdf publish` (continuous) into a
    new topic and `lance-cdf replicate` (continuous) out of it, all on `cluster`."""

    def __init__(self, tmp_path, cluster, registry):
        self.cluster, self.registry = cluster, registry
        self.uri = str(tmp_path / "t.lance")
        self.replica = str(tmp_path / "replica.lance")
        self.checkpoint = str(tmp_path / "ck")
        self.topic = f"cl-{uuid.uuid4().hex[:8]}"
        self.logs = tmp_path
        lance.write_dataset(
            pa.table({"id": np.arange(200), "s": ["a"] * 200}),
            self.uri,
            enable_stable_row_ids=True,
            max_rows_per_file=50,
        )
        self.args = [
            "publish",
            "--table",
            self.uri,
            "--bootstrap-servers",
            cluster.bootstrap_servers,
            "--topic",
            self.topic,
            "--schema-registry",
            registry.url,
            "--checkpoint",
            self.checkpoint,
            "--starting-version",
            "1",
            "--key",
            "id",
            "--partitions",
            str(PARTITIONS),
            "--max-rows-per-trigger",
            "60",
            "--flush-timeout",
            FLUSH_TIMEOUT,
        ]
        self.replicate = _replicate_cmd(cluster, registry, self.topic, self.replica, "--key", "id")
        self.stop = threading.Event()
        # commits until `finish()` stops it (at most 1,000: the bound only guards a hang)
        self.writer = threading.Thread(target=writer, args=(self.uri, self.stop, 1000), daemon=True)
        self.procs: dict[str, subprocess.Popen] = {}

    def _spawn(self, name, cmd):
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=log, start_new_session=True
            )

    def start(self):
        self.writer.start()
        self._spawn("publish", killable_publish(self.args))
        self.wait_records(0, "the first records")  # the topic exists now
        self._spawn("replicate", self.replicate)
        self.wait_applied(0, "the replica's first commit")

    def alive(self):
        for name, proc in self.procs.items():
            log = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"{name} exited ({proc.returncode}):\n{log}"

    def records(self, topic=None):
        """The records `topic` (default: the change topic) holds: its end offsets' sum
        (asked again while a partition has no leader)."""
        topic = topic or self.topic
        config = {"bootstrap.servers": self.cluster.bootstrap_servers, "group.id": "probe"}
        deadline = time.monotonic() + PROGRESS_S
        while True:
            c = Consumer({**config, "log_level": 0})
            try:
                parts = c.list_topics(topic, timeout=10).topics[topic].partitions
                return sum(
                    c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts
                )
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
            finally:
                c.close()

    def applied(self):
        """The records the replica holds, by the position it recorded."""
        try:
            return sum(ReplicaTable(self.replica, ["id"]).applied_offsets(self.topic).values())
        except (OSError, ValueError):
            return 0

    def _wait(self, probe, past, what):
        deadline = time.monotonic() + PROGRESS_S
        while (now := probe()) <= past:
            self.alive()
            if time.monotonic() > deadline:
                pytest.fail(f"no progress past {past} in {PROGRESS_S} s: {what}\n{self.stacks()}")
            time.sleep(0.3)
        return now

    def stacks(self):
        """Where each process waits: the Python stacks `lance-cdf` prints on SIGUSR2, with
        the end of its log."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGUSR2)
        time.sleep(2)
        return "\n".join(
            f"--- {name}.log:\n{(self.logs / f'{name}.log').read_text(errors='replace')[-12000:]}"
            for name in self.procs
        )

    def wait_records(self, past, what, topic=None):
        return self._wait(lambda: self.records(topic), past, what)

    def wait_applied(self, past, what):
        return self._wait(self.applied, past, what)

    def finish(self):
        """Stop the writer; let publish and replicate run to the end undisturbed; check
        the topic and the replica against the source."""
        self.stop.set()
        self.writer.join(120)
        self.alive()
        for name in ("publish", "replicate"):
            proc = self.procs.pop(name)
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        assert main([*self.args, "--available-now"]) == 0  # the rest, from the checkpoint
        want = expected_by_key(self.uri)
        count = sum(len(v) for v in want.values())
        got, _ = consume_by_key(
            self.cluster.bootstrap_servers,
            self.topic,
            self.registry.url,
            count + 1,
            isolation="read_committed",
        )
        assert got == want  # every change once, per key in commit order
        run = subprocess.run(
            [*self.replicate, "--idle-timeout", "3"], capture_output=True, timeout=300
        )
        assert run.returncode == 0, run.stderr.decode()[-2000:]
        assert_replica_equals_source(self.uri, self.replica, key="id")

    def close(self):
        self.stop.set()
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


def _or_zero(probe):
    try:
        return probe()
    except (KafkaException, KeyError, TimeoutError):
        return 0


@pytest.fixture
def flow(tmp_path, kafka_cluster, schema_registry):
    f = Flow(tmp_path, kafka_cluster, schema_registry)
    yield f
    f.close()
    for node in kafka_cluster.nodes:  # the next test starts with all three brokers
        if not kafka_cluster.nodes[node].running():
            kafka_cluster.restart(node)


def kafka_status(flow):
    """`lance-cdf status --json`'s "kafka" part: the outages the publisher recorded."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf.cli",
            "status",
            "--table",
            flow.uri,
            "--checkpoint",
            flow.checkpoint,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout).get("kafka") or {}


def test_leader_and_commit_broker_killed_mid_publish(flow, kafka_cluster):
    """The change topic's partition leader SIGKILLed mid-publish and restarted; then the
    broker leading the transaction topic (what each micro-batch's commit writes) SIGKILLed
    just as a commit wrote there, and restarted."""
    cluster = kafka_cluster
    flow.start()
    parts = cluster.partitions(flow.topic)
    assert len(parts) == PARTITIONS and all(len(p.replicas) == 3 for p in parts.values())
    txn = f"{flow.topic}.transaction"
    assert len(cluster.partitions(txn)[0].replicas) == 3  # the broker's default, too

    leader = cluster.leader(flow.topic, 0)
    before = flow.records()
    cluster.kill(leader)
    flow.wait_records(before, f"publishing after node {leader} (a leader) was killed")
    cluster.restart(leader)
    cluster.wait_in_sync(flow.topic)

    committer = cluster.leader(txn, 0)
    marks = flow.records(txn)
    flow.wait_records(marks, "a micro-batch commit", topic=txn)
    cluster.kill(committer)  # a commit just wrote; the next ones meet a dead leader
    marks = flow.records(txn)
    flow.wait_records(marks, f"commits after node {committer} was killed", topic=txn)
    applied = flow.applied()
    flow.wait_applied(applied, "replicating after the commit broker was killed")
    cluster.restart(committer)

    flow.finish()
    kafka = kafka_status(flow)
    assert kafka.get("outages", 0) >= 1 and not kafka["unavailable_since"], kafka


def test_one_broker_down_for_a_while(flow, kafka_cluster):
    """A broker (not the replicator's group coordinator: the next test kills that) SIGKILLed and
    kept down for BROKER_DOWN_S while publishing and replicating go on with two replicas
    in sync; then it comes back and catches up."""
    cluster = kafka_cluster
    flow.start()
    coordinator = cluster.group_coordinator(f"g-{flow.topic}")  # _replicate_cmd's group
    down = next(n for n in cluster.nodes if n != coordinator)
    cluster.kill(down)
    deadline = time.monotonic() + BROKER_DOWN_S
    records, applied = flow.records(), flow.applied()
    while time.monotonic() < deadline:
        records = flow.wait_records(records, f"publishing with node {down} down")
        applied = flow.wait_applied(applied, f"replicating with node {down} down")
    isrs = {len(p.isrs) for p in cluster.partitions(flow.topic).values()}
    assert isrs == {2}  # the dead broker's replicas left the in-sync sets
    cluster.restart(down)
    cluster.wait_in_sync(flow.topic)
    flow.wait_records(flow.records(), "publishing with all three back")
    flow.finish()


@pytest.mark.parametrize("membership", ["dynamic", "static"])
def test_the_replicators_group_coordinator_killed(
    tmp_path, kafka_cluster, schema_registry, membership
):
    """The broker coordinating the replicator's consumer group SIGKILLed: the group moves
    to another broker and the replicator goes on applying what is published meanwhile
    (published here without Spark: the publisher the sink's writer tasks use). With static
    membership (group.instance.id) the rejoin may be fenced (FENCED_INSTANCE_ID, fatal in
    librdkafka): the replicator then renews its consumer and goes on all the same."""
    cluster, registry = kafka_cluster, schema_registry
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    topic = f"cl-group-{uuid.uuid4().hex[:8]}"
    w = Workload(src, seed=11, rows=200)
    last = publish(cluster, registry, src, topic, 1)
    replica = ReplicaTable(dst, [SOURCE_ROWID])

    def applied():
        try:
            return sum(replica.applied_offsets(topic).values())
        except (OSError, ValueError):
            return 0

    # static: lance-cdf's default (a member keyed to the replica); dynamic: given an empty
    # group.instance.id
    cmd = _replicate_cmd(cluster, registry, topic, dst)
    if membership == "dynamic":
        cmd = [*cmd, "--consumer-config", "group.instance.id="]
    with open(tmp_path / "replicate.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    try:
        _wait_for(applied, 0, proc, "the replica's first commit")
        coordinator = cluster.group_coordinator(f"g-{topic}")
        cluster.kill(coordinator)
        for op in ("update", "delete_sparse", "upsert"):
            w.step(op)
        before = applied()
        last = publish(cluster, registry, src, topic, last + 1)
        _wait_for(applied, before, proc, f"replicating after node {coordinator} was killed")
        assert cluster.group_coordinator(f"g-{topic}") != coordinator
        cluster.restart(coordinator)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        if not cluster.nodes[coordinator].running():
            cluster.restart(coordinator)
    run_to_the_end_and_compare([*cmd, "--idle-timeout", "3"], src, dst)


def _wait_for(probe, past, proc, what):
    deadline = time.monotonic() + PROGRESS_S
    while probe() <= past:
        assert proc.poll() is None, f"replicate exited ({proc.returncode}): {what}"
        assert time.monotonic() < deadline, f"no progress past {past} in {PROGRESS_S} s: {what}"
        time.sleep(0.3)


def test_killed_publisher_and_killed_leader_deliver_each_change_once(
    tmp_path, kafka_cluster, schema_registry
):
    """test_exactly_once's publisher SIGKILLs (its process group, its Python workers) on
    the cluster, replication factor 3: midway the leader of the topic's partition 0 is
    SIGKILLed too and stays down for the remaining kills (two replicas in sync, enough
    for min.insync.replicas=2), then comes back before the run to the end."""
    cluster, killed = kafka_cluster, []

    def kill_leader(topic):
        if not killed:  # (asked again while a kill round kills nothing)
            killed.append(cluster.leader(topic, 0))
            cluster.kill(killed[-1])

    def restart(topic):
        for node in killed:
            cluster.restart(node)
        cluster.wait_in_sync(topic)

    try:
        publish_killed_and_check(
            tmp_path,
            cluster,
            schema_registry,
            replication=3,
            kills_total=8,
            fault_at=3,
            fault=kill_leader,
            after=restart,
        )
    finally:
        for node in cluster.nodes:
            if not cluster.nodes[node].running():
                cluster.restart(node)
    assert len(killed) == 1 and killed[0] > 0


def test_whole_version_replica_under_replicator_kills(tmp_path, kafka_cluster, schema_registry):
    """test_whole_versions' replicator SIGKILLs (static membership: each restart takes the
    partitions over at once) on the cluster, replication factor 3: every replica commit
    that records a source version equals the source at it."""
    replicate_killed_and_check(
        tmp_path, kafka_cluster, schema_registry, replication=3, kills_at_least=3
    )


@pytest.fixture(scope="module")
def cluster_connect(kafka_cluster, tmp_path_factory):
    """A Kafka Connect standalone worker whose clients bootstrap from the whole cluster."""
    worker = KafkaConnect(kafka_cluster.bootstrap_servers, tmp_path_factory.mktemp("connect"))
    worker.start()
    yield worker
    worker.close()


@pytest.mark.timeout(600)
def test_debezium_jdbc_sink_reads_the_cluster_through_a_leader_kill(
    tmp_path,
    kafka_cluster,
    schema_registry,
    cluster_connect,
    postgres,  # noqa: F811
):
    """test_debezium's JDBC sink reading topics of replication factor 3; between its two
    rounds of changes the leader of the `_rowid` topic is SIGKILLed and stays down while
    the second round is published and sunk: PostgreSQL equals the Lance table after each."""
    cluster, killed = kafka_cluster, []

    def kill_leader(topics):
        assert all(len(p.replicas) == 3 for p in cluster.partitions(topics[0]).values())
        killed.append(cluster.leader(topics[0], 0))
        cluster.kill(killed[-1])

    try:
        sink_follows_changes(
            str(tmp_path / "items.lance"),
            np.random.default_rng(17),
            cluster,
            schema_registry,
            cluster_connect,
            postgres,
            fault=kill_leader,
        )
    finally:
        for node in killed:
            cluster.restart(node)
    assert killed


def test_the_coordinator_hash_is_kafkas():
    """The transaction coordinator lookup's partition hash: Java's String.hashCode (known
    values), then Kafka's Utils.abs (Integer.MIN_VALUE gives 0)."""
    from lance_cdf_devtools.kafkacluster import _java_hash_abs

    assert _java_hash_abs("hello") == 99162322
    assert _java_hash_abs("polygenelubricants") == 0  # hashCode() == Integer.MIN_VALUE
    assert _java_hash_abs("Aa") == _java_hash_abs("BB") == 2112
