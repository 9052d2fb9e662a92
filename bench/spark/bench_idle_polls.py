"""What a database stream's tables cost on object storage, and how soon it sees a commit:
every table listed every trigger (`--idle-poll-max 0`, the behaviour before adaptive
polling) against quiet tables listed less often (spark/source/idle_polls.py), side by side
in one run on the same server (a fresh database of the same tables for each).

    python -m bench.spark.bench_idle_polls --tables 200 --ceilings 0,10 \
        --out bench/results/results_idle_polls.json

Builds a LanceDB database of --tables tables of 20 rows on `lance_cdf_devtools.S3Server`
(moto on 127.0.0.1, which counts the requests it serves per table; the benchmark's own
commits are served uncounted, through their User-Agent). For each ceiling, the
database stream's driver (DatabaseReader, no Spark) runs its triggers every --trigger
seconds in real time, as Spark's processing-time trigger calls `latestOffset`:
  * idle       after --settle s of quiet, --idle s more: the requests the server counted
               (per table per minute; for all tables per hour, the database's own
               listings apart);
  * first      --first commits, each to a different table quiet for minutes, --gap s
               apart: commit returned -> the trigger whose offset holds the new version
               (the micro-batch that publishes it starts there);
  * busy       --busy s with one commit a second to a random table: the same latency (each
               commit mostly to a table quiet for minutes), and the requests per hour;
  * hot        --hot s with one commit a second to one table: a table being written.
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
import threading
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.streaming.datasource import ReadAllAvailable

from bench.support import stats
from bench.support.results import write_result
from bench.support.s3_counts import request_figures, requests_per_table, uncounted
from lance_cdf.spark.source.database_stream import DatabaseReader
from lance_cdf_devtools import S3Server

STABLE = {"new_table_enable_stable_row_ids": "true"}
BUCKET = "bench-idle-polls"


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": np.arange(lo, hi), "s": [f"a{i}" for i in range(lo, hi)]})


class Stream:
    """The database stream's driver, triggered every `trigger` s in a thread; records when
    each table's offset first showed each version."""

    def __init__(self, options: dict[str, str], trigger: float):
        self.reader = DatabaseReader(options)
        self.offset = self.reader.initialOffset()
        self.trigger = trigger
        self.seen: dict[tuple[str, int], float] = {}
        self.triggers = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            due = (time.time() // self.trigger + 1) * self.trigger  # Spark's grid
            self.stop.wait(max(0.0, due - time.time()))
            self.offset = self.reader.latestOffset(self.offset, ReadAllAvailable())
            now = time.time()
            self.triggers += 1
            for name, off in self.offset["tables"].items():
                version = int(off["version"])  # (every version up to it: commits between
                while (name, version) not in self.seen and version > 0:  # two triggers)
                    self.seen[(name, version)] = now
                    version -= 1

    def wait_seen(self, name: str, version: int, timeout: float = 120) -> float:
        end = time.time() + timeout
        while (name, version) not in self.seen and time.time() < end:
            time.sleep(0.02)
        return self.seen.get((name, version), float("nan"))

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def commit(db: Any, name: str) -> tuple[int, float]:
    """One append to table `name`; (its new version, when the commit returned)."""
    t = db.open_table(name)
    t.add(rows(0, 3))
    return t.version, time.time()


def pct(xs: list[float], q: float) -> float:
    return stats.percentile(xs, q) if xs else float("nan")


def run_ceiling(
    args: argparse.Namespace, server: S3Server, root: str, names: list[str], ceiling: float
) -> dict[str, Any]:
    import lancedb

    opts = server.storage_options()
    # the benchmark's own commits are served but not counted: the counts are the stream's
    db = lancedb.connect(root, storage_options=uncounted(opts))
    storage = {f"storage.{k}": v for k, v in opts.items()}
    options = {
        "database": root,
        "writerSlots": "1",
        "keyHash": "id",
        "kafkaPartitions": "1",
        "idlePollMax": str(ceiling),
        **storage,
    }
    keys = [f"{root.removeprefix('s3://')}/{n}.lance" for n in names]
    stream = Stream(options, args.trigger)
    out: dict[str, Any] = {"ceiling": ceiling}
    try:
        time.sleep(args.settle)
        server.request_counts_by_table(reset=True)
        t0, n0 = time.time(), stream.triggers
        time.sleep(args.idle)
        per, other = requests_per_table(server, keys)
        out["idle"] = {
            "triggers": stream.triggers - n0,
            **request_figures(per, other, time.time() - t0),
        }
        print(ceiling, "idle", out["idle"], flush=True)
        quiet = random.Random(1).sample(names, args.first)
        first = []
        for name in quiet:
            version, at = commit(db, name)
            first.append(stream.wait_seen(name, version) - at)
            time.sleep(args.gap)
        out["first_after_quiet_s"] = {
            "n": len(first),
            "p50": round(pct(first, 50), 2),
            "p99": round(pct(first, 99), 2),
            "max": round(max(first), 2),
            "all": [round(x, 2) for x in first],
        }
        print(ceiling, "first", out["first_after_quiet_s"], flush=True)
        server.request_counts_by_table(reset=True)
        rng = random.Random(2)
        busy, t0, pending = [], time.time(), []
        while time.time() - t0 < args.busy:
            name = rng.choice(names)
            version, at = commit(db, name)
            pending.append((name, version, at))
            time.sleep(max(0.0, 1.0 - (time.time() - at)))
        for name, version, at in pending:
            busy.append(stream.wait_seen(name, version) - at)
        per, other = requests_per_table(server, keys)
        figures = request_figures(per, other, time.time() - t0)
        out["busy"] = {
            "commits": len(busy),
            "p50": round(pct(busy, 50), 2),
            "p99": round(pct(busy, 99), 2),
            "max": round(max(busy), 2),
            "table_requests_per_hour": figures["table_requests_per_hour"],
        }
        print(ceiling, "busy", out["busy"], flush=True)
        hot, t0, pending = [], time.time(), []
        while time.time() - t0 < args.hot:  # one table written once a second
            version, at = commit(db, names[0])
            pending.append((names[0], version, at))
            time.sleep(max(0.0, 1.0 - (time.time() - at)))
        hot = [stream.wait_seen(name, version) - at for name, version, at in pending]
        out["hot"] = {
            "commits": len(hot),
            "p50": round(pct(hot, 50), 2),
            "p99": round(pct(hot, 99), 2),
            "max": round(max(hot), 2),
        }
        print(ceiling, "hot", out["hot"], flush=True)
    finally:
        stream.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--ceilings", default="0,10", help="idlePollMax values, comma-separated")
    ap.add_argument("--trigger", type=float, default=1.0, help="seconds (publish's default)")
    ap.add_argument("--settle", type=float, default=60.0)
    ap.add_argument("--idle", type=float, default=120.0)
    ap.add_argument("--first", type=int, default=15)
    ap.add_argument("--gap", type=float, default=3.0)
    ap.add_argument("--busy", type=float, default=120.0)
    ap.add_argument("--hot", type=float, default=60.0, help="s of commits to one table")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import lancedb

    with tempfile.TemporaryDirectory() as tmp:
        server = S3Server(tmp)
        server.start()
        try:
            server.create_bucket(BUCKET)
            opts = server.storage_options()
            results = []
            for ceiling in [float(c) for c in args.ceilings.split(",")]:
                root = f"s3://{BUCKET}/db{len(results)}"  # a fresh database per ceiling
                db = lancedb.connect(root, storage_options=opts)
                names = [f"t{i}" for i in range(args.tables)]
                for name in names:
                    db.create_table(name, rows(0, 20), storage_options={**opts, **STABLE})
                results.append(run_ceiling(args, server, root, names, ceiling))
        finally:
            server.close()
    commit_id = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit_id,
        "command": " ".join([os.path.basename(sys.executable), "-m", __spec__.name, *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "tables": args.tables,
        "trigger_s": args.trigger,
        "results": results,
    }
    print(json.dumps(doc, indent=1))
    write_result(args.out, doc, indent=1)


if __name__ == "__main__":
    main()
