"""Two builds side by side: bench_core.py results of a "before" and an "after" build,
run alternately on the same tables, as after/before ratios per cell.

    python bench/compare_core.py --before b_r1.json b_r2.json --after a_r1.json a_r2.json \
        --out bench/results_core_compare.json

For each cell (rows, changes, layout, change) and each of lance-cdf's two ways (a fresh
`read_changes`, a followed `ChangeFeed`), the median over the runs of each build, and
after/before of wall and CPU time. Cells whose commits differ between runs (each run makes
its own commits on the shared tables) are compared as the same shape of change. Prints a
markdown table; the worst ratios are what a regression check reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def cells(paths: list[str]) -> dict[tuple, dict[str, list[float]]]:
    out: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for size in data["sizes"]:
            for r in size["results"]:
                key = (r["rows"], r["changes"], r["layout"], r["change"])
                for m in ("cold_s", "cold_cpu_s", "warm_s", "warm_cpu_s", "delta_s"):
                    out[key][m].append(r[m])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    before, after = cells(args.before), cells(args.after)
    rows = []
    for key in sorted(set(before) & set(after)):
        row = {"rows": key[0], "changes": key[1], "layout": key[2], "change": key[3]}
        for m in ("cold_s", "cold_cpu_s", "warm_s", "warm_cpu_s", "delta_s"):
            b, a = statistics.median(before[key][m]), statistics.median(after[key][m])
            row[f"before_{m}"], row[f"after_{m}"], row[f"ratio_{m}"] = b, a, a / b
        rows.append(row)
    print("| rows | changed | layout | change | cold before → after ms (x) | cold CPU x "
          "| warm before → after ms (x) | warm CPU x |")
    print("|---:|---:|---|---|---|---:|---|---:|")
    for r in rows:
        print(
            f"| {r['rows']:,} | {r['changes']:,} | {r['layout']} | {r['change']} "
            f"| {r['before_cold_s'] * 1e3:.1f} → {r['after_cold_s'] * 1e3:.1f} "
            f"({r['ratio_cold_s']:.2f}x) | {r['ratio_cold_cpu_s']:.2f}x "
            f"| {r['before_warm_s'] * 1e3:.1f} → {r['after_warm_s'] * 1e3:.1f} "
            f"({r['ratio_warm_s']:.2f}x) | {r['ratio_warm_cpu_s']:.2f}x |"
        )
    worst = max(rows, key=lambda r: min(r["ratio_cold_s"], r["ratio_cold_cpu_s"]))
    print(f"\nworst cold cell (by the smaller of wall and CPU ratio): {worst['rows']:,} rows, "
          f"{worst['changes']:,} {worst['layout']} {worst['change']}: "
          f"{worst['ratio_cold_s']:.2f}x wall, {worst['ratio_cold_cpu_s']:.2f}x CPU")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"before": args.before, "after": args.after, "cells": rows}, f, indent=1)


if __name__ == "__main__":
    main()
