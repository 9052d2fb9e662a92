"""lance_cdf.spark.sink.warm_daemon: the preload leaves one thread (so forking
warm workers is safe), a thread-starting setting makes it fall back to pyspark's own
daemon, and importing the module alone does nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_KNOBS = ("OPENBLAS_NUM_THREADS", "JE_ARROW_MALLOC_CONF")
_PROBE = """
import json, os, sys
from lance_cdf.spark.sink import warm_daemon as daemon
before = {m: m in sys.modules for m in daemon.PRELOAD}
env_before = {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "JE_ARROW_MALLOC_CONF")}
n = daemon.preload()
pid = os.fork()  # as pyspark's daemon does: no warning from pylance's at-fork hook
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"before": before, "env_before": env_before, "threads": n,
    "after": {m: m in sys.modules for m in daemon.PRELOAD}}))
"""


def _run(env: dict[str, str]) -> tuple[dict, str]:
    base = {k: v for k, v in os.environ.items() if k not in _KNOBS}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread count needs /proc")
def test_preload_imports_everything_and_leaves_one_thread() -> None:
    got, stderr = _run({})
    assert "fork-safe" not in stderr, stderr
    assert not any(got["before"].values()), got  # importing the module imports nothing
    assert got["env_before"] == {"OPENBLAS_NUM_THREADS": None, "JE_ARROW_MALLOC_CONF": None}
    assert all(got["after"].values()), got
    assert got["threads"] == 1, got


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread count needs /proc")
def test_a_thread_starting_setting_is_seen() -> None:
    # the user's own jemalloc setting wins, and its purge thread is counted: main() then
    # re-executes as pyspark.daemon instead of forking from a threaded process
    got, _ = _run({"JE_ARROW_MALLOC_CONF": "background_thread:true"})
    assert got["threads"] > 1, got


@pytest.mark.parametrize("jemalloc", [None, "background_thread:true"])
def test_main_serves_warm_or_falls_back_to_pyspark_daemon(jemalloc: str | None) -> None:
    # as Spark starts it: the daemon writes its port (4 bytes) to stdout and stops when
    # stdin closes. With a thread left after the imports it must say so and exec
    # pyspark.daemon (never fork from a threaded process), which still serves.
    env = {k: v for k, v in os.environ.items() if k not in _KNOBS}
    if jemalloc:
        env["JE_ARROW_MALLOC_CONF"] = jemalloc
    out = subprocess.run(
        [sys.executable, "-m", "lance_cdf.spark.sink.warm_daemon", "pyspark.worker"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
    )
    assert len(out.stdout) == 4, out
    assert (b"running pyspark.daemon" in out.stderr) == bool(jemalloc), out.stderr


def test_only_the_per_batch_workers_daemons_preload() -> None:
    from lance_cdf.spark.sink.warm_daemon import warms

    assert warms(["daemon", "pyspark.worker"]) and warms(["daemon"])
    assert warms(["daemon", "pyspark.sql.worker.python_streaming_sink_runner"])
    assert not warms(["daemon", "pyspark.sql.worker.plan_data_source_read"])
    assert not warms(["daemon", "pyspark.sql.worker.lookup_data_sources"])
