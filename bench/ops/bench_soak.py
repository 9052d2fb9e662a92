"""The pipeline as a user runs it, for a long time or under load.

    # a 30-minute soak, then load
    python -m bench.ops.bench_soak --phase quiet=27 --phase quiet-end=3 --phase loaded=3 \
        --out bench/results/results_soak.json --chart bench/figures/soak.png
    # latency under load
    python -m bench.ops.bench_soak --phase quiet=3 --phase loaded=3 \
        --out bench/results/results_load.json

Starts a real local broker and Apicurio registry (lance_cdf_devtools), a table (--rows rows
with a --dim float32 vector) and a 3-partition topic, then `lance-cdf publish` and
`lance-cdf replicate` with their defaults, each a subprocess in its own session, and a
writer committing about once a second (append / update / delete / merge_insert in turn).
Phases run one after the other; a `loaded` phase runs one CPU-bound process per core
(`python -c 'while 1: pass'`) beside the pipeline.

Measured, per commit version (wall clock; all processes on this host):
  * commit -> Kafka: the writer's commit returning -> the version's first record read by an
    outside consumer (read_committed, its own group) of the data topic; and -> its END
    record on the transaction topic read by that consumer;
  * commit -> replica: -> the replica's newest commit recording a source version >= it
    (polled every --poll seconds);
  * where the time goes: the first record's and the END's Kafka CreateTime (set when the
    publisher's writer task / driver produced them), so commit -> produced, produced ->
    readable (the Kafka transaction commit), END produced -> replica; and Spark's own
    durations per micro-batch from the query progress events (the event log of the
    publisher's Spark application, written under the work directory).
  * every --every seconds the memory of both process trees (/proc/PID/smaps_rollup, by
    role as in bench_footprint.py) and the load average. Growth: a least-squares slope
    (MB/min) over the last two thirds of the run.
With --extra-replicator LABEL[:KEY=VALUE,...], another `lance-cdf replicate` of the same
topic (its own group and replica) runs beside the first with those environment variables:
its memory series is sampled as `replicate-LABEL`, side by side with the default one under
the same load (e.g. `nokeep:LANCE_CDF_KEEP_FREED_MEMORY=0`).
Versions are attributed to the phase in which they were committed. Writes the results JSON
(series included) and, with --chart, a PNG of the RSS series and the latencies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import lance
import numpy as np
import pyarrow as pa

from bench.ops.bench_footprint import make_table, sample, slope, summarize
from bench.support import stats
from bench.support.results import write_result

VERSION_HEADER = "lance-cdf.commit-version"


def writer(
    path: str, dim: int, rows: int, stop: threading.Event, commits: list, jitter: float = 0.0
) -> None:
    """A commit about once a second: append 100 / update 50 / delete 20 / merge_insert 100
    (50 existing ids, 50 new) in turn; (version, op, commit wall time) into `commits`.
    `jitter` j: each period drawn from [1 - j, 1 + j] s (mean 1 s), so commits land at
    every phase of the publisher's trigger, as a user's do, not locked to one."""
    rng = np.random.default_rng(1)
    timing = np.random.default_rng()
    next_id = 10**9
    i = 0

    def new_rows(ids: np.ndarray) -> pa.Table:
        n = len(ids)
        vec = pa.FixedSizeListArray.from_arrays(
            pa.array(rng.random(n * dim, dtype=np.float32)), dim
        )
        return pa.table(
            {
                "id": pa.array(ids.astype(np.int64)),
                "name": pa.array([f"n{j}" for j in ids]),
                "score": pa.array(rng.random(n)),
                "vec": vec,
            }
        )

    while not stop.is_set():
        t = time.monotonic()
        ds = lance.dataset(path)
        kind = ("append", "update", "delete", "merge_insert")[i % 4]
        if kind == "append":
            ds.insert(new_rows(np.arange(next_id, next_id + 100)))
            next_id += 100
        elif kind == "update":
            lo = int(rng.integers(0, rows))
            ds.update({"score": "score + 1.0"}, where=f"id >= {lo} AND id < {lo + 50}")
        elif kind == "delete":
            lo = int(rng.integers(0, rows))
            ds.delete(f"id >= {lo} AND id < {lo + 20}")
        else:
            lo = int(rng.integers(0, rows))
            ids = np.concatenate([np.arange(lo, lo + 50), np.arange(next_id, next_id + 50)])
            next_id += 50
            (
                ds.merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(new_rows(ids))
            )
        done = time.time()
        commits.append((lance.dataset(path).version, kind, done))
        i += 1
        period = 1.0 + (timing.uniform(-jitter, jitter) if jitter else 0.0)
        stop.wait(max(0.0, period - (time.monotonic() - t)))


class OutsideConsumer(threading.Thread):
    """Reads the data and transaction topics as a consumer the project did not configure
    for itself would: per version, when its first record and its END became readable."""

    def __init__(self, bootstrap: str, registry_url: str, topic: str, txn_topic: str):
        super().__init__(daemon=True)
        from confluent_kafka import Consumer
        from confluent_kafka.schema_registry import SchemaRegistryClient

        from lance_cdf.kafka.transactions import TransactionDecoder

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"soak-outside-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 20,
            }
        )
        self.consumer.subscribe([topic, txn_topic])
        self.topic, self.txn_topic = topic, txn_topic
        self.decoder = TransactionDecoder(SchemaRegistryClient({"url": registry_url}))
        self.first: dict[int, tuple[float, float]] = {}  # version -> (read, CreateTime)
        self.end: dict[int, tuple[float, float]] = {}
        self.records = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(1000, 0.1):
                now = time.time()
                if msg.error() is not None:
                    continue
                created = msg.timestamp()[1] / 1000.0
                if msg.topic() == self.txn_topic:
                    rec = self.decoder.decode(msg.value())
                    if rec.status == "END":
                        self.end.setdefault(rec.version, (now, created))
                    continue
                self.records += 1
                for key, value in msg.headers() or []:
                    if key == VERSION_HEADER and value is not None:
                        self.first.setdefault(int(value), (now, created))
                        break
        self.consumer.close()


class ReplicaWatcher(threading.Thread):
    """Polls the replica: when each source version it records first appeared."""

    def __init__(self, target: str, poll: float):
        super().__init__(daemon=True)
        self.target, self.poll = target, poll
        self.recorded: list[tuple[float, int]] = []  # (wall time, source version)
        self.stop = threading.Event()

    def run(self) -> None:
        from lance_cdf.replicate.replica import SOURCE_VERSION_PROPERTY

        seen = -1
        while not self.stop.wait(self.poll):
            try:
                ds = lance.dataset(self.target)
            except (ValueError, OSError):
                continue  # not created yet
            if ds.version == seen:
                continue
            now = time.time()
            seen = ds.version
            try:
                tx = ds.read_transaction(ds.version)
            except TypeError:  # pylance 14 cannot decode a compaction's transaction on an
                continue  # indexed table (RewrittenIndex): not a commit with a position
            props = (tx.transaction_properties or {}) if tx is not None else {}
            if SOURCE_VERSION_PROPERTY in props:
                self.recorded.append((now, int(props[SOURCE_VERSION_PROPERTY])))


def replica_commits(target: str) -> list[tuple[float, int]]:
    """(commit time, recorded source version) of every replica version that recorded one,
    from the replica's manifests (exact, unlike polling)."""
    from lance_cdf.replicate.replica import SOURCE_VERSION_PROPERTY

    ds = lance.dataset(target)
    out = []
    for v in ds.versions():
        try:
            tx = ds.read_transaction(v["version"])
        except TypeError:  # a compaction pylance cannot decode (see ReplicaWatcher)
            continue
        props = (tx.transaction_properties or {}) if tx is not None else {}
        if SOURCE_VERSION_PROPERTY in props:
            out.append((v["timestamp"].timestamp(), int(props[SOURCE_VERSION_PROPERTY])))
    return sorted(out)


