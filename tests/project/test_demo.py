"""`make demo` in a short mode: the whole pipeline ends with the replica equal to the
source, and `lance-cdf status` agrees that nothing is left behind."""

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # the demo pipeline (broker, registry, Spark) in a subprocess


def test_demo_pipeline_ends_with_replica_equal_to_source(tmp_path):
    """The demo's database of three tables (one in a child namespace): one publisher, one
    replicator; each replica table equal to its source (the demo's own check), and
    `lance-cdf status` (an independent reader of the checkpoint and the replicas) agrees."""
    root = tmp_path / "demo"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf_demo",
            "--dir",
            str(root),
            "--seconds",
            "12",
            "--commit-interval",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "OK: the replica database equals the source, table by table" in run.stdout
    names = ["items", "users", "sales.orders"]
    for name in names:
        assert re.search(rf"^  {re.escape(name)} +equal at version \d+", run.stdout, re.M), name
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf.cli",
            "status",
            "--json",
            "--database",
            str(root / "source"),
            "--checkpoint",
            str(root / "checkpoints" / "publisher"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    tables = json.loads(status.stdout)["tables"]
    assert sorted(tables) == sorted(names)
    assert sum(t["latest_version"] for t in tables.values()) > 3 + 5  # the writer committed
    assert all(t["checkpoint_lag"] == 0 for t in tables.values()), tables
    replicas = subprocess.run(
        [
            sys.executable,
            "-m",
            "lance_cdf.cli",
            "status",
            "--json",
            "--database-target",
            str(root / "replica"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    held = {r["table"]: r for r in json.loads(replicas.stdout)["replicas"]}
    assert sorted(held) == sorted(names)
    for name in names:
        assert held[name]["topic"] == f"demo.{name}"
        # the replica holds changes through the last version that changed rows
        assert 1 <= held[name]["source_version"] <= tables[name]["latest_version"]


def test_walkthrough_prints_the_feed(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "lance_cdf_demo", "--walkthrough", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "merge_insert" in run.stdout and "update" in run.stdout
