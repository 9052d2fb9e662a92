"""Single versions of an existing table: read_changes against what a user would hand-write.

    python -m bench.core.bench_versions --uri /work/r18c-bench/core_10000000.lance \
        --versions 94 96 105
    python -m bench.core.bench_versions --uri ... --versions 22:23   # a range, both ends inclusive
    # another checkout's lance_cdf: run from its directory, this checkout on PYTHONPATH
    cd /other/checkout && PYTHONPATH=/this/checkout python -m bench.core.bench_versions ...

For each version v (or range a:b), alternating, best of --repeat calls (ms wall, CPU of the
process): read_changes(uri, v, v) from a fresh call, Lance's `delta()` alone, and `delta()`
plus `_take_rows` of the pre-images and deleted rows (bench_core's peers). Nothing is written
to the table, so two checkouts can be timed on the same commits.
"""

from __future__ import annotations

import argparse
import json
import time

from bench.core.bench_core import run_cold, run_delta, run_delta_take

METHODS = [("read_changes", run_cold), ("delta", run_delta), ("delta_take", run_delta_take)]


def best(fn, uri: str, a: int, b: int, repeat: int) -> tuple[float, float]:
    wall, cpu = [], []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn(uri, a, b)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return min(wall) * 1e3, min(cpu) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", required=True)
    ap.add_argument("--versions", nargs="+", required=True, help="v or a:b (inclusive)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--malloc-default",
        action="store_true",
        help="leave glibc's malloc as a fresh process has it (default: opt in, as bench_core)",
    )
    args = ap.parse_args()
    import lance_cdf

    if not args.malloc_default and hasattr(lance_cdf, "keep_freed_memory"):
        lance_cdf.keep_freed_memory()  # builds older than the opt-in did it by themselves
    rows = []
    for v in args.versions:
        a, _, b = v.partition(":")
        row = {"uri": args.uri, "version": v}
        for name, fn in METHODS:
            row[name] = best(fn, args.uri, int(a), int(b or a), args.repeat)
        rows.append(row)
        cells = " | ".join(f"{n} {row[n][0]:.1f} ({row[n][1]:.1f})" for n, _ in METHODS)
        print(v, cells, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
