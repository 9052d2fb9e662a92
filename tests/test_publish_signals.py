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


@pytest.mark.parametrize(
    "sig, group",
    [
        (signal.SIGTERM, False),
        (signal.SIGINT, True),  # a terminal's Ctrl-C
        (signal.SIGTERM, True),  # kill -TERM -- -PGID, systemd's stop (its whole cgroup)
    ],
)
def test_publish_stops_cleanly_on_signal(sig, group, tmp_path, kafka_broker, schema_registry):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": np.arange(50)}), uri, enable_stable_row_ids=True)
    ck = tmp_path / "ck"
    args = ["publish", "--table", uri, "--bootstrap-servers", kafka_broker.bootstrap_servers,
            "--topic", f"sig-{uuid.uuid4().hex[:8]}", "--schema-registry", schema_registry.url,
            "--checkpoint", str(ck), "--starting-version", "1",
            "--trigger-interval", "200 milliseconds"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "lance_cdf.cli", *args],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if (ck / "commits" / "0").exists():
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
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
from lance_cdf.streaming.hangup import quiet_when_spark_hangs_up
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
