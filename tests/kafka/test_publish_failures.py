"""`lance-cdf publish` against the real broker when things fail: a stop shows one
line that names only publish's own flags (the whole text goes to the log file), and a broker
outage several times longer than publish's flush timeout is ridden out with the topic exact
afterwards."""

import os
import signal
import subprocess
import threading
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
from confluent_kafka.admin import AdminClient, NewTopic

from lance_cdf.kafka.outage import read_state
from lance_cdf.spark.source.checkpoint import checkpoint_version
from tests.kafka.test_kafka_order import consume_by_key, expected_by_key
from tests.support.publish_process import publish_args, start_cli

PARTITIONS = 2
# the outage test's publish waits this long for acknowledgements (--flush-timeout) before
# the broker counts as not answering, and the broker stays frozen for FREEZE_S: six such
# timeouts, twice librdkafka's request.timeout.ms, well inside the ride-out budget
FLUSH_TIMEOUT_S = 10
FREEZE_S = 60


def _cli(*args, **kw):
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return start_cli(args, text=True, **kw)


def _args(uri, ck, topic, kafka_broker, schema_registry, *extra):
    bootstrap, registry = kafka_broker.bootstrap_servers, schema_registry.url
    return publish_args(uri, bootstrap, topic, registry, ck, "--key", "id", *extra)


def _topic(kafka_broker):
    topic = f"fail-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    return topic


def _run(args, timeout=300):
    proc = _cli(*args)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


def _manifest(uri, version):
    return os.path.join(uri, "_versions", f"{18446744073709551615 - version:020}.manifest")


def test_versions_cleaned_up_stop_publish_in_one_line_of_its_own_flags(
    tmp_path, kafka_broker, schema_registry
):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(20), "s": ["a"] * 20}), uri, enable_stable_row_ids=True
    )
    ck, topic = str(tmp_path / "ck"), _topic(kafka_broker)
    args = _args(uri, ck, topic, kafka_broker, schema_registry, "--available-now")
    code, _, err = _run([*args, "--starting-version", "1"])
    assert code == 0, err[-3000:]
    for i in range(3):  # versions 2-4, then 2 and 3 "cleaned up" before publish reads them
        lance.dataset(uri).update({"s": f"'u{i}'"}, where=f"id = {i}")
    for v in (2, 3):
        os.remove(_manifest(uri, v))
    # stopped by the query (in Spark), or before it by the head start: one line either way
    for extra, details in (("--no-head-start", True), ("--available-now", False)):
        code, _, err = _run([*args, extra])
        assert code == 2
        assert "Traceback" not in err and "\tat " not in err and "Py4J" not in err, err[-5000:]
        lines = [x for x in err.strip().splitlines() if "error" in x.lower()]
        assert lines == [err.strip().splitlines()[-1]], err[-5000:]  # Spark's start-up
        line = lines[0]  # notices (WARN ...) aside, the one line is the error
        assert line.startswith(
            f"lance-cdf: error: the changes of version(s) 2..4 of {uri} can no longer be read"
        ), line
        assert "--snapshot" in line and "new --topic" in line, line
        assert "failOnDataLoss" not in line and "checkpointLocation" not in line, line
        log = f"{ck}/lance-cdf-publish.log"
        assert line.endswith(f"(details: {log})") == details, line
        if details:  # the whole text, Spark's and the Python traceback, is in the log file
            with open(log) as f:
                assert "Traceback" in f.read()


def test_a_broker_outage_of_many_flush_timeouts_is_ridden_out_exactly_once(
    tmp_path, kafka_broker, schema_registry
):
    """A broker outage longer than publish's flush timeout once stopped it. Now the broker
    is frozen (SIGSTOP: requests go unanswered) for FREEZE_S, many times publish's flush
    timeout, while commits keep coming: publish keeps running, then catches up; the topic
    holds every change once, per key in commit order (read_changes is the oracle), and the
    checkpoint's Kafka state shows the outage."""
    from tests.kafka.test_exactly_once import writer

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(200), "s": ["a"] * 200}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=50,
    )
    ck, topic = str(tmp_path / "ck"), _topic(kafka_broker)
    args = _args(
        uri,
        ck,
        topic,
        kafka_broker,
        schema_registry,
        "--starting-version",
        "1",
        "--trigger-interval",
        "500ms",
        "--flush-timeout",
        str(FLUSH_TIMEOUT_S),
    )
    # its log to a file, read when needed: a pipe nobody reads while it runs can fill
    errors = tmp_path / "publish.err"
    with open(errors, "w") as sink:
        proc = _cli(*args, stdout=subprocess.DEVNULL, stderr=sink)

    def log_tail():
        return errors.read_text()[-5000:]

    stop = threading.Event()
    commits = threading.Thread(target=writer, args=(uri, stop, 30), daemon=True)
    frozen = False
    try:
        deadline = time.monotonic() + 180
        while not os.path.exists(os.path.join(ck, "commits", "0")):
            assert proc.poll() is None and time.monotonic() < deadline, log_tail()
            time.sleep(0.2)
        commits.start()
        time.sleep(2)
        os.kill(kafka_broker.pid, signal.SIGSTOP)
        frozen = True
        time.sleep(FREEZE_S)
        assert proc.poll() is None, log_tail()
        os.kill(kafka_broker.pid, signal.SIGCONT)
        frozen = False
        commits.join(120)
        latest = lance.dataset(uri).version
        deadline = time.monotonic() + 240
        while checkpoint_version(ck) != latest:
            assert proc.poll() is None, log_tail()
            assert time.monotonic() < deadline, (
                f"stuck at {checkpoint_version(ck)} < {latest}: {read_state(ck)}\n{log_tail()}"
            )
            time.sleep(1)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        err = errors.read_text()
        assert proc.returncode == 0, err[-5000:]
    finally:
        stop.set()
        if frozen:
            os.kill(kafka_broker.pid, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    state = read_state(ck)
    assert state is not None and state.outages >= 1 and state.retries >= 1, state
    # the freeze is the longest outage (a short one may follow: the broker, back, answering
    # a request with a stale leader epoch once)
    assert state.unavailable_since == 0 and state.longest_outage_s >= 30, state
    assert "does not answer" in err and "answers again" in err, err[-5000:]
    want = expected_by_key(uri)
    count = sum(len(v) for v in want.values())
    got, _ = consume_by_key(
        kafka_broker.bootstrap_servers,
        topic,
        schema_registry.url,
        count + 1,
        isolation="read_committed",
    )
    assert got == want  # every change once, per key in commit order
