"""A killed replicator's replacement: seconds from its start until it has applied a version
published after the kill.

Runs a real local broker and Apicurio registry (lance_cdf_devtools). A few Lance tables are
published to `P.<table>` with their BEGIN / END (bench_scaleout.publish_versions, the
publisher classes the Spark sink uses). A replicator (`--target` of one table, or
`--database-target` of them all) catches up, is SIGKILLed, is started again at once, and a
new version of every table is published: the time from the restart until every replica
holds it. `--checkout DIR` runs the replicators from another checkout's lance_cdf (an
earlier commit, for a before/after in one run).

    .venv/bin/python -m bench.replicate.bench_restart --rounds 3 \
        --out bench/results/results_restart.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
from confluent_kafka.admin import AdminClient, NewTopic

from bench.replicate.bench_scaleout import publish_versions
from bench.support.results import write_result


def held(uri: str) -> int | None:
    from lance_cdf.replicate.replica import ReplicaTable, source_version_of

    if not os.path.isdir(uri):
        return None
    return source_version_of(ReplicaTable(uri, []).position())


def append(uri: str, round_: int) -> int:
    ids = np.arange(round_ * 100, round_ * 100 + 100) + 1_000_000
    data = pa.table({"id": ids, "s": [f"r{round_}-{x}" for x in ids]})
    if not os.path.isdir(uri):
        return lance.write_dataset(data, uri, enable_stable_row_ids=True).version
    return lance.write_dataset(data, uri, mode="append").version


def wait(check, timeout: float, what: str) -> float:
    t0 = time.perf_counter()
    while not check():
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.05)
    return time.perf_counter() - t0


def run_mode(database: bool, args: argparse.Namespace, kafka, registry, work: str) -> list[float]:
    """The replacement's seconds to apply, one per round."""
    prefix = f"rs{uuid.uuid4().hex[:6]}"
    names = [f"t{i}" for i in range(args.tables if database else 1)]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topics = [NewTopic(f"{prefix}.{n}", 2, 1) for n in names]
    topics += [NewTopic(f"{prefix}.{n}.transaction", 1, 1) for n in names]
    for f in admin.create_topics(topics).values():
        f.result(30)
    src, dst = os.path.join(work, prefix, "src"), os.path.join(work, prefix, "dst")
    os.makedirs(src)
    published = dict.fromkeys(names, 0)

    def publish(round_: int) -> None:
        for n in names:
            uri = os.path.join(src, f"{n}.lance")
            end = append(uri, round_)
            publish_versions(uri, f"{prefix}.{n}", published[n] + 1, end, 2, kafka, registry)
            published[n] = end

    def caught_up() -> bool:
        return all(held(os.path.join(dst, f"{n}.lance")) == published[n] for n in names)

    where = (
        ["--database-target", dst, "--topic-prefix", prefix]
        if database
        else ["--target", os.path.join(dst, "t0.lance"), "--topic", f"{prefix}.t0"]
    )
    cmd = [
        sys.executable, "-m", "lance_cdf.cli", "replicate",
        "--bootstrap-servers", kafka.bootstrap_servers, "--schema-registry", registry.url,
        "--max-batch-interval", "0.3", *where,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.checkout:
        env["PYTHONPATH"] = args.checkout
    log = open(os.path.join(work, f"{prefix}.log"), "ab")  # noqa: SIM115

    def start() -> subprocess.Popen:
        # (cwd: not a checkout, whose lance_cdf `python -m` would import first)
        return subprocess.Popen(
            cmd, stdout=log, stderr=log, env=env, cwd=work, start_new_session=True
        )

    publish(0)
    proc = start()
    took = []
    try:
        wait(caught_up, args.timeout, "the first catch-up")
        for round_ in range(1, args.rounds + 1):
            time.sleep(args.settle)  # (a member that has been in its group a while)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            proc = start()
            t0 = time.perf_counter()
            publish(round_)
            wait(caught_up, args.timeout, f"round {round_}")
            took.append(round(time.perf_counter() - t0, 2))
            print(f"{'database' if database else 'table'} round {round_}: {took[-1]} s", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tables", type=int, default=3, help="tables of the database mode")
    ap.add_argument("--settle", type=float, default=5.0, help="s between catch-up and kill")
    ap.add_argument("--modes", default="table,database")
    ap.add_argument("--checkout", default=None, help="run the replicators from this checkout")
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    results: dict = {"rounds": args.rounds, "checkout": args.checkout}
    with (
        tempfile.TemporaryDirectory() as work,
        KafkaBroker() as kafka,
        SchemaRegistry() as registry,
    ):
        for mode in args.modes.split(","):
            took = run_mode(mode == "database", args, kafka, registry, work)
            results[mode] = {"seconds": took, "max_s": max(took)}
    print(json.dumps(results))
    write_result(args.out, results)


if __name__ == "__main__":
    main()
