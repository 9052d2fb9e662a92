"""`make demo` in a short mode: the whole pipeline ends with the replica equal to the
source, and `lance-cdf status` agrees that nothing is left behind."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # the demo pipeline (broker, registry, Spark) in a subprocess


def test_demo_pipeline_ends_with_replica_equal_to_source(tmp_path):
    root = tmp_path / "demo"
    run = subprocess.run(
        [sys.executable, "-m", "lance_cdf.demo", "--dir", str(root), "--seconds", "12",
         "--commit-interval", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "OK: replica equals the source" in run.stdout
    status = subprocess.run(
        [sys.executable, "-m", "lance_cdf.cli", "status", "--json",
         "--table", str(root / "source.lance"),
         "--checkpoint", str(root / "checkpoints" / "publisher"),
         "--replica", str(root / "replica.lance")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(status.stdout)
    assert report["latest_version"] > 5  # the writer committed
    assert report["checkpoint_lag"] == 0
    # the replica holds changes through the last version that changed rows
    assert 1 < report["replica_version"] <= report["latest_version"]


def test_walkthrough_prints_the_feed(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "lance_cdf.demo", "--walkthrough", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert "merge_insert" in run.stdout and "update" in run.stdout
