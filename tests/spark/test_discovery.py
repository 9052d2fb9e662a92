"""`format("lance-cdf")` without a register call (the `pyspark_lance_cdf` module that
PySpark >= 4.0 looks up), in fresh processes: a `python` driver on local[2] and a
`spark-submit` driver on a standalone cluster. What they read (DataFrame API, a SQL
view `USING lance-cdf`, a stream) must equal `read_changes` of the same range."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import lance_cdf
from lance_cdf_devtools.spark import spark_home
from tests.support.workload import Workload

pytestmark = pytest.mark.integration  # Spark in subprocesses, local and on a standalone cluster

JOB = Path(__file__).resolve().parents[1] / "support" / "discovery_job.py"
OPS = ["append", "update", "upsert", "delete_sparse", "upsert_delete_missing", "compact"]


def make_table(uri: str, seed: int) -> int:
    rng = random.Random(seed)
    w = Workload(uri, seed=seed, rows=120)
    for _ in range(5):
        w.step(rng.choice(OPS))
    return w.ds.version


def expected(uri, start, end=None) -> list:
    events = lance_cdf.read_changes(uri, start, end).read_all()
    cols = ["_rowid", "_change_type", "_commit_version", "id", "name"]
    return sorted([list(r.values()) for r in events.select(cols).to_pylist()])


def clean_env() -> dict:
    """No PYTHONPATH, no lance_cdf preloaded: lance-cdf is found as an installed package."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    return env


def check(result: dict, uri: str, start: int, end: int, stream: bool = True) -> None:
    assert result["lance_cdf_imported_before_read"] is False
    want = expected(uri, start, end)
    assert want, "the range has changes"
    assert result["dataframe"] == want
    assert result["sql_view"] == want
    assert result["sink_found"] is True
    if not stream:
        return
    assert result["stream"] == expected(uri, start)
    # the source reports the table's latest version in every progress report
    last = result["progress"][-1]["sources"][0]
    assert offset(last["latestOffset"]) == {"version": end}
    assert offset(last["endOffset"])["version"] == end  # with the table's identity


def offset(value):
    """An offset in a progress report: Spark gives JSON it can parse as an object."""
    return json.loads(value) if isinstance(value, str) else value


def test_found_without_register_on_local(tmp_path):
    uri = str(tmp_path / "t.lance")
    latest = make_table(uri, seed=11)
    start = 2
    out = tmp_path / "result.json"
    args = {"master": "local[2]", "table": uri, "start": start, "end": latest, "out": str(out)}
    run = subprocess.run(
        [sys.executable, str(JOB), json.dumps(args)],
        env=clean_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-6000:]
    result = json.loads(out.read_text())
    check(result, uri, start, latest)
    # a SQL identifier cannot hold a hyphen: `USING lance-cdf` needs backquotes
    assert "sql_unquoted" not in result
    assert "INVALID_IDENTIFIER" in result["sql_unquoted_error"]


def test_found_without_register_on_a_standalone_cluster(tmp_path, spark_cluster):
    uri = str(tmp_path / "t.lance")
    latest = make_table(uri, seed=12)
    out = tmp_path / "result.json"
    # batch reads only: the stream's discovery is the same lookup (tested on local[2]), and
    # its planning worker on a loaded 2-core machine can miss Spark's 10 s connect-back
    args = {"table": uri, "start": 1, "end": latest, "out": str(out), "stream": False}
    cluster = spark_cluster
    cmd = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        cluster.master_url,
        "--driver-memory",
        "512m",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.executor.cores=1",
        "--conf",
        "spark.ui.enabled=false",
        str(JOB),
        json.dumps(args),
    ]
    log = tmp_path / "submit.log"
    with open(log, "wb") as fh:
        done = subprocess.run(
            cmd, env=clean_env(), cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT, timeout=600
        )
    assert done.returncode == 0, log.read_text()[-6000:] + cluster.logs()
    check(json.loads(out.read_text()), uri, 1, latest, stream=False)