def replica_times(recorded: list[tuple[float, int]], versions: list[int]) -> dict[int, float]:
    """version -> when the replica first recorded a source version >= it."""
    out: dict[int, float] = {}
    order = sorted(versions)
    i = 0
    for t, v in recorded:
        while i < len(order) and order[i] <= v:
            out[order[i]] = t
            i += 1
    return out


def pct(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    a = np.array(xs) * 1000.0
    return {
        "n": len(xs),
        "p50_ms": round(stats.percentile(a, 50), 1),
        "p90_ms": round(stats.percentile(a, 90), 1),
        "p99_ms": round(stats.percentile(a, 99), 1),
        "max_ms": round(float(a.max()), 1),
    }


def spark_progress(event_dir: str) -> list[dict]:
    """The publisher's micro-batch progress reports from its Spark event log."""
    out = []
    paths = [os.path.join(d, n) for d, _, names in os.walk(event_dir) for n in names]
    for path in paths:  # Spark 4 rolls its event log: a directory of files per application
        if path.endswith((".crc", ".zstd", ".lz4", ".snappy")) or "appstatus" in path:
            continue
        with open(path, errors="replace") as f:
            for line in f:
                if "QueryProgressEvent" not in line:
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                prog = ev.get("progress") or {}
                out.append(
                    {
                        "batch": prog.get("batchId"),
                        "timestamp": prog.get("timestamp"),
                        "durationMs": prog.get("durationMs") or {},
                        "rows": prog.get("numInputRows"),
                    }
                )
    return out


def durations_between(progress: list[dict], lo: float, hi: float) -> dict:
    """p50/p99 of each Spark duration over the micro-batches that read rows in [lo, hi)."""
    import datetime

    keep = []
    for p in progress:
        ts = p["timestamp"]
        if not ts or not p["rows"]:
            continue
        t = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
        if lo <= t < hi:
            keep.append(p["durationMs"])
    out: dict = {"batches": len(keep)}
    for key in sorted({k for d in keep for k in d}):
        vals = [d[key] for d in keep if key in d]
        out[key] = {
            "p50_ms": round(stats.percentile(vals, 50), 1),
            "p99_ms": round(stats.percentile(vals, 99), 1),
        }
    return out


def _core_dumps() -> None:
    """(in the child) a crash leaves `core` in the work directory, which is kept: the
    replicator died of SIGSEGV at start in 2 of ~15 runs with nothing in its log, its
    faulthandler silent (a fault its handler could not run for)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def hogs(n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", "while 1: pass"], start_new_session=True)
        for _ in range(n)
    ]


def stop_tree(proc: subprocess.Popen, timeout: float = 60) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument(
        "--phase", action="append", default=None, help="NAME=MINUTES, NAME quiet or loaded"
    )
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before phase 1")
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--poll", type=float, default=0.05)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(sys.executable), "lance-cdf"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--chart", default=None)
    ap.add_argument("--reanalyze", default=None, help="a .raw.json of an earlier run")
    ap.add_argument("--replica-copy", default=None, help="with --reanalyze: its replica")
    ap.add_argument(
        "--jitter",
        type=float,
        default=0.5,
        help="writer period drawn from [1-J, 1+J] s (0: exactly 1 s, locked "
        "to the 1-s trigger's phase)",
    )
    ap.add_argument(
        "--publish-arg",
        action="append",
        default=[],
        help="an extra argument for `lance-cdf publish` (repeatable)",
    )
    ap.add_argument(
        "--extra-replicator",
        action="append",
        default=[],
        help="LABEL[:KEY=VALUE,...]: another replicator of the topic with this environment, "
        "its memory sampled beside the first (repeatable)",
    )
    args = ap.parse_args()
    if args.reanalyze:
        with open(args.reanalyze) as f:
            raw = json.load(f)
        if args.replica_copy:  # a copy of the replica taken during the run
            raw["replica_commits"] = replica_commits(args.replica_copy)
        analyze(raw, args)
        return
    phases = [(p.split("=")[0], float(p.split("=")[1])) for p in (args.phase or ["quiet=30"])]
    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    work = tempfile.mkdtemp(prefix="bench-soak-")
    failed: list[str] = []  # processes that exited during the run: the work dir is kept
    table = os.path.join(work, "source.lance")
    target = os.path.join(work, "replica.lance")
    events = os.path.join(work, "spark-events")
    os.makedirs(events)
    make_table(table, args.rows, args.dim)
    topic = f"soak-{uuid.uuid4().hex[:6]}"
    results: dict = {
        "rows": args.rows,
        "dim": args.dim,
        "phases": phases,
        "warmup_s": args.warmup,
        "bin": args.bin,
        "cpus": os.cpu_count(),
        "jitter": args.jitter,
        "publish_args": args.publish_arg,
    }
    procs: list[subprocess.Popen] = []
    running_hogs: list[subprocess.Popen] = []
    try:
        with KafkaBroker() as kafka, SchemaRegistry() as registry:
            admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
            admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
            common = [
                "--bootstrap-servers",
                kafka.bootstrap_servers,
                "--topic",
                topic,
                "--schema-registry",
                registry.url,
            ]
            env = dict(os.environ)
            # the publisher's micro-batch durations, from Spark's event log (not a setting
            # publish makes: a measurement only)
            env["PYSPARK_SUBMIT_ARGS"] = (
                f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{events}"
                " --conf spark.eventLog.compress=false"
                " pyspark-shell"
            )
            pub_log = open(os.path.join(work, "publish.log"), "w")
            rep_log = open(os.path.join(work, "replicate.log"), "w")
            # from the work directory: Spark starts its Python processes with `python -m`
            # (working directory first on sys.path), so from a checkout they would import
            # that checkout's lance_cdf, not --bin's
            pub = subprocess.Popen(
                [
                    os.path.abspath(args.bin),
                    "publish",
                    "--table",
                    table,
                    *common,
                    "--checkpoint",
                    os.path.join(work, "ck"),
                    *args.publish_arg,
                ],
                stdout=pub_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=work,
            )
            procs.append(pub)
            rep = subprocess.Popen(
                [os.path.abspath(args.bin), "replicate", *common, "--target", target],
                stdout=rep_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=work,
                preexec_fn=_core_dumps,
            )
            procs.append(rep)
            extras: dict[str, subprocess.Popen] = {}
            for spec in args.extra_replicator:
                label, _, kvs = spec.partition(":")
                x_env = dict(os.environ)
                x_env.update(kv.split("=", 1) for kv in kvs.split(",") if kv)
                extras[label] = subprocess.Popen(
                    [
                        os.path.abspath(args.bin),
                        "replicate",
                        *common,
                        "--target",
                        os.path.join(work, f"replica-{label}.lance"),
                        "--group-id",
                        f"lance-cdf-replicate-{topic}-{label}",
                    ],
                    stdout=open(os.path.join(work, f"replicate-{label}.log"), "w"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=work,
                    env=x_env,
                    preexec_fn=_core_dumps,
                )
                procs.append(extras[label])
            txn_topic = f"{topic}.transaction"
            deadline = time.time() + 120  # publish creates it before its JVM starts: a
            while time.time() < deadline:  # subscription to a topic not there yet waits
                if txn_topic in admin.list_topics(timeout=10).topics:  # for a metadata
                    break  # refresh (5 min)
                time.sleep(0.2)
            consumer = OutsideConsumer(kafka.bootstrap_servers, registry.url, topic, txn_topic)
            consumer.start()
            watcher = ReplicaWatcher(target, args.poll)
            watcher.start()
            commits: list = []
            stop = threading.Event()
            w = threading.Thread(
                target=writer,
                args=(table, args.dim, args.rows, stop, commits, args.jitter),
                daemon=True,
            )
            w.start()
            series: list[dict] = []
            bounds: list[tuple[str, float, float]] = []
            t0 = time.time()

            def tick(phase: str) -> None:
                for p in procs:
                    if p.poll() is not None:
                        failed.append(p.args[1])  # its logs are kept
                        raise SystemExit(f"{p.args[1]} exited {p.returncode}; logs in {work}")
                s_pub, s_rep = sample(pub.pid), sample(rep.pid)
                series.append(
                    {
                        "t": round(time.time() - t0, 1),
                        "phase": phase,
                        "load": os.getloadavg(),
                        "publish": s_pub,
                        "replicate": s_rep,
                        **{f"replicate-{k}": sample(x.pid) for k, x in extras.items()},
                    }
                )
                print(
                    f"[{phase}] {time.time() - t0:6.0f}s publish rss="
                    f"{s_pub['total']['rss'] / 1024:7.1f} (n={s_pub['n']}, jvm "
                    f"{s_pub['by_role']['jvm']['rss'] / 1024:6.1f}) replicate rss="
                    f"{s_rep['total']['rss'] / 1024:6.1f} commits={len(commits)} "
                    f"kafka v{max(consumer.end, default=0)} replica "
                    f"v{watcher.recorded[-1][1] if watcher.recorded else 0} "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )

            end = time.time() + args.warmup
            while time.time() < end:
                tick("warmup")
                time.sleep(args.every)
            for name, minutes in phases:
                lo = time.time()
                if name == "loaded":
                    running_hogs = hogs(os.cpu_count() or 2)
                end = lo + minutes * 60
                while time.time() < end:
                    tick(name)
                    time.sleep(min(args.every, max(0.0, end - time.time())))
                for h in running_hogs:
                    h.kill()
                    h.wait()
                running_hogs = []
                bounds.append((name, lo, time.time()))
            stop.set()
            w.join()
            time.sleep(15)  # the last commits reach Kafka and the replica
            consumer.stop.set()
            watcher.stop.set()
            consumer.join(10)
            watcher.join(10)
            for p in procs:
                stop_tree(p)
            pub_log.close()
            rep_log.close()
            try:
                progress = spark_progress(events)
            except OSError as exc:
                print(f"no Spark progress events: {exc}", flush=True)
                progress = []
            try:
                committed = replica_commits(target)
            except (OSError, ValueError) as exc:
                print(f"replica versions not read: {exc}", flush=True)
                committed = []
            raw = {
                "results": results,
                "replica_commits": committed,
                "commits": commits,
                "first": {str(v): x for v, x in consumer.first.items()},
                "end": {str(v): x for v, x in consumer.end.items()},
                "records": consumer.records,
                "recorded": watcher.recorded,
                "series": series,
                "bounds": bounds,
                "t0": t0,
                "progress": progress,
            }
            if args.out:  # the raw observations first: --reanalyze redoes what follows
                with open(args.out.removesuffix(".json") + ".raw.json", "w") as f:
                    json.dump(raw, f)
            analyze(raw, args)
    finally:
        for h in running_hogs:
            h.kill()
        for p in procs:
            if p.poll() is None:
                stop_tree(p, 10)
        if not failed:
            shutil.rmtree(work, ignore_errors=True)


def analyze(raw: dict, args: argparse.Namespace) -> None:
    """Latency per phase, memory growth, the results JSON and the chart, from the raw
    observations of a run."""
    results = raw["results"]
    commits = [tuple(c) for c in raw["commits"]]
    first_at = {int(v): tuple(x) for v, x in raw["first"].items()}
    end_at = {int(v): tuple(x) for v, x in raw["end"].items()}
    # the replica's own commit times where known (the poller's otherwise)
    recorded = [tuple(r) for r in (raw.get("replica_commits") or raw["recorded"])]
    results["replica_times_from"] = "manifests" if raw.get("replica_commits") else "polling"
    series, bounds, t0, progress = raw["series"], raw["bounds"], raw["t0"], raw["progress"]
    rtimes = replica_times(recorded, [v for v, _, _ in commits])
    results["phase_results"] = []
    for name, lo, hi in bounds:
        mine = [(v, k, t) for v, k, t in commits if lo <= t < hi]
        first = [first_at[v][0] - t for v, _, t in mine if v in first_at]
        endr = [end_at[v][0] - t for v, _, t in mine if v in end_at]
        produced = [first_at[v][1] - t for v, _, t in mine if v in first_at]
        readable = [first_at[v][0] - first_at[v][1] for v, _, _ in mine if v in first_at]
        end_made = [end_at[v][1] - t for v, _, t in mine if v in end_at]
        to_rep = [rtimes[v] - t for v, _, t in mine if v in rtimes]
        end_to_rep = [rtimes[v] - end_at[v][0] for v, _, _ in mine if v in rtimes and v in end_at]
        loads = [s["load"][0] for s in series if lo - t0 <= s["t"] < hi - t0]
        res = {
            "phase": name,
            "seconds": round(hi - lo, 1),
            "commits": len(mine),
            "load1_mean": round(float(np.mean(loads)), 2) if loads else None,
            "load1_max": round(float(np.max(loads)), 2) if loads else None,
            "commit_to_kafka_first_record": pct(first),
            "commit_to_kafka_end": pct(endr),
            "commit_to_replica": pct(to_rep),
            "split": {
                "commit_to_first_record_produced": pct(produced),
                "first_record_produced_to_readable": pct(readable),
                "commit_to_end_produced": pct(end_made),
                "end_read_to_replica": pct(end_to_rep),
            },
            "spark_durations": durations_between(progress, lo, hi),
            "missing": {
                "kafka_end": len([1 for v, _, _ in mine if v not in end_at]),
                "replica": len([1 for v, _, _ in mine if v not in rtimes]),
            },
        }
        results["phase_results"].append(res)
        print(json.dumps(res, indent=1), flush=True)
    memory = {}
    # memory: the quiet phases after the warm-up (a loaded phase at the end is left out)
    steady = [s for s in series if s["phase"].startswith("quiet")] or series
    trees = [k for k in series[0] if k not in ("t", "phase", "load")]  # + extra replicators
    for role in trees:
        samples = [s[role] for s in steady]
        summ = summarize(samples)
        ts = [s["t"] for s in steady]
        summ["total"]["rss_growth_mb_min"] = round(
            slope(ts, [s["total"]["rss"] for s in samples]), 2
        )
        memory[role] = summ
    results["memory"] = memory
    print(json.dumps(memory, indent=1), flush=True)
    results["outside_consumer_records"] = raw["records"]
    results["series"] = [
        {
            "t": s["t"],
            "phase": s["phase"],
            "load": s["load"],
            **{
                role: {"n": s[role]["n"], "total": s[role]["total"], "by_role": s[role]["by_role"]}
                for role in trees
            },
        }
        for s in series
    ]
    results["latencies"] = [
        {
            "version": v,
            "op": k,
            "kafka_s": round(first_at[v][0] - t, 3) if v in first_at else None,
            "end_s": round(end_at[v][0] - t, 3) if v in end_at else None,
            "replica_s": round(rtimes[v] - t, 3) if v in rtimes else None,
            "t": round(t - t0, 1),
        }
        for v, k, t in commits
    ]
    write_result(args.out, results, indent=1)
    if args.chart:
        chart(results, args.chart)


def chart(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    t = [s["t"] / 60 for s in results["series"]]
    for role in ("publish", "replicate"):
        ax1.plot(
            t, [s[role]["total"]["rss"] / 1024 for s in results["series"]], label=f"{role} tree RSS"
        )
    ax1.plot(
        t,
        [s["publish"]["by_role"]["jvm"]["rss"] / 1024 for s in results["series"]],
        label="publish: JVM RSS",
        linestyle="--",
    )
    ax1.set_ylabel("MB")
    ax1.legend()
    ax1.grid(True)
    lat = results["latencies"]
    for key, label in (
        ("kafka_s", "commit -> Kafka (first record)"),
        ("replica_s", "commit -> replica"),
    ):
        pts = [(r["t"] / 60, r[key]) for r in lat if r[key] is not None]
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], ".", markersize=2, label=label)
    ax2.set_ylabel("seconds")
    ax2.set_xlabel("minutes")
    ax2.legend()
    ax2.grid(True)
    fig.suptitle("lance-cdf publish + replicate, a commit a second")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    sys.exit(main())
