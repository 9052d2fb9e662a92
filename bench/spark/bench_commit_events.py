"""Commits found by storage events (`commitEvents`) against listing (`idlePollMax`), side by
side in one run: what idle tables cost, and how soon the database stream sees a commit.

    .venv/bin/python -m bench.spark.bench_commit_events --tables 200 \\
        --out bench/results/results_commit_events.json

On `lance_cdf_devtools.S3Server` (moto on 127.0.0.1: it counts the requests it serves per
table, SQS's apart, and delivers the bucket's notifications to its own SQS queue), a
LanceDB database of --tables tables of 20 rows, a fresh one per mode; then the same on a
local directory (`--local`). Each mode runs the database stream's driver (DatabaseReader,
no Spark) with its triggers on Spark's grid in real time, as Spark's processing-time
trigger calls `latestOffset`, at the trigger publish gives it by default (1 s listing,
0.5 s with events):
  * idle   after --settle s, --idle s more: the requests counted, per table per minute and
           per hour (the tables', the database's own listings, the queue's receives);
  * first  --first commits, each to a different table quiet since the start (--settle +
           --idle s), --gap s apart: commit returned -> the trigger whose offset holds it
           (the micro-batch that publishes it starts there);
  * hot    --hot s of one commit a second to one table;
  * spread --spread s of one commit a second to a random table.
The benchmark's own commits are served uncounted (their User-Agent). What it measures ends
where the micro-batch starts: commit -> Kafka adds that micro-batch (Benchmarks, "A whole
database").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from bench.spark.bench_idle_polls import STABLE, Stream, commit, pct, rows
from bench.support.results import write_result
from bench.support.s3_counts import request_figures, requests_per_table, uncounted
from lance_cdf.ops.clientconfig import sqs_client_arguments
from lance_cdf_devtools import S3Server
from lance_cdf_devtools.s3app import SQS_KEY

BUCKET = "bench-commit-events"


def notified_queue(server: S3Server, bucket: str) -> str:
    """An SQS queue on the server that `bucket` notifies of its new manifests; its URL."""
    import boto3

    opts = server.storage_options()
    args = sqs_client_arguments(f"{server.endpoint}/123456789012/{bucket}", opts)
    sqs = boto3.client("sqs", **args)
    queue = sqs.create_queue(QueueName=bucket)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
    boto3.client("s3", **args).put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": arn["Attributes"]["QueueArn"],
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {"Key": {"FilterRules": [{"Name": "suffix", "Value": ".manifest"}]}},
                }
            ]
        },
    )
    return str(queue)


def purge(server: S3Server, queue: str) -> None:
    """The queue emptied: the notifications of the tables' creation are not what the idle
    window measures (the stream's listing at start finds those versions)."""
    import boto3

    args = sqs_client_arguments(queue, server.storage_options())
    boto3.client("sqs", **args).purge_queue(QueueUrl=queue)


def latencies(stream: Stream, pending: list[tuple[str, int, float]]) -> dict[str, Any]:
    seen = [stream.wait_seen(name, version) - at for name, version, at in pending]
    return {
        "n": len(seen),
        "p50": round(pct(seen, 50), 2),
        "p99": round(pct(seen, 99), 2),
        "max": round(max(seen), 2),
    }


def every_second(db: Any, pick: Any, seconds: float) -> list[tuple[str, int, float]]:
    pending, t0 = [], time.time()
    while time.time() - t0 < seconds:
        name = pick()
        version, at = commit(db, name)
        pending.append((name, version, at))
        time.sleep(max(0.0, 1.0 - (time.time() - at)))
    return pending


def run_mode(
    args: argparse.Namespace,
    server: S3Server | None,
    root: str,
    names: list[str],
    extra: dict[str, str],
    trigger: float,
) -> dict[str, Any]:
    import lancedb

    opts = server.storage_options() if server is not None else {}
    db = lancedb.connect(root, storage_options=uncounted(opts) if opts else {})
    storage = {f"storage.{k}": v for k, v in opts.items()}
    base = {"database": root, "writerSlots": "1", "keyHash": "id", "kafkaPartitions": "1"}
    stream = Stream({**base, **storage, **extra}, trigger)
    keys = [f"{root.removeprefix('s3://')}/{n}.lance" for n in names]
    out: dict[str, Any] = {"options": extra, "trigger_s": trigger}
    try:
        time.sleep(args.settle)
        if server is not None:
            server.request_counts_by_table(reset=True)
        t0, n0, looks0 = time.time(), stream.triggers, stream.reader.polls.looks
        time.sleep(args.idle)
        out["idle"] = {
            "triggers": stream.triggers - n0,
            "looks": stream.reader.polls.looks - looks0,
        }
        if server is not None:
            per, other = requests_per_table(server, keys)
            queue = other.pop(SQS_KEY, {})
            seconds = time.time() - t0
            figures = request_figures(per, other, seconds)
            figures["queue_requests_per_hour"] = round(sum(queue.values()) / seconds * 3600)
            total = sum(per) + sum(sum(k.values()) for k in other.values()) + sum(queue.values())
            figures["all_requests_per_table_per_minute"] = round(
                total / len(names) / (seconds / 60), 3
            )
            out["idle"].update(figures)
        print(extra, "idle", out["idle"], flush=True)
        quiet = random.Random(1).sample(names, args.first)
        pending = []
        for name in quiet:
            version, at = commit(db, name)
            pending.append((name, version, at))
            time.sleep(args.gap)
        out["first_after_quiet_s"] = latencies(stream, pending)
        print(extra, "first", out["first_after_quiet_s"], flush=True)
        out["hot_s"] = latencies(stream, every_second(db, lambda: names[0], args.hot))
        print(extra, "hot", out["hot_s"], flush=True)
        rng = random.Random(2)
        out["spread_s"] = latencies(
            stream, every_second(db, lambda: rng.choice(names), args.spread)
        )
        print(extra, "spread", out["spread_s"], flush=True)
        hints = stream.reader.hints
        out["discovery"] = hints.discovery() if hints is not None else None
    finally:
        stream.close()
        stream.reader.stop()
    return out


def make_database(root: str, n: int, opts: dict[str, str]) -> list[str]:
    import lancedb

    db = lancedb.connect(root, storage_options=uncounted(opts) if opts else {})
    names = [f"t{i}" for i in range(n)]
    for name in names:
        so = {**(uncounted(opts) if opts else {}), **STABLE}
        db.create_table(name, rows(0, 20), storage_options=so)
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--settle", type=float, default=30.0)
    ap.add_argument("--idle", type=float, default=600.0, help="s idle (the quiet before first)")
    ap.add_argument("--first", type=int, default=20)
    ap.add_argument("--gap", type=float, default=2.0)
    ap.add_argument("--hot", type=float, default=60.0)
    ap.add_argument("--spread", type=float, default=60.0)
    ap.add_argument("--modes", default="listing,events")
    ap.add_argument("--local", action="store_true", help="also a database on a local directory")
    ap.add_argument("--no-s3", action="store_true", help="only the local directory")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    modes = args.modes.split(",")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = S3Server(tmp)
        server.start()
        try:
            for mode in [] if args.no_s3 else modes:
                bucket = f"{BUCKET}-{mode}"
                server.create_bucket(bucket)
                queue = notified_queue(server, bucket) if mode == "events" else ""
                root = f"s3://{bucket}/db"
                names = make_database(root, args.tables, server.storage_options())
                if queue:
                    purge(server, queue)
                extra = {"commitEvents": queue} if queue else {}
                trigger = 0.5 if queue else 1.0
                results[f"s3 {mode}"] = run_mode(args, server, root, names, extra, trigger)
        finally:
            server.close()
        for mode in modes if args.local else []:
            root = os.path.join(tmp, f"local-{mode}")
            names = make_database(root, args.tables, {})
            extra = {"commitEvents": "files"} if mode == "events" else {}
            trigger = 0.5 if mode == "events" else 1.0
            results[f"local {mode}"] = run_mode(args, None, root, names, extra, trigger)
    commit_id = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit_id,
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "tables": args.tables,
        "results": results,
    }
    print(json.dumps(doc, indent=1))
    write_result(args.out, doc, indent=1)


if __name__ == "__main__":
    main()
