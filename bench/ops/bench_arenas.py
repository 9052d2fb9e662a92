"""What pylance's compaction leaves resident, by glibc's arena limit (asked because the
replicator, which compacts its replica every 100 commits, grew by steps at its compactions).

    python -m bench.ops.bench_arenas --rounds 40 --out bench/results/results_arenas.json

A table of --rows rows with a --dim float32 vector (one fragment), then --rounds rounds of
what a replica sees between compactions: 20 appends of 100 rows, a delete of 500 rows, and
`compact_files(materialize_deletions_threshold=0.1)` as `ReplicaTable.maintain` calls it.
Each variant runs in a fresh process (an arena limit must be set before threads start),
variants alternated --repeat times on copies of one base table:
  * default   glibc's own limit (8 arenas per core);
  * arenas2   `lance_cdf.ops.malloc.bound_arenas(2)` (what `lance-cdf` does);
  * arenas2+trim  and `malloc_trim(0)` after each compaction (`release_freed_memory`, what
              the replicator does after each).
Reports the process's RSS (VmRSS) after the base table is opened and after every round,
and the median over the last two thirds of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from bench.support import stats

CHILD = r"""
import json, os, sys
from lance_cdf.ops import malloc
variant, uri, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
if variant != "default":
    malloc.bound_arenas(2)
import lance, numpy as np, pyarrow as pa

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

ds = lance.dataset(uri)
dim = ds.schema.field("vec").type.list_size
rng = np.random.default_rng(0)
new = pa.table({"k": pa.array(np.arange(100, dtype=np.int64)),
                "vec": pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.random(100 * dim, dtype=np.float32)), dim)})
series = [rss()]
for r in range(rounds):
    for _ in range(20):
        lance.dataset(uri).insert(new)
    lance.dataset(uri).delete(f"k >= {r * 500} AND k < {(r + 1) * 500}")
    lance.dataset(uri).optimize.compact_files(materialize_deletions_threshold=0.1)
    if variant == "arenas2+trim":
        malloc.release_freed_memory()
    series.append(rss())
print(json.dumps(series))
"""

VARIANTS = ("default", "arenas2", "arenas2+trim")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import lance
    import numpy as np
    import pyarrow as pa

    work = tempfile.mkdtemp(prefix="bench-arenas-")
    try:
        base = os.path.join(work, "base.lance")
        rng = np.random.default_rng(0)
        vec = pa.array(rng.random(args.rows * args.dim, dtype=np.float32))
        lance.write_dataset(
            pa.table(
                {
                    "k": pa.array(np.arange(args.rows, dtype=np.int64)),
                    "vec": pa.FixedSizeListArray.from_arrays(vec, args.dim),
                }
            ),
            base,
            enable_stable_row_ids=True,
        )
        runs = []
        for rep in range(args.repeat):
            for variant in VARIANTS:
                uri = os.path.join(work, f"{variant}-{rep}.lance")
                shutil.copytree(base, uri)
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, variant, uri, str(args.rounds)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env={**os.environ, "LANCE_CDF_MALLOC_ARENAS": "0"},
                )
                shutil.rmtree(uri)
                series = json.loads(out.stdout.strip().splitlines()[-1])
                steady = series[1 + len(series) // 3 :]
                runs.append(
                    {
                        "variant": variant,
                        "repeat": rep,
                        "rss_mb": [round(x, 1) for x in series],
                        "opened_mb": round(series[0], 1),
                        "steady_median_mb": round(stats.median(steady), 1),
                        "steady_max_mb": round(max(steady), 1),
                    }
                )
                r = runs[-1]
                print(
                    f"{variant:13} opened {r['opened_mb']:6.1f} MB, after compactions: "
                    f"median {r['steady_median_mb']:6.1f}, max {r['steady_max_mb']:6.1f} MB",
                    flush=True,
                )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(
                    {"rows": args.rows, "dim": args.dim, "rounds": args.rounds, "runs": runs},
                    f,
                    indent=1,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
