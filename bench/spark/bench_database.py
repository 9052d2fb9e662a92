r"""One publisher for a whole database: `lance-cdf publish --database`
following --tables tables.

    python -m bench.spark.bench_database --tables 200 --idle-seconds 60 --load-seconds 120 \
        --out bench/results/results_database.json

Starts a real local broker and Apicurio registry (lance_cdf_devtools) and a LanceDB
database of --tables small tables with stable row IDs (a tenth in a child namespace),
creates each table's topic (2 partitions), and runs `lance-cdf publish --database` with its
defaults (local[2], a trigger a second) as a subprocess. Once it follows every table:

- idle: the CPU time of publish's whole process tree (driver, JVM, Python workers; from
  /proc/PID/stat) over --idle-seconds with no commit, as a percentage of one core;
- load: one commit a second (an update of one row) to a random table for --load-seconds,
  each at a random moment (the gaps uniform in 0.5-1.5 s: publish's trigger fires on whole
  seconds, and commits exactly a second apart would keep one phase to it for the whole
  run, which moved p50 by 0.6 s between two runs; --fixed-phase for exactly 1 s);
  a consumer assigned to every table topic's partitions notes when each commit's first
  record arrives: commit → first record in Kafka, p50 / p99 / max (a commit whose record
  never arrived counts as missing);
  the figures again for the commits that are their table's first of the run (first use)
  and for the others (later), and all of these again for the commits of the first
  --warmup-seconds of the load (warm-up) and for those after (steady);
  where the tail is: each commit's latency against its time since publish started and
  whether a Python process of publish's tree (a writer's worker, a daemon) started from 3 s
  before the commit (the micro-batch it waited behind) until its first record (a watcher
  notes every process of the tree and its start time from /proc every 0.25 s): the figures
  split by that, the slowest commits listed, every commit in the JSON (`commits`), the
  Python processes' starts and ends; with --quiet-at, gaps without commits in the load
  (Spark stops the Python workers after a minute without a task), the commits after each
  reported apart like the warm-up's; with --hot-at, a window in which every commit goes to
  one table (a table written every second), its commits reported apart (`load.hot_table`);
- memory: RSS and PSS of the process tree at the end of each phase (smaps_rollup), and
  every --sample-every seconds of the load (the series, and its slope in MB/min over the
  last two thirds: a --load-seconds 1800 run is the 30-minute memory run).

With --s3, the database and its tables are on a local S3 server (`lance_cdf_devtools.S3Server`,
moto on 127.0.0.1, counting the requests it serves per table), created through LanceDB with
the server's storage options; publish gets them as a user gives them (`--storage-option
k=v`, the credentials as `${env:NAME}` read from its environment), and the benchmark's own
commits go through a User-Agent the server serves uncounted, so what it counts is publish's:

- idle: the requests over --idle-seconds (`idle_s3`), from --settle-seconds after publish
  follows every table (by default once every table has been quiet long enough to be listed
  only every --idle-poll-max, publish's, recorded as `publisher_idle_poll_max_s`): per
  table per minute (mean, max; one request per --idle-poll-max seconds expected), for all
  the tables per hour, and the database's own requests (its namespace manifest, the root
  listing) per hour apart, by key; the S3 server's own CPU;
- load: the same over the whole load, the quiet gaps included (`load.s3`), and per commit;
  the commits that are their table's first after a quiet gap reported apart
  (`load.first_to_table_after_quiet`; each commit's `table_quiet_s` and `first_after_quiet`
  in `commits`), beside the `after_quiet` phase and `restarts`.

The 200-table, 30-minute run on S3:

    python -m bench.spark.bench_database --s3 --tables 200 --idle-seconds 120 \
        --load-seconds 1800 --quiet-at 600 --quiet-seconds 120 --sample-every 60 \
        --out bench/results/results_database_s3.json

With --single, one single-table `lance-cdf publish --table` per table runs instead (each
its own Spark application, checkpoint and topic): the same phases, CPU and memory summed over
their trees (`--tables 4 --single`: what N separate publishers would take, scaled).

Writes the numbers as JSON (--out) and prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np
import pyarrow as pa

from bench.ops.bench_footprint import _children, sample, slope  # (the process-tree sampler)
from bench.support import stats
from bench.support.results import write_result
from bench.support.s3_counts import request_figures, requests_per_table, table_key, uncounted
from lance_cdf.spark.source.idle_polls import IDLE_BACKOFF, IDLE_POLL_MAX, IDLE_POLL_MAX_LOCAL
from lance_cdf_devtools import S3Server
from lance_cdf_devtools.commands import publish

STABLE = {"new_table_enable_stable_row_ids": "true"}
S3_BUCKET = "bench-database"
# --s3: publish gets the server's credentials as a user keeps secrets out of argv, from the
# environment through `--storage-option KEY=${env:NAME}`
S3_SECRET_ENV = {
    "aws_access_key_id": "BENCH_S3_ACCESS_KEY_ID",
    "aws_secret_access_key": "BENCH_S3_SECRET_ACCESS_KEY",
}


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of `root` and every descendant alive now, with what the
    children they reaped used (a Python worker Spark stopped took its CPU time with it
    otherwise: its daemon reaps it)."""
    kids = _children()
    total, stack = 0.0, [root]
    tick = os.sysconf("SC_CLK_TCK")
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick
        except (OSError, IndexError, ValueError):
            pass
        stack.extend(kids.get(pid, []))
    return total


