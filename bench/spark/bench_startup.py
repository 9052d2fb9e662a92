"""Start-up of `lance-cdf publish`: time from launch to the first acknowledged record.

    python -m bench.spark.bench_startup --runs 2 [--before /work/main]
    python -m bench.spark.bench_startup --database 20 --runs 2

Starts a local broker and registry, writes a 1-row table, then runs
`lance-cdf publish --available-now` as its own process (as a user does) while a consumer
in this process waits for the first record. Reports, per run: the first record's
time after launch, the process's exit, and the stages `publish` prints. `no head start`:
the same with `--no-head-start` (the query publishes the first commit itself). `floor`:
the same for bench/support/startup_floor.py, a minimal Python stream through the same Spark
machinery into Kafka with nothing of lance-cdf (what no change to lance-cdf's Spark code
can go below). With `--before DIR`, the same runs with the lance_cdf package of DIR
(another checkout) on PYTHONPATH, alternating with this one (side by side, same machine
state). With `--database N`: a database publisher over N one-row tables, restarted with a
row appended to each, its head start against `--no-head-start` (`database_run`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid

import lance
import pyarrow as pa
from confluent_kafka import Consumer

from lance_cdf_devtools.commands import publish, spark_env


def first_record(c: Consumer, t0: float, within: float = 180) -> float | None:
    """Seconds from `t0` to the first record `c` receives (None: none within `within`)."""
    while time.monotonic() - t0 < within:
        m = c.poll(0.05)
        if m is not None and not m.error():
            return time.monotonic() - t0
    return None


def one_run(code_dir, kafka, registry, uri, workdir, extra=()) -> dict:
    topic = f"start-{uuid.uuid4().hex[:8]}"
    c = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": topic,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 200,
        }
    )
    c.subscribe([topic])
    env = spark_env()
    if code_dir:
        env["PYTHONPATH"] = code_dir
    checkpoint = os.path.join(workdir, f"ck-{topic}")
    cmd = publish(
        kafka.bootstrap_servers,
        registry.url,
        checkpoint,
        table=uri,
        topic=topic,
        extra=["--starting-version", "1", "--available-now", *extra],
    )
    if code_dir == "floor":  # the same Spark machinery without lance-cdf (startup_floor.py)
        bench = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        floor = os.path.join(bench, "support", "startup_floor.py")
        cmd = [
            sys.executable,
            floor,
            kafka.bootstrap_servers,
            topic,
            checkpoint,
        ]
        code_dir = None
    t0 = time.monotonic()
    # (cwd: not a checkout, whose lance_cdf `python -m` would import ahead of PYTHONPATH)
    proc = subprocess.Popen(
        cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    first = first_record(c, t0)
    out, err = proc.communicate(timeout=180)
    exited = time.monotonic() - t0
    c.close()
    line = next((ln for ln in out.decode().splitlines() if ln.startswith("publishing")), "")
    stages = (
        dict(
            (k, float(v))
            for k, v in re.findall(r"([A-Za-z][A-Za-z ]*?) ([0-9.]+) s", line.split("start-up")[-1])
        )
        if "start-up" in line
        else {}
    )
    assert proc.returncode == 0, err.decode()[-2000:]
    return {"first_record_s": first, "exit_s": exited, "stages": stages}


def database_run(kafka, registry, root: str, tables: list[str], workdir, extra=()) -> dict:
    """`publish --database` restarted with one commit waiting in every table: launch ->
    the first record of any table's topic. A first run (`--available-now`, a new
    checkpoint: it starts at every table's latest version) makes the checkpoint; then one
    row is appended to each table and the timed run resumes from it."""
    prefix = f"dbstart{uuid.uuid4().hex[:8]}"
    checkpoint = os.path.join(workdir, f"ck-{prefix}")
    env = spark_env()
    cmd = publish(
        kafka.bootstrap_servers,
        registry.url,
        checkpoint,
        database=root,
        prefix=prefix,
        extra=["--available-now", *extra],
    )
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
    for name in tables:
        uri = os.path.join(root, f"{name}.lance")
        n = lance.dataset(uri).count_rows()
        lance.write_dataset(pa.table({"id": [n]}), uri, mode="append")
    c = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": prefix,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 200,
        }
    )
    c.subscribe([f"^{re.escape(prefix)}\\..*"])
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = first_record(c, t0)
    out, err = proc.communicate(timeout=300)
    exited = time.monotonic() - t0
    c.close()
    assert proc.returncode == 0, err.decode()[-2000:]
    head = next((ln for ln in out.decode().splitlines() if ln.startswith("head start")), "")
    return {"first_record_s": first, "exit_s": exited, "head_start": head}


def main_database(tables: int, runs: int) -> None:
    """--database N: launch -> first record of a restarted database publisher, with its
    head start and with --no-head-start, alternated."""
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    workdir = tempfile.mkdtemp(prefix="bench-startup-db-")
    root = os.path.join(workdir, "db")
    names = [f"t{i}" for i in range(tables)]
    for name in names:
        lance.write_dataset(
            pa.table({"id": [0]}), os.path.join(root, f"{name}.lance"), enable_stable_row_ids=True
        )
    results: dict[str, list] = {"head start": [], "no head start": []}
    with KafkaBroker() as kafka, SchemaRegistry() as registry:
        for _ in range(runs):
            for label, extra in (("head start", ()), ("no head start", ("--no-head-start",))):
                r = database_run(kafka, registry, root, names, workdir, extra)
                results[label].append(r)
                print(label, json.dumps(r), flush=True)
    for label, got in results.items():
        firsts = ", ".join(f"{r['first_record_s']:.1f}" for r in got)
        print(f"{label}: first record {firsts} s ({tables} tables)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--before", default=None, help="a checkout whose lance_cdf is 'before'")
    ap.add_argument(
        "--database",
        type=int,
        default=None,
        metavar="TABLES",
        help="a database publisher over this many tables, restarted with a commit in each",
    )
    args = ap.parse_args()
    if args.database:
        main_database(args.database, args.runs)
        return
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    workdir = tempfile.mkdtemp(prefix="bench-startup-")
    uri = os.path.join(workdir, "one.lance")
    lance.write_dataset(pa.table({"id": [1]}), uri, enable_stable_row_ids=True)
    results: dict[str, list] = {"after": [], "no head start": [], "before": [], "floor": []}
    paths = (
        ("before", args.before, ()),
        ("after", None, ()),
        ("no head start", None, ("--no-head-start",)),
        ("floor", "floor", ()),
    )
    with KafkaBroker() as kafka, SchemaRegistry() as registry:
        for _ in range(args.runs):
            for label, code, extra in paths:
                if label == "before" and not code:
                    continue
                r = one_run(code, kafka, registry, uri, workdir, extra)
                results[label].append(r)
                print(label, json.dumps(r), flush=True)
    for label, runs in results.items():
        if runs:
            best = min(runs, key=lambda r: r["first_record_s"])
            print(
                f"{label}: first record {best['first_record_s']:.1f} s, exit "
                f"{best['exit_s']:.1f} s (best of {len(runs)})"
            )


if __name__ == "__main__":
    main()
