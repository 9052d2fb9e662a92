"""Commits made while `lance-cdf publish` starts: commit -> first record in Kafka.

    python -m bench.spark.bench_startup_commits [--before DIR] [--runs 1] [--out FILE]

Starts a local broker and registry and a 1-row table, then a writer thread that appends a
row once a second (each commit's time noted when it returns) and a consumer that notes
when the first record of each commit version (its `lance-cdf.commit-version` header)
arrives. Then, per run: `lance-cdf publish` (not `--available-now`) is launched on a new
checkpoint at `--starting-version` the next version (a first start: the head start applies)
and left running `--run-s` seconds, stopped with SIGTERM, and after `--pause-s` seconds
launched again on the same checkpoint (a restart: the commits made meanwhile wait at
launch) for another `--run-s` seconds. Reports, for each launch, the commits that landed
from launch to `--startup-s` seconds after it ("during start-up") and those after that
("steady state"): the largest and median commit -> Kafka delay, with the stages `publish`
printed. With `--before DIR`: the same runs with the lance_cdf package of DIR (another
checkout) on PYTHONPATH, alternating with this one. With `--database`: `publish --database`
over a database holding that one table (its topic `<prefix>.t`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import uuid

import lance
import pyarrow as pa
from confluent_kafka import Consumer

from bench.support import stats
from bench.support.results import write_result
from lance_cdf_devtools.commands import publish, spark_env


class Writer(threading.Thread):
    """Appends one row a second to `uri`; `times[version]`: when its commit returned."""

    def __init__(self, uri: str):
        super().__init__(daemon=True)
        self.uri, self.times, self.stop = uri, {}, threading.Event()

    def run(self) -> None:
        n = lance.dataset(self.uri).count_rows()
        while not self.stop.wait(max(0.0, 1.0 - (time.time() % 1.0))):
            ds = lance.write_dataset(pa.table({"id": [n]}), self.uri, mode="append")
            self.times[ds.version] = time.time()
            n += 1


class Arrivals(threading.Thread):
    """Per commit version of `topic`: when its first record arrived."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.first: dict[int, float] = {}
        self.stop = threading.Event()
        self.c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": topic,
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 200,
                "fetch.wait.max.ms": 20,
            }
        )
        self.c.subscribe([topic])

    def run(self) -> None:
        while not self.stop.is_set():
            m = self.c.poll(0.05)
            if m is None or m.error():
                continue
            now = time.time()
            for k, v in m.headers() or []:
                if k == "lance-cdf.commit-version":
                    self.first.setdefault(int(v), now)
        self.c.close()


def launch(cmd: list[str], code_dir: str | None, log: str) -> subprocess.Popen[bytes]:
    """`cmd` with the lance_cdf package of `code_dir` (None: this checkout's), run in the
    log's directory (`python -m` puts its working directory first on the path)."""
    env = spark_env()
    if code_dir:
        env["PYTHONPATH"] = code_dir
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=os.path.dirname(log)
        )


def summary(
    writer: Writer, arrivals: Arrivals, launched: float, until: float, startup_s: float
) -> dict[str, object]:
    """Commit -> Kafka delays of the commits that landed in [launched, until)."""
    time.sleep(3)  # the last commits' records
    phases: dict[str, list[tuple[int, float, float | None]]] = {"startup": [], "steady": []}
    for version, t in sorted(writer.times.items()):
        if not launched <= t < until:
            continue
        got = arrivals.first.get(version)
        phase = "startup" if t < launched + startup_s else "steady"
        phases[phase].append((version, round(t - launched, 1), None if got is None else got - t))
    out: dict[str, object] = {}
    for phase, rows in phases.items():
        delays = [d for _, _, d in rows if d is not None]
        out[phase] = {
            "commits": len(rows),
            "missing": [v for v, _, d in rows if d is None],
            "max_s": round(max(delays), 2) if delays else None,
            "median_s": round(stats.median(delays), 2) if delays else None,
            "delays": [(v, at, None if d is None else round(d, 2)) for v, at, d in rows],
        }
    return out


def one_run(label, code_dir, kafka, registry, uri, workdir, writer, args) -> dict:
    prefix = f"during{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.t" if args.database else prefix  # (a database's: <prefix>.<table>)
    arrivals = Arrivals(kafka.bootstrap_servers, topic)
    arrivals.start()
    checkpoint = os.path.join(workdir, f"ck-{topic}")
    start = ["--starting-version", str(lance.dataset(uri).version + 1)]
    if args.database:
        database = os.path.dirname(uri)
        cmd = publish(
            kafka.bootstrap_servers,
            registry.url,
            checkpoint,
            database=database,
            prefix=prefix,
            extra=start,
        )
    else:
        cmd = publish(
            kafka.bootstrap_servers, registry.url, checkpoint, table=uri, topic=topic, extra=start
        )
    log = os.path.join(workdir, f"{topic}.log")
    result: dict[str, object] = {"label": label, "log": log}
    for launch_name in ("first start", "restart"):
        t0 = time.time()
        proc = launch(cmd, code_dir, log)
        time.sleep(args.run_s)
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        stopped = time.time()
        # (the commits of the last 2 s before the stop may be left to the next launch)
        window = t0 + args.run_s - 2
        result[launch_name] = summary(writer, arrivals, t0, window, args.startup_s)
        if launch_name == "first start":
            time.sleep(max(0.0, args.pause_s - (time.time() - stopped)))
    arrivals.stop.set()
    text = open(log).read()
    result["stages"] = re.findall(r"start-up [0-9.]+ s: [^)]*", text)
    result["head_start"] = [ln for ln in text.splitlines() if ln.startswith("head start")]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--before", default=None, help="a checkout whose lance_cdf is 'before'")
    ap.add_argument("--run-s", type=float, default=45.0)
    ap.add_argument("--startup-s", type=float, default=30.0)
    ap.add_argument("--pause-s", type=float, default=3.0)
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    ap.add_argument(
        "--database", action="store_true", help="publish --database over a database of that table"
    )
    args = ap.parse_args()
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    workdir = tempfile.mkdtemp(prefix="bench-during-")
    uri = os.path.join(workdir, "db", "t.lance")
    lance.write_dataset(pa.table({"id": [0]}), uri, enable_stable_row_ids=True)
    results = []
    paths = (("before", args.before), ("after", None))
    with KafkaBroker() as kafka, SchemaRegistry() as registry:
        writer = Writer(uri)
        writer.start()
        for _ in range(args.runs):
            for label, code in paths:
                if label == "before" and not code:
                    continue
                r = one_run(label, code, kafka, registry, uri, workdir, writer, args)
                results.append(r)
                for launch_name in ("first start", "restart"):
                    phases = r[launch_name]
                    print(
                        label,
                        launch_name,
                        json.dumps(
                            {
                                p: {k: v for k, v in s.items() if k != "delays"}
                                for p, s in phases.items()
                            }
                        ),
                        flush=True,
                    )
                print(label, "stages", r["stages"], r["head_start"], flush=True)
        writer.stop.set()
    write_result(args.out, results, indent=1)


if __name__ == "__main__":
    main()
