"""`lance-cdf publish` stops cleanly on SIGTERM and SIGINT: exit 0, no traceback."""

import os
import signal
import subprocess
import sys
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest


def _running_publisher(tmp_path, kafka_broker, schema_registry, prefix):
    """`lance-cdf publish` of a new 50-row table (a 200-ms trigger), once its first
    micro-batch is committed: the process, the table's URI and the checkpoint."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(50)}), uri, enable_stable_row_ids=True)
    ck = tmp_path / "ck"
    args = [
        *("publish", "--table", uri, "--topic", f"{prefix}-{uuid.uuid4().hex[:8]}"),
        *("--bootstrap-servers", kafka_broker.bootstrap_servers),
        *("--schema-registry", schema_registry.url, "--checkpoint", str(ck)),
        *("--starting-version", "1", "--trigger-interval", "200 milliseconds"),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lance_cdf.cli", *args],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if (ck / "commits" / "0").exists():
            break
        time.sleep(0.1)
    if proc.poll() is not None:
        pytest.fail(proc.stderr.read().decode()[-3000:])
    return proc, uri, ck


@pytest.mark.parametrize(
    "sig, group",
    [
        (signal.SIGTERM, False),
        (signal.SIGINT, True),  # a terminal's Ctrl-C
        (signal.SIGTERM, True),  # kill -TERM -- -PGID, systemd's stop (its whole cgroup)
    ],
)
def test_publish_stops_cleanly_on_signal(sig, group, tmp_path, kafka_broker, schema_registry):
    proc, uri, ck = _running_publisher(tmp_path, kafka_broker, schema_registry, "sig")
    try:
        # keep the query busy: commits arrive while it is being stopped
        for i in range(3):
            lance.dataset(uri).update({"id": f"id + {i + 1}"}, where="id < 10")
        # to the whole group: Spark's JVM and its Python runners get it too
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = err.decode()
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "Py4J" not in text, text[-3000:]
    assert b"publishing" in out, (out, text[-3000:])


RAISE = """
import sys, types
sys.modules["__main__"].__spec__ = types.SimpleNamespace(name={main!r})
from lance_cdf.spark.source.hangup import quiet_when_spark_hangs_up
quiet_when_spark_hangs_up()
try:
    try:
        raise EOFError
    except EOFError:
        raise {second}
except BaseException:
    raise BrokenPipeError(32, "Broken pipe")
"""
RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
SINK_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"


@pytest.mark.parametrize(
    "main, second, quiet",
    [
        (RUNNER, "BrokenPipeError(32, 'Broken pipe')", True),  # Spark closed the socket
        (SINK_RUNNER, "ConnectionResetError(104, 'reset')", True),
        (RUNNER, "ValueError('a reader error')", False),  # an error of ours: printed
        ("some.other.module", "BrokenPipeError(32, 'Broken pipe')", False),  # not the runner
    ],
)
def test_source_runner_exits_quietly_only_when_spark_hangs_up(main, second, quiet):
    """A stopped query closes its runners' sockets before killing them (the thread is
    interrupted): their hang-up tracebacks are not printed; anything else is."""
    code = RAISE.format(main=main, second=second)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert ("Traceback" not in done.stderr) == quiet, done.stderr
    if not quiet and "ValueError" in second:
        assert "a reader error" in done.stderr


# run once at the query's start (write_into_data_source runs at every micro-batch)
PLANNERS = ("lookup_data_sources", "create_data_source", "plan_data_source_read")


def _tree(root: int) -> list[str]:
    """The command lines of `root`'s descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    out, stack = [], list(kids.get(root, []))
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
        stack.extend(kids.get(pid, []))
    return out


def test_local_publisher_stops_planner_daemons(tmp_path, kafka_broker, schema_registry):
    """A local publisher's JVM runs with the footprint options, the data-source planners'
    Python daemons are gone once the query runs, and micro-batches still run after."""
    proc, uri, ck = _running_publisher(tmp_path, kafka_broker, schema_registry, "fp")
    try:
        started = [c for c in _tree(proc.pid) if "pyspark.daemon" in c]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            tree = _tree(proc.pid)
            if not any(p in c for c in tree for p in PLANNERS):
                break
            time.sleep(0.5)
        assert not any(p in c for c in tree for p in PLANNERS), (started, tree)
        jvm = [c for c in tree if "SparkSubmit" in c]
        assert len(jvm) == 1 and "-XX:+UseSerialGC" in jvm[0], jvm
        lance.dataset(uri).update({"id": "id + 100"}, where="id < 10")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (ck / "commits" / "1").exists():
            time.sleep(0.1)
        assert (ck / "commits" / "1").exists(), proc.stderr.read().decode()[-3000:]
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err.decode()[-3000:]
