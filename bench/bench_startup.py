"""Start-up of `lance-cdf publish`: time from launch to the first acknowledged record.

    python bench/bench_startup.py --runs 2 [--before /work/main]

Starts a local broker and registry, writes a 1-row table, then runs
`lance-cdf publish --available-now` as its own process (as a user does) while a consumer
in this process waits for the first record. Reports, per run: the first record's
time after launch, the process's exit, and the stages `publish` prints. `no head start`:
the same with `--no-head-start` (the query publishes the first commit itself). `floor`:
the same for bench/startup_floor.py, a minimal Python stream through the same Spark
machinery into Kafka with nothing of lance-cdf (what no change to lance-cdf's Spark code
can go below). With `--before DIR`, the same runs with the lance_cdf package of DIR
(another checkout) on PYTHONPATH, alternating with this one (side by side, same machine
state).
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
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    if code_dir:
        env["PYTHONPATH"] = code_dir
    cmd = [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "publish",
        "--table",
        uri,
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--topic",
        topic,
        "--schema-registry",
        registry.url,
        "--checkpoint",
        os.path.join(workdir, f"ck-{topic}"),
        "--starting-version",
        "1",
        "--available-now",
        *extra,
    ]
    if code_dir == "floor":  # the same Spark machinery without lance-cdf (startup_floor.py)
        floor = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup_floor.py")
        cmd = [
            sys.executable,
            floor,
            kafka.bootstrap_servers,
            topic,
            os.path.join(workdir, f"ck-{topic}"),
        ]
        code_dir = None
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = None
    while first is None and time.monotonic() - t0 < 180:
        m = c.poll(0.05)
        if m is not None and not m.error():
            first = time.monotonic() - t0
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--before", default=None, help="a checkout whose lance_cdf is 'before'")
    args = ap.parse_args()
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
