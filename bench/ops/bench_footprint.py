"""The publisher's footprint: memory of `lance-cdf publish`'s process tree.

    python -m bench.ops.bench_footprint --minutes 5 --variant after=.venv/bin/lance-cdf \
        --variant before=/work/main/.venv/bin/lance-cdf --out bench/results/results_footprint.json

Starts a real local broker and Apicurio registry (lance_cdf_devtools), a small table
(--rows rows with a --dim float32 vector), then for each --variant LABEL=LANCE_CDF_BIN in
turn (alternately, --rounds times): `lance-cdf publish` with defaults as a subprocess in its
own session, a writer committing about once a second (append / update / delete in turn),
and every --every seconds the memory of every process in publish's tree from
/proc/PID/smaps_rollup: RSS, PSS (shared pages divided among the processes sharing them:
the honest sum over forked workers, whose RSS double counts) and USS (private pages),
grouped by role (JVM, publish, Python daemon, Python workers, other). Prints a table per
variant and writes the series as JSON. Growth: a least-squares slope (MB/min) of the total
PSS/RSS and of the JVM over the last two thirds of the window.
"""

from __future__ import annotations

import argparse
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

from bench.support import stats
from bench.support.results import write_result

ROLES = ("jvm", "publish", "py-daemon", "py-worker", "py-other", "other")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _rollup(pid: int) -> dict[str, int] | None:
    """kB figures of /proc/PID/smaps_rollup: rss, pss, uss."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return None
    kb: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":"):
            kb[parts[0][:-1]] = int(parts[1])
    return {
        "rss": kb.get("Rss", 0),
        "pss": kb.get("Pss", 0),
        "uss": kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0),
    }


_PFN_MASK = np.uint64((1 << 55) - 1)


def _frames(pid: int) -> np.ndarray:
    """The physical page frames a process has resident (/proc/PID/pagemap: bit 63 present,
    bits 0-54 the frame number; the numbers need CAP_SYS_ADMIN, else they read as 0)."""
    frames = []
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pm:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
                if lo >= 1 << 47:  # [vsyscall]
                    continue
                pm.seek((lo >> 12) * 8)
                entries = np.frombuffer(pm.read(((hi - lo) >> 12) * 8), dtype=np.uint64)
                frames.append(entries[(entries >> np.uint64(63)) == 1] & _PFN_MASK)
    except OSError:  # the process ended
        pass
    return np.concatenate(frames) if frames else np.zeros(0, np.uint64)


def distinct_kb(pids: list[int]) -> int | None:
    """kB of memory resident in any of these processes, each physical page counted once:
    what the tree holds of the machine. The sum of RSS counts a page once per process
    that maps it (the workers Spark forks share their daemon's pages until written;
    every Python process maps the same pyarrow/lance library pages); PSS divides shared
    pages with processes outside the tree too. None where frame numbers are hidden."""
    frames = [_frames(pid) for pid in pids]
    every = np.concatenate(frames) if frames else np.zeros(0, np.uint64)
    if len(every) and not every.any():
        return None  # no CAP_SYS_ADMIN: all frame numbers read as 0
    return int(len(np.unique(every))) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _role(pid: int, root: int, parent_cmd: str, cmd: str) -> str:
    if pid == root:
        return "publish"
    if "java" in cmd.split(" ", 1)[0]:
        return "jvm"
    daemons = (
        "pyspark.daemon",
        "lance_cdf.spark.sink.warm_daemon",
    )  # (the warm one: spark/sink/warm_daemon.py)
    if any(d in cmd for d in daemons):
        return "py-worker" if any(d in parent_cmd for d in daemons) else "py-daemon"
    if "python" in cmd.split(" ", 1)[0]:
        return "py-other"
    return "other"


def sample(root: int, distinct: bool = False) -> dict:
    kids = _children()
    procs = []
    stack = [(root, "")]
    while stack:
        pid, parent_cmd = stack.pop()
        cmd = _cmdline(pid)
        mem = _rollup(pid)
        if mem is not None:
            procs.append(
                {"pid": pid, "role": _role(pid, root, parent_cmd, cmd), "cmd": cmd[:160], **mem}
            )
        stack.extend((k, cmd) for k in kids.get(pid, []))
    by_role = {r: {"n": 0, "rss": 0, "pss": 0, "uss": 0} for r in ROLES}
    for p in procs:
        agg = by_role[p["role"]]
        agg["n"] += 1
        for k in ("rss", "pss", "uss"):
            agg[k] += p[k]
    total = {k: sum(p[k] for p in procs) for k in ("rss", "pss", "uss")}
    if distinct:  # ~0.1 s a process: bench_footprint's samples only
        kb = distinct_kb([p["pid"] for p in procs])
        if kb is not None:
            total["distinct"] = kb
    return {"t": time.time(), "procs": procs, "by_role": by_role, "total": total, "n": len(procs)}


def make_table(path: str, rows: int, dim: int) -> None:
    rng = np.random.default_rng(0)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * dim, dtype=np.float32)), dim)
    t = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "name": pa.array([f"r{i}" for i in range(rows)]),
            "score": pa.array(rng.random(rows)),
            "vec": vec,
        }
    )
    lance.write_dataset(t, path, max_rows_per_file=1 << 20, enable_stable_row_ids=True)


def writer(path: str, dim: int, stop: threading.Event, counts: dict) -> None:
    rng = np.random.default_rng(1)
    next_id = 10**9
    i = 0
    while not stop.is_set():
        t = time.monotonic()
        ds = lance.dataset(path)
        kind = i % 3
        if kind == 0:
            n = 100
            vec = pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(n * dim, dtype=np.float32)), dim
            )
            ds.insert(
                pa.table(
                    {
                        "id": pa.array(np.arange(next_id, next_id + n, dtype=np.int64)),
                        "name": pa.array([f"n{j}" for j in range(n)]),
                        "score": pa.array(rng.random(n)),
                        "vec": vec,
                    }
                )
            )
            next_id += n
        elif kind == 1:
            lo = int(rng.integers(0, 10**5))
            ds.update({"score": "score + 1.0"}, where=f"id >= {lo} AND id < {lo + 50}")
        else:
            lo = int(rng.integers(0, 10**5))
            ds.delete(f"id >= {lo} AND id < {lo + 20}")
        counts["commits"] = counts.get("commits", 0) + 1
        i += 1
        stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))


def slope(ts: list[float], ys: list[float]) -> float:
    """MB/min, least squares over the last two thirds."""
    n = len(ts)
    k = n // 3
    if n - k < 3:
        return float("nan")
    x = np.array(ts[k:]) / 60.0
    y = np.array(ys[k:]) / 1024.0
    return float(np.polyfit(x, y, 1)[0])


def summarize(samples: list[dict]) -> dict:
    steady = samples[len(samples) // 3 :] or samples
    ts = [s["t"] - samples[0]["t"] for s in samples]
    out: dict = {"roles": {}, "total": {}}
    for role in ROLES:
        rs = [s["by_role"][role] for s in steady]
        if not any(r["n"] for r in rs):
            continue
        out["roles"][role] = {
            "n_max": max(r["n"] for r in rs),
            **{
                f"{k}_mb": round(stats.median([r[k] for r in rs]) / 1024, 1)
                for k in ("rss", "pss", "uss")
            },
            **{f"{k}_max_mb": round(max(r[k] for r in rs) / 1024, 1) for k in ("rss", "pss")},
        }
    for k in ("rss", "pss", "uss", "distinct"):
        if any(k not in s["total"] for s in samples):
            continue
        vals = [s["total"][k] for s in steady]
        out["total"][f"{k}_mb"] = round(stats.median(vals) / 1024, 1)
        out["total"][f"{k}_max_mb"] = round(max(vals) / 1024, 1)
        out["total"][f"{k}_growth_mb_min"] = round(slope(ts, [s["total"][k] for s in samples]), 2)
    out["total"]["jvm_rss_growth_mb_min"] = round(
        slope(ts, [s["by_role"]["jvm"]["rss"] for s in samples]), 2
    )
    out["total"]["jvm_pss_growth_mb_min"] = round(
        slope(ts, [s["by_role"]["jvm"]["pss"] for s in samples]), 2
    )
    out["n_max"] = max(s["n"] for s in steady)
    return out


def print_summary(label: str, summ: dict) -> None:
    print(f"\n== {label}: median over the last two thirds (MB) ==")
    print(f"{'role':10} {'n':>3} {'RSS':>8} {'PSS':>8} {'USS':>8}")
    for role, r in summ["roles"].items():
        print(
            f"{role:10} {r['n_max']:>3} {r['rss_mb']:>8.1f} {r['pss_mb']:>8.1f} {r['uss_mb']:>8.1f}"
        )
    t = summ["total"]
    print(
        f"{'total':10} {summ['n_max']:>3} {t['rss_mb']:>8.1f} {t['pss_mb']:>8.1f}"
        f" {t['uss_mb']:>8.1f}"
    )
    if "distinct_mb" in t:
        print(f"{'distinct':10} {'':>3} {t['distinct_mb']:>8.1f}  (each resident page once)")
    print(
        f"growth MB/min (last 2/3): total RSS {t['rss_growth_mb_min']},"
        f" PSS {t['pss_growth_mb_min']},"
        f" JVM RSS {t['jvm_rss_growth_mb_min']}"
    )


def _native_memory(procs: list[dict]) -> str | None:
    """The JVM's `jcmd VM.native_memory summary` (with -XX:NativeMemoryTracking=summary)."""
    for p in procs:
        if p["role"] == "jvm":
            out = subprocess.run(
                ["jcmd", str(p["pid"]), "VM.native_memory", "summary"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if "Native Memory Tracking" in out.stdout:
                return out.stdout
    return None


def _jvm_gc(procs: list[dict]) -> str | None:
    """The JVM's heap and collections at the end: `jcmd GC.heap_info` and `jstat -gcutil`
    (YGC/YGCT young collections and their seconds, FGC/FGCT full ones)."""
    for p in procs:
        if p["role"] == "jvm":
            out = []
            for cmd in (
                ["jcmd", str(p["pid"]), "GC.heap_info"],
                ["jstat", "-gcutil", str(p["pid"])],
            ):
                try:
                    run = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    continue
                out.append(run.stdout)
            return "".join(out) or None
    return None


def run_variant(label: str, binary: str, kafka, registry, args, work: str) -> dict:
    table = os.path.join(work, f"t-{label}-{uuid.uuid4().hex[:6]}")
    shutil.copytree(args.base_table, table)
    topic = f"fp-{label}-{uuid.uuid4().hex[:6]}"
    ckpt = os.path.join(work, f"ck-{topic}")
    log = open(os.path.join(work, f"{topic}.log"), "w")
    cmd = [
        os.path.abspath(binary),
        "publish",
        "--table",
        table,
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--topic",
        topic,
        "--schema-registry",
        registry.url,
        "--checkpoint",
        ckpt,
    ]
    env = dict(os.environ)
    env.update(args.env.get(label, {}))
    # run from the scratch directory: Spark starts its Python processes with `python -m`,
    # which puts the working directory first on sys.path, so from a checkout they would
    # import that checkout's lance_cdf instead of the variant's (its venv's install)
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=work
    )
    stop = threading.Event()
    counts: dict = {}
    w = threading.Thread(target=writer, args=(table, args.dim, stop, counts), daemon=True)
    w.start()
    samples: list[dict] = []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < args.minutes * 60:
            if proc.poll() is not None:
                raise SystemExit(f"{label}: publish exited {proc.returncode}, see {log.name}")
            samples.append(sample(proc.pid, distinct=True))
            s = samples[-1]
            print(
                f"[{label}] {time.monotonic() - t0:6.0f}s n={s['n']:2} "
                f"rss={s['total']['rss'] / 1024:7.1f} pss={s['total']['pss'] / 1024:7.1f} "
                f"distinct={s['total'].get('distinct', 0) / 1024:7.1f} "
                f"jvm={s['by_role']['jvm']['rss'] / 1024:6.1f} commits={counts.get('commits', 0)}",
                flush=True,
            )
            time.sleep(args.every)
    finally:
        stop.set()
        w.join()
        last = samples[-1]["procs"] if samples else []
        nmt = _native_memory(last)
        gc = _jvm_gc(last)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    summ = summarize(samples)
    print_summary(label, summ)
    if gc:
        print(gc)
    print("processes at the last sample:")
    for p in sorted(last, key=lambda p: p["role"]):
        print(
            f"  {p['pid']:>7} {p['role']:10} rss={p['rss'] / 1024:6.1f}"
            f" pss={p['pss'] / 1024:6.1f}  {p['cmd'][:110]}"
        )
    return {
        "label": label,
        "binary": binary,
        "command": cmd,
        "commits": counts.get("commits", 0),
        "summary": summ,
        "last_processes": last,
        "env": args.env.get(label, {}),
        "jvm_native_memory": nmt,
        "jvm_gc": gc,
        "series": [
            {
                "t": round(s["t"] - samples[0]["t"], 1),
                "n": s["n"],
                "total": s["total"],
                "by_role": s["by_role"],
            }
            for s in samples
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--variant",
        action="append",
        default=None,
        help="LABEL=PATH_TO_lance-cdf (default: this checkout's)",
    )
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        help="LABEL:KEY=VALUE, an environment variable for that variant's publish",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    envs: dict[str, dict[str, str]] = {}
    for item in args.env:
        label, kv = item.split(":", 1)
        key, value = kv.split("=", 1)
        envs.setdefault(label, {})[key] = value
    args.env = envs
    variants = [
        v.split("=", 1)
        for v in (args.variant or [f"this={shutil.which('lance-cdf') or 'lance-cdf'}"])
    ]
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    work = tempfile.mkdtemp(prefix="bench-footprint-")
    args.base_table = os.path.join(work, "base")
    make_table(args.base_table, args.rows, args.dim)
    results: dict = {
        "rows": args.rows,
        "dim": args.dim,
        "minutes": args.minutes,
        "every": args.every,
        "runs": [],
    }
    try:
        with KafkaBroker() as kafka, SchemaRegistry() as registry:
            for _ in range(args.rounds):
                for label, binary in variants:
                    results["runs"].append(run_variant(label, binary, kafka, registry, args, work))
                    write_result(args.out, results, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
