"""Planning only: ms per version of `plan_version` (manifest diff -> row IDs and offsets).

    python -m bench.core.bench_plan --rows 1000000 10000000 --dir bench/out --reuse --out plan.json
    # another checkout's lance_cdf: run from its directory, this checkout on PYTHONPATH
    cd /other/checkout && PYTHONPATH=/this/checkout python -m bench.core.bench_plan \
        --replay /this/checkout/plan.json

For each table size (bench_core's table: id, name, 128-d vector, stable row IDs,
--fragments fragments; built unless --reuse finds it under --dir), makes one commit of
each shape {update, delete, merge_insert} x {clustered, scattered over all fragments} of
--changes rows and times planning it, side by side in one run:

  * followed  a `TableLog` that planned the previous version (what a `ChangeFeed` or the
              Spark source following the table holds): decoded sequences and deletion
              vectors of the entries the commit left alone are cached;
  * fresh     a new `TableLog` per call (manifests and lineage files read and decoded).

Reports the median and the best of --repeat calls (ms wall and CPU); the machine is
shared, so the best is the steadier measure of the work done.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from bench.core.bench_core import Table, build
from bench.support import stats
from lance_cdf.core.plan import plan_version
from lance_cdf.format.table import TableLog

SHAPES = [
    (change, layout)
    for change in ("update", "delete", "merge_insert")
    for layout in ("clustered", "scattered")
]


def time_calls(fn, repeat: int) -> dict:
    wall, cpu = [], []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    ms = 1e3
    return dict(
        median_ms=stats.median(wall) * ms,
        best_ms=min(wall) * ms,
        median_cpu_ms=stats.median(cpu) * ms,
        best_cpu_ms=min(cpu) * ms,
    )


def followed(uri: str, version: int, warm: int = 6):
    """A TableLog that has planned the `warm` versions before `version` (a feed following
    the table), and a call that plans `version` on it (the manifest of `version` and what
    was decoded for it are dropped between calls)."""
    log = TableLog(uri)
    for v in range(max(2, version - warm), version):
        plan_version(log, v)
    keep_seq = dict(log._sequences)
    keep_del = dict(log._deletions)

    def call():
        log._sequences.clear()
        log._sequences.update(keep_seq)
        log._deletions.clear()
        log._deletions.update(keep_del)
        log._manifests.pop(version, None)  # read and parse the new manifest each time
        return plan_version(log, version)

    return call


def measure(uri: str, v: int, row: dict, repeat: int) -> dict:
    row["followed"] = time_calls(followed(uri, v), repeat)
    row["fresh"] = time_calls(lambda: plan_version(TableLog(uri), v), max(3, repeat // 4))
    print(json.dumps(row), flush=True)
    return row


def replay(args) -> list[dict]:
    """Time the versions a previous run committed again, committing nothing: run it
    with another lance_cdf on PYTHONPATH to compare implementations on the same commits."""
    with open(args.replay) as fh:
        rows = json.load(fh)["results"]
    return [measure(r["uri"], r["version"], dict(r), args.repeat) for r in rows]


def run_size(args, rows: int) -> list[dict]:
    uri = os.path.join(args.dir, f"core_{rows}.lance")
    if not (args.reuse and os.path.isdir(uri)):
        build(uri, rows, rows // args.fragments)
    table = Table(uri, seed=rows + 7)
    table.update(args.changes, "scattered", tag=0)  # untimed: every fragment touched once
    out = []
    for change, layout in SHAPES:
        getattr(table, change)(args.changes, layout, tag=len(out) + 1)
        v = table.version
        plan = plan_version(TableLog(uri), v)
        touched = len(set(plan.deleted.fragment_ids) | set(plan.update_pre.fragment_ids))
        row = dict(rows=rows, change=change, layout=layout, uri=uri, version=v)
        row.update(fragments_touched=touched, events=plan.num_events)
        out.append(measure(uri, v, row, args.repeat))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--fragments", type=int, default=10)
    ap.add_argument("--changes", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--reuse", action="store_true", help="reuse existing base tables")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replay", default=None, help="time the versions of this --out file again")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if args.replay:
        results = replay(args)
    else:
        results = [r for rows in args.rows for r in run_size(args, rows)]
    print(
        "\n| rows | change | layout | fragments touched | followed: median (best) ms "
        "| CPU median (best) | fresh TableLog: median (best) ms |"
    )
    print("|---:|---|---|---:|---:|---:|---:|")
    for r in results:
        f, c = r["followed"], r["fresh"]
        print(
            f"| {r['rows']:,} | {r['change']} | {r['layout']} | {r['fragments_touched']} "
            f"| {f['median_ms']:.2f} ({f['best_ms']:.2f}) "
            f"| {f['median_cpu_ms']:.2f} ({f['best_cpu_ms']:.2f}) "
            f"| {c['median_ms']:.2f} ({c['best_ms']:.2f}) |"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"load": os.getloadavg(), "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
