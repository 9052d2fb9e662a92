"""Two builds on the same commits: bench_versions.py results of a "before" and an "after"
build, timed alternately on the same versions of the same tables, as after/before ratios.

    python -m bench.core.compare_versions --cells bench_core_results.json \
        --before b_r1.json b_r2.json --after a_r1.json a_r2.json --out compare.json

`--cells`: the bench_core.py results that made the commits (to name each version's cell).
Per version: the best over the runs of each build of `read_changes` wall and CPU ms, the
ratio after/before, and the same ratio measured against Lance's own `delta()` timed beside
it in the same run (`vs_delta`: a ratio of ratios, which cancels the machine's load).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from bench.support.results import write_result


def best(paths: list[str]) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            for r in json.load(f):
                for m in ("read_changes", "delta"):
                    have = out[r["version"]].get(m, r[m])
                    out[r["version"]][m] = [min(x, y) for x, y in zip(have, r[m], strict=True)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="+", required=True)
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    names = {}
    for path in args.cells:
        with open(path) as f:
            for size in json.load(f)["sizes"]:
                for r in size["results"]:
                    v = str(r["start"]) if r["start"] == r["end"] else f"{r['start']}:{r['end']}"
                    names[v] = f"{r['rows']:,} rows, {r['changes']:,} {r['layout']} {r['change']}"
    before, after = best(args.before), best(args.after)
    rows = []
    print("| cell | versions | read_changes before → after ms | x wall | x CPU | x vs delta() |")
    print("|---|---|---|---:|---:|---:|")
    for v in before:
        if v not in after:
            continue
        b, a = before[v], after[v]
        row = {
            "cell": names.get(v, "?"),
            "versions": v,
            "before_ms": b["read_changes"][0],
            "after_ms": a["read_changes"][0],
            "x_wall": a["read_changes"][0] / b["read_changes"][0],
            "x_cpu": a["read_changes"][1] / b["read_changes"][1],
            "x_vs_delta": (a["read_changes"][0] / a["delta"][0])
            / (b["read_changes"][0] / b["delta"][0]),
        }
        rows.append(row)
        print(
            f"| {row['cell']} | {v} | {row['before_ms']:.1f} → {row['after_ms']:.1f} "
            f"| {row['x_wall']:.2f} | {row['x_cpu']:.2f} | {row['x_vs_delta']:.2f} |"
        )
    worst = max(rows, key=lambda r: min(r["x_wall"], r["x_cpu"]))
    print(
        f"\nworst (by the smaller of wall and CPU): {worst['cell']} ({worst['versions']}): "
        f"{worst['x_wall']:.2f}x wall, {worst['x_cpu']:.2f}x CPU"
    )
    write_result(args.out, {"before": args.before, "after": args.after, "versions": rows}, indent=1)


if __name__ == "__main__":
    main()
