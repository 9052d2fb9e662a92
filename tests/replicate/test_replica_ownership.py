"""Who owns a replica, the replicator's side: a replica knows whose it is (topic, source
table), is never filled from the middle of a topic (a deleted replica is refused, `--rebuild`
builds it from the beginning; a topic that lost its history is refused), has one writer
at a time (a lease, taken over from a dead or stalled holder), stops on a missing topic
at --idle-timeout, and exits 0 on SIGTERM / SIGINT to its process group. Against the
real broker and registry; every replica compared with its source."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import lance
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from lance_cdf.errors import ForeignReplicaError, LeaseHeldError
from lance_cdf.replicate.replica import (
    SOURCE_ROWID,
    SOURCE_TABLE_PROPERTY,
    TOPIC_PROPERTY,
    ReplicaTable,
)
from lance_cdf.replicate.replicator import Replicator
from tests.replicate.test_replicate import (
    assert_replica_equals_source,
    publish,
    registry_down,
    source_rows,
)
from tests.support.workload import Workload

pytestmark = pytest.mark.integration  # `lance-cdf replicate` in subprocesses
pytest_plugins = ["tests.support.s3_services"]


def cli(kafka, registry, topic, dst, *extra, group=None):
    return [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "replicate",
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--topic",
        topic,
        "--schema-registry",
        registry.url,
        "--target",
        dst,
        "--group-id",
        group or f"g-{topic}",
        "--max-batch-interval",
        "0.3",
        *extra,
    ]


def run_cli(cmd, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def replicator(kafka, registry, topic, dst, group=None, **kw):
    kw.setdefault("max_batch_interval", 0.3)
    return Replicator(
        kafka.bootstrap_servers, topic, registry.url, dst, group_id=group or f"g-{topic}", **kw
    )


def source(tmp_path, name, seed, rows=120):
    uri = str(tmp_path / f"{name}.lance")
    w = Workload(uri, seed=seed, rows=rows)
    for op in ("update", "delete_sparse", "append"):
        w.step(op)
    return uri, w


def test_a_replica_refuses_another_topic_and_another_source(
    tmp_path, kafka_broker, schema_registry
):
    a, _ = source(tmp_path, "a", seed=1)
    b, _ = source(tmp_path, "b", seed=2)
    dst = str(tmp_path / "replica.lance")
    ta, tb = f"own-a-{uuid.uuid4().hex[:8]}", f"own-b-{uuid.uuid4().hex[:8]}"
    publish(kafka_broker, schema_registry, a, ta, 1)
    publish(kafka_broker, schema_registry, b, tb, 1)
    replicator(kafka_broker, schema_registry, ta, dst).run(idle_timeout=2)
    assert_replica_equals_source(a, dst)
    position = ReplicaTable(dst, [SOURCE_ROWID]).position()
    assert position[TOPIC_PROPERTY] == ta
    assert json.loads(position[SOURCE_TABLE_PROPERTY]) == {"table": "lancecdf.a", "uri": a}

    # another topic into it: refused before anything is applied
    run = run_cli(cli(kafka_broker, schema_registry, tb, dst, "--idle-timeout", "2"))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == (
        f"lance-cdf: error: the replica {dst} follows topic {ta!r}, not {tb!r}: a replica "
        f"follows one topic. Replicate {tb!r} into a new --target."
    )
    assert "Traceback" not in run.stderr

    # another table's records in its own topic: refused, nothing of the batch applied
    before = lance.dataset(dst).version
    publish(kafka_broker, schema_registry, b, ta, 1)
    rep = replicator(kafka_broker, schema_registry, ta, dst)
    with pytest.raises(ForeignReplicaError) as caught:
        rep.run(idle_timeout=2)
    assert str(caught.value).startswith("the record at partition 0 offset ")
    assert str(caught.value).endswith(
        f"of {ta!r} comes from source table lancecdf.b at {b}, but the replica {dst} follows "
        f"lancecdf.a at {a}: a replica follows one table. Nothing of the batch was applied; "
        "publish each table into a topic of its own and replicate it into its own --target."
    )
    assert lance.dataset(dst).version == before
    assert_replica_equals_source(a, dst)


def _consumed(kafka, group, topic) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, 0)], timeout=10)
        return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
    finally:
        c.close()


def test_a_deleted_replica_is_refused_then_rebuilt_and_its_own_position_wins(
    tmp_path, kafka_broker, schema_registry
):
    src, w = source(tmp_path, "src", seed=3)
    dst = str(tmp_path / "replica.lance")
    topic = f"own-del-{uuid.uuid4().hex[:8]}"
    published = publish(kafka_broker, schema_registry, src, topic, 1)
    cmd = cli(kafka_broker, schema_registry, topic, dst, "--idle-timeout", "2")
    assert run_cli(cmd).returncode == 0
    assert_replica_equals_source(src, dst)
    consumed = _consumed(kafka_broker, f"g-{topic}", topic)[0]

    shutil.rmtree(dst)  # the operator's mistake: the same command again must not resume
    run = run_cli(cmd)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        f"lance-cdf: error: the replica {dst} does not exist, but consumer group "
        f"'g-{topic}' has consumed {consumed} records of {topic!r}: the replica was "
        "deleted or replaced, and resuming from the group's offsets would fill it from the "
        "middle. To build it again from the beginning of the topic, run the same command "
        "with --rebuild."
    )
    assert not os.path.exists(os.path.join(dst, "_versions"))  # nothing applied

    run = run_cli(cmd + ["--rebuild"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert_replica_equals_source(src, dst)

    # the group's committed offsets ahead of the replica (another consumer of the group
    # committed the end): the replica's own position decides where it resumes
    w.step("update")
    w.step("delete_sparse")
    publish(kafka_broker, schema_registry, src, topic, published + 1)
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": f"g-{topic}"})
    _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    # (the replicator, a static member, stays in its group for its session timeout after
    # it stopped: the group takes another's commit once it has left)
    deadline = time.monotonic() + 60
    while True:
        try:
            c.commit(offsets=[TopicPartition(topic, 0, high)], asynchronous=False)
            break
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.UNKNOWN_MEMBER_ID, exc
            assert time.monotonic() < deadline, "the replicator never left its group"
            time.sleep(0.5)
    c.close()
    assert run_cli(cmd).returncode == 0
    assert_replica_equals_source(src, dst)


def test_a_topic_that_lost_its_history_is_refused(tmp_path, kafka_broker, schema_registry):
    src, _ = source(tmp_path, "src", seed=4)
    topic = f"own-lost-{uuid.uuid4().hex[:8]}"
    publish(kafka_broker, schema_registry, src, topic, 1)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    # the records before offset 5 deleted, as retention would
    futures = admin.delete_records([TopicPartition(topic, 0, 5)], request_timeout=10)
    for f in futures.values():
        f.result(timeout=10)
    dst = str(tmp_path / "replica.lance")
    for extra in ((), ("--rebuild",)):
        run = run_cli(cli(kafka_broker, schema_registry, topic, dst, "--idle-timeout", "2", *extra))
        assert run.returncode == 2, run.stderr[-2000:]
        assert "cannot read the configuration" not in run.stderr, run.stderr[-3000:]
        assert run.stderr.strip().splitlines()[-1] == (
            f"lance-cdf: error: the replica {dst} cannot be built from topic {topic!r}: its "
            "partition 0 now starts at offset 5 (cleanup.policy=delete: older records "
            "deleted) and the replica holds nothing of it, so it would lack changes. Publish "
            "the source into a new topic from a snapshot (lance-cdf publish --snapshot) and "
            "replicate that into a new --target."
        )
        assert not os.path.exists(dst)


def _wait(predicate, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not seen in {timeout} s"
        time.sleep(0.1)


def _holds_everything(src, dst):
    def check():
        try:
            assert_replica_equals_source(src, dst)
            return True
        except (AssertionError, ValueError, OSError):
            return False

    return check


def test_two_replicators_on_one_replica_the_second_is_refused(
    tmp_path, kafka_broker, schema_registry
):
    """A second replicator (another group) is refused before it applies anything, naming
    the holder; a SIGKILLed holder of this machine is taken over at once; a holder that
    stopped renewing (SIGSTOP: as a hung process, or one on another machine) after its
    lease's TTL, and it then stops with LeaseLostError, applying nothing more."""
    src, w = source(tmp_path, "src", seed=5)
    dst = str(tmp_path / "replica.lance")
    topic = f"own-two-{uuid.uuid4().hex[:8]}"
    published = publish(kafka_broker, schema_registry, src, topic, 1)
    first = subprocess.Popen(
        cli(kafka_broker, schema_registry, topic, dst, "--lease-ttl", "2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(_holds_everything(src, dst), "the first replicator's replica")
        version = lance.dataset(dst).version
        run = run_cli(
            cli(
                kafka_broker,
                schema_registry,
                topic,
                dst,
                "--idle-timeout",
                "2",
                group="another-group",
            )
        )
        assert run.returncode == 2
        line = run.stderr.strip().splitlines()[-1]
        assert line.startswith(
            f"lance-cdf: error: the replica {dst} is being written by 'lance-cdf replicate "
            f"--topic {topic} --group-id g-{topic}' (pid {first.pid} on "
        ), line
        assert line.endswith(
            "one writer at a time. Stop that process first (its lease "
            f"{dst}/_lance_cdf/replica.lease expires 2 s after its last renewal if it died, "
            "and is then taken over)."
        ), line
        assert lance.dataset(dst).version == version  # the second applied nothing

        # the holder stalls (SIGSTOP): refused until its TTL has run out, then taken over
        os.kill(first.pid, signal.SIGSTOP)
        w.step("update")
        published = publish(kafka_broker, schema_registry, src, topic, published + 1)
        with pytest.raises(LeaseHeldError):
            replicator(kafka_broker, schema_registry, topic, dst, "third").run(idle_timeout=2)
        time.sleep(2.5)
        third = replicator(kafka_broker, schema_registry, topic, dst, "third", lease_ttl_s=2)
        third.run(idle_timeout=2)
        assert_replica_equals_source(src, dst)
        version = lance.dataset(dst).version
        # the stalled holder comes back: it has lost the lease and stops, applying nothing
        w.step("delete_sparse")
        published = publish(kafka_broker, schema_registry, src, topic, published + 1)
        os.kill(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=120)
        assert first.returncode == 2, err[-2000:]
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith(
                f"lance-cdf: error: lost the lease on the replica {dst} ({dst}/_lance_cdf/"
                "replica.lease): another writer took it over after this one did not renew it "
                "for 2 s (free now). Stopped without writing further"
            )
        )
        assert lance.dataset(dst).version == version
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait()

    # a holder SIGKILLed mid-work: the next one takes over at once and finishes exactly
    holder = subprocess.Popen(
        cli(kafka_broker, schema_registry, topic, dst),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait(lambda: os.path.exists(f"{dst}/_lance_cdf/replica.lease"), "the lease")
    holder.kill()
    holder.wait()
    run = run_cli(cli(kafka_broker, schema_registry, topic, dst, "--idle-timeout", "2"))
    assert run.returncode == 0, run.stderr[-2000:]
    assert (
        f"took over the lease {dst}/_lance_cdf/replica.lease from 'lance-cdf replicate"
        in run.stderr
        and f"its process {holder.pid} is gone" in run.stderr
    )
    assert_replica_equals_source(src, dst)
    assert not os.path.exists(f"{dst}/_lance_cdf/replica.lease")  # released at exit


def test_the_lease_on_an_s3_replica(tmp_path, kafka_broker, schema_registry, s3_server, s3_uri):
    src, _ = source(tmp_path, "src", seed=6)
    topic = f"own-s3-{uuid.uuid4().hex[:8]}"
    publish(kafka_broker, schema_registry, src, topic, 1)
    options = s3_server.storage_options()
    first = replicator(kafka_broker, schema_registry, topic, s3_uri, storage_options=options)
    done = []
    runner = threading.Thread(target=lambda: done.append(first.run()))
    runner.start()
    try:
        expected = source_rows(src)

        def applied():
            try:
                return lance.dataset(s3_uri, storage_options=options).count_rows() == len(expected)
            except (ValueError, OSError):
                return False

        _wait(applied, "the S3 replica")
        second = replicator(
            kafka_broker, schema_registry, topic, s3_uri, "another-group", storage_options=options
        )
        with pytest.raises(
            LeaseHeldError,
            match=r"^the replica s3://.* is being written by "
            r"'lance-cdf replicate --topic .* --group-id g-own-s3-",
        ):
            second.run(idle_timeout=2)
    finally:
        first.stop()
        runner.join(120)
    assert done
    rows = lance.dataset(s3_uri, storage_options=options).to_table().to_pylist()
    assert sorted(r[SOURCE_ROWID] for r in rows) == sorted(expected)
    # released: the next one gets it
    again = replicator(kafka_broker, schema_registry, topic, s3_uri, storage_options=options)
    assert again.run(idle_timeout=2).upserts == 0


def test_idle_timeout_counts_from_start_when_the_topic_does_not_exist(
    tmp_path, kafka_broker, schema_registry
):
    topic = f"own-missing-{uuid.uuid4().hex[:8]}"
    dst = str(tmp_path / "replica.lance")
    run = run_cli(
        cli(kafka_broker, schema_registry, topic, dst, "--idle-timeout", "2"), timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert (
        f"topic {topic!r} does not exist yet; waiting for it (--idle-timeout, if given, "
        "counts from start)" in run.stderr
    )
    assert f"topic {topic!r} still does not exist" in run.stderr
    assert "--idle-timeout reached, stopping (nothing applied)" in run.stderr
    assert not os.path.exists(os.path.join(dst, "_versions"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_process_group_exits_0_without_traceback(
    tmp_path, kafka_broker, schema_registry, sig
):
    src, _ = source(tmp_path, "src", seed=7)
    dst = str(tmp_path / "replica.lance")
    topic = f"own-sig-{uuid.uuid4().hex[:8]}"
    publish(kafka_broker, schema_registry, src, topic, 1)
    proc = subprocess.Popen(
        cli(kafka_broker, schema_registry, topic, dst, "--max-batch-rows", "40"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait(lambda: os.path.exists(os.path.join(dst, "_versions")), "the first batch")
        os.killpg(proc.pid, sig)  # as systemd's stop / Ctrl-C in a terminal do
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "stopped:" in out
    run = run_cli(cli(kafka_broker, schema_registry, topic, dst, "--idle-timeout", "2"))
    assert run.returncode == 0, run.stderr[-2000:]
    assert_replica_equals_source(src, dst)


def _connected_to(pid: int, port: int) -> bool:
    """Whether process `pid` holds an established TCP connection to 127.0.0.1:`port`."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    with open(f"/proc/{pid}/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(r[2] == f"0100007F:{port:04X}" and r[3] == "01" and r[9] in inodes for r in rows)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_starting_exits_0_without_traceback(
    tmp_path, kafka_broker, schema_registry, sig
):
    """Stopped while its start-up check waits on a hung registry (SIGSTOPped): exit 0,
    one line, nothing applied."""
    dst = str(tmp_path / "replica.lance")
    port = int(schema_registry.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    with registry_down(schema_registry):
        proc = subprocess.Popen(
            cli(kafka_broker, schema_registry, "own-start", dst),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _wait(lambda: _connected_to(proc.pid, port), "the registry check")
            os.killpg(proc.pid, sig)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and out.strip() == "stopped while starting: nothing applied"
    assert not os.path.exists(dst)
