"""Every version a publisher puts in the topic is completed (its END on the transaction
topic) before the publisher stops: what the head start publishes gets its BEGIN/END too,
so a publisher SIGKILLed inside its first micro-batch, restarted, and stopped before its
query commits leaves versions a whole-version replicator applies with no further
publisher run. Oracles: the source table (the replica equals it at its latest version)
and read_changes (each change once in the topic, per key in commit order)."""

import logging
import os
import signal
import subprocess
import sys
import time

import lance
import pytest
from confluent_kafka import Consumer, TopicPartition

from lance_cdf.replicate.replicator import Replicator
from lance_cdf.spark.source.handover import HOLD_ENV
from tests.kafka.test_kafka_order import consume_by_key, expected_by_key
from tests.replicate.test_whole_versions import new_topic, run_until_caught_up, status
from tests.spark.test_headstart import _history

pytestmark = pytest.mark.integration  # `lance-cdf publish` in subprocesses

# (s) how long a publisher may take to reach its held commit (Spark's start on a loaded
# machine included)
REACH_S = 240


def _wait_held(proc, marker, log):
    deadline = time.monotonic() + REACH_S
    while not marker.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the query's commit was never reached"
        time.sleep(0.1)


def _transaction_records(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return high - low
    finally:
        c.close()


def test_a_publisher_stopped_before_its_query_commits_leaves_whole_versions(
    tmp_path, kafka_broker, schema_registry, caplog
):
    src, dst = str(tmp_path / "src.lance"), str(tmp_path / "replica.lance")
    _history(src)  # versions 1-6
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap, "complete")
    hold, held = tmp_path / "hold", tmp_path / "hold.held"
    hold.touch()  # every query commit waits (before its END) while this exists
    want = expected_by_key(src)
    count = sum(len(v) for v in want.values())  # records, tombstones included
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, HOLD_ENV: f"commit:{hold}"}
    args = [
        *(sys.executable, "-m", "lance_cdf.cli", "publish", "--table", src),
        *("--bootstrap-servers", bootstrap, "--topic", topic),
        *("--schema-registry", schema_registry.url, "--checkpoint", str(tmp_path / "ck")),
        *("--starting-version", "1", "--key", "id", "--master", "local[2]"),
    ]
    # 1: no head start; SIGKILLed inside its first micro-batch: every record of versions
    # 1-6 in the topic, no END
    log1 = tmp_path / "publish1.log"
    with open(log1, "w") as out:
        first = subprocess.Popen(
            [*args, "--no-head-start"], env=env, stdout=out, stderr=out, start_new_session=True
        )
    try:
        _wait_held(first, held, log1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    assert not (tmp_path / "ck" / "commits" / "0").exists()
    assert _transaction_records(bootstrap, f"{topic}.transaction") == 0
    # a replicator meanwhile applies nothing, and says which versions wait for their END
    rep = Replicator(bootstrap, topic, schema_registry.url, dst, key=["id"], group_id=topic)
    with caplog.at_level(logging.WARNING, logger="lance_cdf.replicate"):
        counters = rep.run(idle_timeout=3)
    assert counters.batches == 0 and counters.unfinished_records == count
    said = [r.getMessage() for r in caplog.records if "without their END" in r.getMessage()]
    assert len(said) == 1 and f"{count} record(s) of source version(s) 1-6" in said[0]
    report, text = status(src, dst)
    assert report["replica_unfinished"]["records"] == count
    assert (report["replica_unfinished"]["first"], report["replica_unfinished"]["last"]) == (1, 6)
    assert "run `lance-cdf publish`" in text
    held.unlink()
    # 2: restarted: the head start republishes versions 1-6 (skipping what the topic holds)
    # and completes them before the query starts; the query's replay of the micro-batch
    # is held before its commit: the versions are complete without it
    log2 = tmp_path / "publish2.log"
    with open(log2, "w") as out:
        second = subprocess.Popen(
            [*args, "--stop-timeout", "1"],
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    try:
        _wait_held(second, held, log2)
        text = log2.read_text()
        assert "of version(s) 1-6 published with their transaction metadata" in text, text
        assert _transaction_records(bootstrap, f"{topic}.transaction") == 12  # BEGIN, END each
        # SIGTERM: the held micro-batch is waited for (--stop-timeout 1), then interrupted
        second.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while "did not finish within 1 s" not in log2.read_text():
            assert time.monotonic() < deadline and second.poll() is None, log2.read_text()
            time.sleep(0.1)
        hold.unlink()  # (a commit blocked in its Python runner would hold the stop up)
        assert second.wait(120) == 0, log2.read_text()[-3000:]
    finally:
        hold.unlink(missing_ok=True)
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    # the query's commit, if it ran, skipped what the head start wrote: each once
    assert _transaction_records(bootstrap, f"{topic}.transaction") == 12
    # each change once in the topic, per key in commit order
    got, _ = consume_by_key(bootstrap, topic, schema_registry.url, count + 1)
    assert got == want
    # a whole-version replicator, no publisher running: the source's latest version
    latest = lance.dataset(src).version
    rep = Replicator(bootstrap, topic, schema_registry.url, dst, key=["id"], group_id=topic)
    run_until_caught_up(rep, latest, dst)
    source = lance.dataset(src).to_table(columns=["id", "s"]).sort_by("id")
    replica = lance.dataset(dst).to_table(columns=["id", "s"]).sort_by("id")
    assert replica.to_pylist() == source.to_pylist()
    report, _ = status(src, dst)
    assert report["replica_version"] == latest
    assert report["replica_unfinished"] is None


def test_sigterm_lets_the_running_micro_batch_write_its_end(
    tmp_path, kafka_broker, schema_registry
):
    src = str(tmp_path / "src.lance")
    _history(src)  # versions 1-6
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap, "sigterm")
    hold, held = tmp_path / "hold", tmp_path / "hold.held"
    hold.touch()  # the writer tasks wait, their records acknowledged, while this exists
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, HOLD_ENV: f"write:{hold}"}
    args = [
        *(sys.executable, "-m", "lance_cdf.cli", "publish", "--table", src),
        *("--bootstrap-servers", bootstrap, "--topic", topic),
        *("--schema-registry", schema_registry.url, "--checkpoint", str(tmp_path / "ck")),
        *("--starting-version", "1", "--key", "id", "--master", "local[2]"),
        "--no-head-start",  # (the head start would be held too: it runs the writer's code)
    ]
    log = tmp_path / "publish.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=out, start_new_session=True)
    try:
        _wait_held(proc, held, log)
        proc.send_signal(signal.SIGTERM)  # inside the first micro-batch's writer tasks
        time.sleep(1)  # the stop waits for the held batch, however long it takes
        assert proc.poll() is None, log.read_text()[-3000:]
        hold.unlink()
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "did not finish" not in log.read_text()
    assert (tmp_path / "ck" / "commits" / "0").exists()  # the micro-batch committed
    assert _transaction_records(bootstrap, f"{topic}.transaction") == 12  # BEGIN, END each
    want = expected_by_key(src)
    count = sum(len(v) for v in want.values())
    got, _ = consume_by_key(bootstrap, topic, schema_registry.url, count + 1)
    assert got == want
