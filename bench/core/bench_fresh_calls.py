"""Fresh `read_changes` calls on commits already in a table, to compare two checkouts.

    python -m bench.core.bench_fresh_calls --uri T.lance --ranges 88 95:96 98 --repeat 5
    # another checkout's lance_cdf: run from its directory, this checkout on PYTHONPATH
    cd /other/checkout && PYTHONPATH=/this/checkout python -m bench.core.bench_fresh_calls ...

Each range (`v` or `a:b`, inclusive) is read --repeat times by a new `read_changes` call
and drained; best and median ms wall are printed. Nothing is written to the table, so
runs of two implementations, alternated, time the same commits (bench_core commits new
cells on each run, and its tables' history grows between runs). The peers are in
bench_versions.py.
"""

from __future__ import annotations

import argparse
import json
import time

import lance_cdf
from bench.support import stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", required=True)
    ap.add_argument("--ranges", nargs="+", required=True, help="v or a:b (inclusive)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None, help="append one JSON line per run here")
    args = ap.parse_args()
    rows = []
    for spec in args.ranges:
        a, _, b = spec.partition(":")
        a, b = int(a), int(b or a)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            events = sum(batch.num_rows for batch in lance_cdf.read_changes(args.uri, a, b))
            times.append(time.perf_counter() - t0)
        best, median = min(times) * 1e3, stats.median(times) * 1e3
        rows.append(dict(range=spec, events=events, best_ms=best, median_ms=median))
        print(f"{spec}: best {best:.1f} ms, median {median:.1f}")
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(json.dumps(dict(lance_cdf=lance_cdf.__file__, uri=args.uri, rows=rows)) + "\n")


if __name__ == "__main__":
    main()
