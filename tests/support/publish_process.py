"""`lance-cdf publish` as the tests run it: its arguments for one table and one topic,
and the command line started as a process of its own.

The process leads a session of its own, so `os.killpg(proc.pid, ...)` reaches the driver,
Spark's JVM and its Python workers at once, and Spark's workers run this interpreter
(PYSPARK_PYTHON)."""

import os
import subprocess
import sys

CLI = [sys.executable, "-m", "lance_cdf.cli"]  # `lance-cdf`, as this interpreter runs it


def publish_args(table, bootstrap, topic, registry, checkpoint, *extra) -> list[str]:
    """`lance-cdf publish`'s arguments: `table` to `topic` of the broker at `bootstrap`
    (schemas at `registry`) from `checkpoint`, then `extra`."""
    return [
        "publish",
        "--table",
        str(table),
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topic,
        "--schema-registry",
        registry,
        "--checkpoint",
        str(checkpoint),
        *extra,
    ]


def cli_env(**more: str) -> dict[str, str]:
    """This process's environment with Spark's workers on this interpreter, and `more`."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, **more}


def start_cli(args, env=None, **popen) -> subprocess.Popen:
    """`lance-cdf ARGS` started in a session of its own (`env`: `cli_env()`); `popen`: the
    rest of `subprocess.Popen`'s arguments (where its output goes, text, ...)."""
    return subprocess.Popen(
        [*CLI, *args], env=cli_env() if env is None else env, start_new_session=True, **popen
    )