def make_database(root: str, n: int, storage: dict[str, str] | None = None) -> dict[str, str]:
    """n tables of 20 rows (id, s), a tenth in namespace `ns`, with storage options
    `storage` (on S3): qualified name -> path (or s3:// URI)."""
    import lancedb

    db = lancedb.connect(root, storage_options=storage)
    db.create_namespace(["ns"])
    options = {**(storage or {}), **STABLE}
    out = {}
    for i in range(n):
        ids = np.arange(20)
        data = pa.table({"id": ids, "s": [f"a{j}" for j in ids]})
        if i % 10 == 0:
            t = db.create_table(f"t{i}", data, namespace_path=["ns"], storage_options=options)
            out[f"ns.t{i}"] = t.uri.removeprefix("file://")
        else:
            t = db.create_table(f"t{i}", data, storage_options=options)
            out[f"t{i}"] = t.uri.removeprefix("file://")
    return out


def s3_publish_flags(storage: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """publish's `--storage-option` flags for the S3 server's `storage` options, and the
    environment the credentials' `${env:NAME}` names read."""
    flags, env = [], {}
    for key, value in storage.items():
        if key in S3_SECRET_ENV:
            env[S3_SECRET_ENV[key]] = value
            value = "${env:" + S3_SECRET_ENV[key] + "}"
        flags += ["--storage-option", f"{key}={value}"]
    return flags, env


def idle_poll_max(publish_args: list[str], s3: bool = True) -> float:
    """The `--idle-poll-max` the database publisher runs with (its default for the storage
    if not given)."""
    value: str | None = None
    for i, arg in enumerate(publish_args):
        if arg == "--idle-poll-max" and i + 1 < len(publish_args):
            value = publish_args[i + 1]
        elif arg.startswith("--idle-poll-max="):
            value = arg.split("=", 1)[1]
    if value is None:
        return IDLE_POLL_MAX if s3 else IDLE_POLL_MAX_LOCAL
    return float(value)


class S3Window:
    """The requests the S3 server counted for the tables since `start()` (which resets the
    server's counts), and the server's own CPU."""

    def __init__(self, server: S3Server, keys: list[str]):
        self.server, self.keys = server, keys
        self.start()

    def start(self) -> None:
        self.server.request_counts_by_table(reset=True)
        self.t0, self.cpu0 = time.monotonic(), tree_cpu(self.server.pid or 0)

    def figures(self) -> dict:
        seconds = time.monotonic() - self.t0
        cpu = tree_cpu(self.server.pid or 0) - self.cpu0
        per, other = requests_per_table(self.server, self.keys)
        return {
            **request_figures(per, other, seconds),
            "requests": sum(per) + sum(sum(k.values()) for k in other.values()),
            "server_cpu_percent_of_one_core": round(100 * cpu / seconds, 1),
        }


def mark_quiet(rows: list[dict], quiet_ends: tuple[float, ...]) -> None:
    """Each commit row (in commit order) gets `table_quiet_s`, the time since its table's
    previous commit of the load (None for its first), and `first_after_quiet`, whether it is
    its table's first commit since the last quiet gap before it ended."""
    last: dict[str, float] = {}
    for r in rows:
        prev = last.get(r["topic"])
        r["table_quiet_s"] = None if prev is None else round(r["load_s"] - prev, 2)
        end = max((e for e in quiet_ends if e <= r["load_s"]), default=None)
        r["first_after_quiet"] = end is not None and (prev is None or prev < end)
        last[r["topic"]] = r["load_s"]


def _start_time(pid: int) -> float | None:
    """When `pid` started, on the time.time() clock (from /proc/PID/stat, 10 ms ticks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))


def _short_cmd(pid: int) -> str | None:
    """A Python process's module (`pyspark.daemon`, `lance_cdf.cli`...), else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    if not argv or "python" not in os.path.basename(argv[0]):
        return None
    return " ".join(argv[1:4]) or argv[0]


class TreeWatcher(threading.Thread):
    """Every Python process of the trees under `roots`: pid -> {start, end, cmd, parent}
    (times on the time.time() clock; `end` when it was first seen gone)."""

    def __init__(self, roots: list[int], every: float = 0.25):
        super().__init__(daemon=True)
        self.roots, self.every = roots, every
        self.seen: dict[int, dict] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            kids, alive = _children(), set()
            stack = [(r, None) for r in self.roots]
            while stack:
                pid, parent = stack.pop()
                alive.add(pid)
                if pid not in self.seen:
                    cmd = _short_cmd(pid)
                    start = _start_time(pid)
                    if cmd is not None and start is not None:
                        self.seen[pid] = {"start": start, "end": None, "cmd": cmd, "parent": parent}
                stack.extend((k, pid) for k in kids.get(pid, []))
            now = time.time()
            for pid, p in self.seen.items():
                if p["end"] is None and pid not in alive:
                    p["end"] = now
            self.stop.wait(self.every)

    def started_between(self, a: float, b: float) -> list[int]:
        return [pid for pid, p in self.seen.items() if a <= p["start"] <= b]


def percentile(values: list[float], q: float) -> float | None:
    return stats.percentile(values, q) if values else None


def latency_figures(latencies: list[float]) -> dict:
    return {
        "latency_s_p50": percentile(latencies, 50),
        "latency_s_p99": percentile(latencies, 99),
        "latency_s_max": max(latencies) if latencies else None,
    }


def tail_figures(rows: list[dict], warmup: float, quiet_ends: tuple[float, ...] = ()) -> dict:
    """The latency figures of the load's commits split by phase (the first `warmup` seconds
    of the load; the first `warmup` seconds after each quiet gap, which ends at
    `quiet_ends`; the rest, steady), first use / later within each, by whether a Python
    process started from 3 s before the commit until its record, the first five commits
    after the start and after each gap, and the slowest 2% listed."""

    def figures(sel: list[dict]) -> dict:
        got = [r["latency_s"] for r in sel if r["latency_s"] is not None]
        return {"commits": len(sel), "missing": len(sel) - len(got), **latency_figures(got)}

    def after_quiet(r: dict) -> bool:
        return any(0 <= r["load_s"] - end < warmup for end in quiet_ends)

    out: dict = {"warmup_seconds": warmup}
    phases = [("warmup", [r for r in rows if r["load_s"] < warmup])]
    if quiet_ends:
        phases.append(("after_quiet", [r for r in rows if after_quiet(r)]))
        # the commits that each are their table's first after a quiet gap (on object
        # storage, to a table listed only every --idle-poll-max by then)
        out["first_to_table_after_quiet"] = figures([r for r in rows if r["first_after_quiet"]])
    phases.append(("steady", [r for r in rows if r["load_s"] >= warmup and not after_quiet(r)]))
    out["restarts"] = [
        {
            "at_load_s": at,
            "first_latencies_s": [r["latency_s"] for r in rows if r["load_s"] >= at][:5],
        }
        for at in (0.0, *quiet_ends)
    ]
    for phase, sel in phases:
        out[phase] = figures(sel)
        out[phase]["first_use"] = figures([r for r in sel if r["first_use"]])
        out[phase]["later"] = figures([r for r in sel if not r["first_use"]])
    out["with_new_python_process"] = figures([r for r in rows if r["new_python"]])
    out["without_new_python_process"] = figures([r for r in rows if not r["new_python"]])
    done = sorted((r for r in rows if r["latency_s"] is not None), key=lambda r: -r["latency_s"])
    out["slowest"] = done[: max(3, len(done) // 50)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--idle-seconds", type=float, default=60)
    ap.add_argument("--load-seconds", type=float, default=120)
    ap.add_argument(
        "--sample-every",
        type=float,
        default=30,
        help="seconds between memory samples of the tree during the load",
    )
    ap.add_argument(
        "--warmup-seconds",
        type=float,
        default=60,
        help="commits of the load's first N seconds are reported apart (warm-up)",
    )
    ap.add_argument(
        "--quiet-at",
        type=float,
        action="append",
        default=[],
        help="a quiet gap (no commit) starting this many seconds into the load "
        "(repeatable): Spark stops Python workers idle for a minute",
    )
    ap.add_argument("--quiet-seconds", type=float, default=75)
    ap.add_argument(
        "--hot-at",
        type=float,
        default=None,
        help="a window starting this many seconds into the load in which every commit goes "
        "to one table (a table written every second), reported apart (`load.hot_table`)",
    )
    ap.add_argument("--hot-seconds", type=float, default=60)
    ap.add_argument(
        "--daemon-module",
        default=None,
        help="spark.python.daemon.module for publish (PYSPARK_SUBMIT_ARGS): "
        "pyspark.daemon for cold workers (publish's default for a local "
        "session is lance_cdf.spark.sink.warm_daemon, warm)",
    )
    ap.add_argument(
        "--fixed-phase",
        action="store_true",
        help="commits exactly a second apart (one phase to the trigger all run)",
    )
    ap.add_argument("--keep-log", default=None, help="copy publish's log here at the end")
    ap.add_argument(
        "--single",
        action="store_true",
        help="one single-table `lance-cdf publish --table` per table instead of "
        "the database publisher (the memory they take side by side)",
    )
    ap.add_argument(
        "--publish-arg",
        action="append",
        default=[],
        help="one more argument for the database publisher (repeatable; "
        "e.g. --publish-arg=--no-warm-workers)",
    )
    ap.add_argument(
        "--s3",
        action="store_true",
        help="the database on a local S3 server (lance_cdf_devtools.S3Server), publish given "
        "its storage options; the S3 requests of the idle phase and of the load",
    )
    ap.add_argument(
        "--commit-events",
        action="store_true",
        help="publish --commit-events: with --s3 an SQS queue on the S3 server that the "
        "bucket notifies of its new manifests (moto delivers them; its requests counted "
        "apart, under (sqs)), else `files` (the local database's file-system events)",
    )
    ap.add_argument(
        "--settle-seconds",
        type=float,
        default=None,
        help="seconds between following every table and the idle phase (default 20; with "
        "--s3 and the database publisher, 20 more than a table takes to be quiet long "
        "enough for publish's --idle-poll-max: the idle requests are the steady ones)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.settle_seconds is None:
        ceiling = idle_poll_max(args.publish_arg) if args.s3 and not args.single else 0.0
        args.settle_seconds = 20 + ceiling / IDLE_BACKOFF

    import lance
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    work = tempfile.mkdtemp(prefix="bench-database-")
    root, checkpoint = os.path.join(work, "db"), os.path.join(work, "ck")
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    result: dict = {
        "tables": args.tables,
        "idle_seconds": args.idle_seconds,
        "settle_seconds": args.settle_seconds,
        "load_seconds": args.load_seconds,
        "storage": "s3" if args.s3 else "local",
        "publisher_idle_poll_max_s": idle_poll_max(args.publish_arg, args.s3),
        "publisher_idle_poll_max_default_s": idle_poll_max([], args.s3),
    }
    procs: list[subprocess.Popen] = []
    try:
        with (
            KafkaBroker() as kafka,
            SchemaRegistry() as registry,
            S3Server(os.path.join(work, "s3")) if args.s3 else contextlib.nullcontext() as s3,
        ):
            writer, s3_flags, s3_env = None, [], {}
            if s3 is not None:  # the benchmark's own writes uncounted, publish's counted
                root = s3.create_bucket(S3_BUCKET) + "/db"
                writer = uncounted(s3.storage_options())
                s3_flags, s3_env = s3_publish_flags(s3.storage_options())
            if args.commit_events:
                from bench.spark.bench_commit_events import notified_queue

                queue = notified_queue(s3, S3_BUCKET) if s3 is not None else "files"
                s3_flags += ["--commit-events", queue]
                result["commit_events"] = queue
            t = time.monotonic()
            paths = make_database(root, args.tables, writer)
            result["create_tables_s"] = round(time.monotonic() - t, 1)
            topics = {name: f"{prefix}.{name}" for name in paths}
            admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
            for _topic, future in admin.create_topics(
                [NewTopic(tp, 2, 1) for tp in topics.values()]
            ).items():
                future.result(60)
            env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **s3_env}
            if args.daemon_module:
                result["daemon_module"] = args.daemon_module
                env["PYSPARK_SUBMIT_ARGS"] = (
                    f"--conf spark.python.daemon.module={args.daemon_module} pyspark-shell"
                )
            log = open(os.path.join(work, "publish.log"), "w")
            started = time.monotonic()
            if args.single:  # one publisher per table, each its own Spark application
                result["mode"] = "single-table publishers"
                for i, name in enumerate(sorted(paths)):
                    cmd = publish(
                        kafka.bootstrap_servers,
                        registry.url,
                        f"{checkpoint}-{i}",
                        table=paths[name],
                        topic=topics[name],
                        extra=s3_flags,
                    )
                    procs.append(
                        subprocess.Popen(
                            cmd, env=env, stdout=log, stderr=log, start_new_session=True
                        )
                    )
            else:
                result["mode"] = "database publisher"
                cmd = publish(
                    kafka.bootstrap_servers,
                    registry.url,
                    checkpoint,
                    database=root,
                    prefix=prefix,
                    extra=[*args.publish_arg, *s3_flags],
                )
                procs.append(
                    subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
                )
            report = os.path.join(checkpoint, "database-tables.json")
            while True:
                if any(p.poll() is not None for p in procs):
                    raise SystemExit(f"publish exited; see {log.name}")
                if args.single:  # every publisher has started its query
                    with open(log.name) as f:
                        if f.read().count("publishing ") >= len(procs):
                            break
                try:
                    with open(report) as f:
                        if len(json.load(f)["followed"]) == args.tables:
                            break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(1)
            result["follows_all_after_s"] = round(time.monotonic() - started, 1)
            started_wall = time.time() - (time.monotonic() - started)
            watcher = TreeWatcher([p.pid for p in procs])
            watcher.start()
            time.sleep(args.settle_seconds)  # start-up work (idle planner workers) settles

            def cpu() -> float:
                return sum(tree_cpu(p.pid) for p in procs)

            def memory_now(by_role: bool = False) -> tuple[dict, int]:
                taken = [sample(p.pid) for p in procs]
                total = {k: sum(m["total"][k] for m in taken) for k in ("rss", "pss", "uss")}
                mb: dict = {k: round(v / 1024) for k, v in total.items()}
                if by_role:  # which process grows: the JVM, the driver, the Python workers
                    mb["procs"] = [
                        {
                            "pid": q["pid"],
                            "role": q["role"],
                            "cmd": q["cmd"][-60:],
                            "rss": round(q["rss"] / 1024),
                            "pss": round(q["pss"] / 1024),
                        }
                        for m in taken
                        for q in m["procs"]
                    ]
                    roles = {r for m in taken for r in m["by_role"]}
                    mb["by_role"] = {
                        r: {
                            "n": sum(m["by_role"][r]["n"] for m in taken),
                            **{
                                k: round(sum(m["by_role"][r][k] for m in taken) / 1024)
                                for k in ("rss", "pss")
                            },
                        }
                        for r in sorted(roles)
                    }
                return mb, sum(m["n"] for m in taken)

            window = None if s3 is None else S3Window(s3, [table_key(p) for p in paths.values()])
            cpu0, t0 = cpu(), time.monotonic()
            time.sleep(args.idle_seconds)
            idle = (cpu() - cpu0) / (time.monotonic() - t0)
            result["idle_cpu_percent_of_one_core"] = round(100 * idle, 1)
            if window is not None:
                result["idle_s3"] = window.figures()
            result["idle_memory_mb"], result["idle_processes"] = memory_now()

            consumer = Consumer(
                {
                    "bootstrap.servers": kafka.bootstrap_servers,
                    "group.id": uuid.uuid4().hex,
                    "enable.auto.commit": False,
                }
            )
            consumer.assign(
                [TopicPartition(tp, p, OFFSET_END) for tp in topics.values() for p in (0, 1)]
            )
            arrived: dict[tuple[str, int], float] = {}
            stop = threading.Event()

            def consume() -> None:
                while not stop.is_set():
                    m = consumer.poll(0.2)
                    if m is None or m.error():
                        continue
                    h = dict(m.headers() or [])
                    version = h.get("lance-cdf.commit-version")
                    if version is not None:
                        arrived.setdefault((m.topic(), int(version)), time.time())

            reader = threading.Thread(target=consume, daemon=True)
            reader.start()
            time.sleep(5)  # the assignment takes effect
            rng = random.Random(35)
            commits: dict[tuple[str, int], float] = {}
            first_use: set[tuple[str, int]] = set()  # the table's first commit of the run
            memory: list[dict] = []
            if window is not None:
                window.start()
            cpu0, t0 = cpu(), time.monotonic()
            t0_wall = time.time()
            next_sample = t0
            quiet = sorted((at, at + args.quiet_seconds) for at in args.quiet_at)
            hot_name = sorted(paths)[0]
            hot_keys: set[tuple[str, int]] = set()
            result["quiet_gaps_load_s"] = quiet
            result["load_started_epoch_s"] = round(t0_wall, 3)
            while time.monotonic() - t0 < args.load_seconds:
                tick = time.monotonic()
                if tick >= next_sample:  # (the next one on the grid, none skipped in a gap)
                    mb, n = memory_now(by_role=True)
                    memory.append({"t": round(tick - t0, 1), "n": n, **mb})
                    next_sample += args.sample_every * (
                        1 + (tick - next_sample) // args.sample_every
                    )
                gap = next(((a, b) for a, b in quiet if a <= tick - t0 < b), None)
                if gap is not None:  # a quiet gap: no commit until it ends
                    time.sleep(max(0.0, min(t0 + gap[1], next_sample) - time.monotonic()))
                    continue
                hot = args.hot_at is not None and 0 <= tick - t0 - args.hot_at < args.hot_seconds
                name = hot_name if hot else rng.choice(sorted(paths))
                ds = lance.dataset(paths[name], storage_options=writer)
                ds.update({"s": f"'u{ds.version}'"}, where=f"id = {rng.randrange(20)}")
                done = time.time()
                key = (topics[name], lance.dataset(paths[name], storage_options=writer).version)
                if not any(t == topics[name] for t, _ in commits):
                    first_use.add(key)
                commits[key] = done
                if hot:
                    hot_keys.add(key)
                period = 1.0 if args.fixed_phase else rng.uniform(0.5, 1.5)
                time.sleep(max(0.0, period - (time.monotonic() - tick)))
            load_cpu = (cpu() - cpu0) / (time.monotonic() - t0)
            if memory:  # the series ends at the load's end
                mb, n = memory_now(by_role=True)
                memory.append({"t": round(time.monotonic() - t0, 1), "n": n, **mb})
            load_s3 = None if window is None else window.figures()
            time.sleep(15)  # the last commits' records
            stop.set()
            reader.join(5)
            consumer.close()
            watcher.stop.set()
            watcher.join(5)
            latencies = [arrived[k] - c for k, c in commits.items() if k in arrived]
            result["load"] = {
                "commits": len(commits),
                "missing": len(commits) - len(latencies),
                **latency_figures(latencies),
                "cpu_percent_of_one_core": round(100 * load_cpu, 1),
            }
            if load_s3 is not None:  # the quiet gaps included
                result["load"]["s3"] = {
                    **load_s3,
                    "requests_per_commit": round(load_s3["requests"] / max(1, len(commits)), 1),
                }
            for label, keys in (("first_use", first_use), ("later", set(commits) - first_use)):
                got = [arrived[k] - commits[k] for k in keys if k in arrived]
                result["load"][label] = {
                    "commits": len(keys),
                    "missing": len(keys) - len(got),
                    **latency_figures(got),
                }
            rows = []
            for k, c in sorted(commits.items(), key=lambda kv: kv[1]):
                got = arrived.get(k)
                rows.append(
                    {
                        "topic": k[0],
                        "version": k[1],
                        "load_s": round(c - t0_wall, 2),
                        "since_publish_start_s": round(c - started_wall, 2),
                        # where in the second it landed (the trigger fires on whole seconds)
                        "phase_s": round(c % 1.0, 3),
                        "latency_s": None if got is None else round(got - c, 3),
                        "first_use": k in first_use,
                        "hot": k in hot_keys,
                        # a worker started for this commit's micro-batch, or for the one before
                        # that it waited behind
                        "new_python": [] if got is None else watcher.started_between(c - 3, got),
                    }
                )
            ends = tuple(b for _, b in quiet)
            mark_quiet(rows, ends)
            result["load"].update(tail_figures(rows, args.warmup_seconds, ends))
            if hot_keys:  # the table written every second (its first commit of the run apart)
                result["load"]["hot_table"] = tail_figures([r for r in rows if r["hot"]], 0.0)[
                    "steady"
                ]
            result["commits"] = rows
            result["python_processes"] = [
                {
                    "pid": pid,
                    "cmd": p["cmd"],
                    "parent": p["parent"],
                    "start_load_s": round(p["start"] - t0_wall, 2),
                    "end_load_s": None if p["end"] is None else round(p["end"] - t0_wall, 2),
                }
                for pid, p in sorted(watcher.seen.items(), key=lambda kv: kv[1]["start"])
            ]
            if memory:
                result["load_memory_series_mb"] = memory
                result["load_rss_mb_per_min_last_two_thirds"] = round(
                    slope([m["t"] for m in memory], [m["rss"] * 1024 for m in memory]), 2
                )
                result["load_pss_mb_per_min_last_two_thirds"] = round(
                    slope([m["t"] for m in memory], [m["pss"] * 1024 for m in memory]), 2
                )
                result["load_rss_mb_per_min_last_two_thirds_by_role"] = {
                    r: round(
                        slope(
                            [m["t"] for m in memory],
                            [m["by_role"].get(r, {}).get("rss", 0) * 1024 for m in memory],
                        ),
                        2,
                    )
                    for r in memory[-1]["by_role"]
                }
            result["load_memory_mb"], result["load_processes"] = memory_now()
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                p.wait(120)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        if args.keep_log and os.path.exists(os.path.join(work, "publish.log")):
            shutil.copy(os.path.join(work, "publish.log"), args.keep_log)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=1))
    write_result(args.out, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
