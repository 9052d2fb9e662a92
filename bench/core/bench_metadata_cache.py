"""What bounding pylance's metadata cache
(lance_cdf.core.table_schemas.METADATA_CACHE_BYTES) costs change extraction, and what it
saves.

    python -m bench.core.bench_metadata_cache --rows 1000000 --fragments 200 --versions 300 \
        --bound default --bound 32 --bound 8 --rounds 2 \
        --out bench/results/results_metadata_cache.json

Builds a table (id int64, name string, vec float32[--dim], stable row IDs, --fragments
fragments), then --versions commits in turn: an update of 100 rows scattered over all
fragments, an append of 100 rows, a delete of 20 scattered rows. For each --bound (MiB, or
`default`: pylance's own 1 GiB), in a fresh process, alternated over --rounds: one ChangeFeed
held across the run (as a publisher's worker holds its reader) reads every version's events,
all columns; prints the seconds it took (the first 20 versions apart: the warm-up), the
session's cache size at the end (pylance `Session.size_bytes`) and the process's RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa

from bench.support.results import write_result


def build(path: str, rows: int, fragments: int, versions: int, dim: int) -> None:
    import lance

    rng = np.random.default_rng(0)

    def data(start: int, n: int) -> pa.Table:
        ids = np.arange(start, start + n, dtype=np.int64)
        vec = pa.FixedSizeListArray.from_arrays(
            pa.array(rng.random(n * dim, dtype=np.float32)), dim
        )
        return pa.table({"id": ids, "name": pa.array([f"n{i}" for i in ids]), "vec": vec})

    lance.write_dataset(
        data(0, rows),
        path,
        mode="overwrite",
        enable_stable_row_ids=True,
        max_rows_per_file=-(-rows // fragments),
    )
    next_id = rows
    for i in range(versions):
        ds = lance.dataset(path)
        if i % 3 == 0:
            ids = rng.choice(rows, 100, replace=False)
            ds.update({"name": "'u'"}, where=f"id IN ({','.join(map(str, ids))})")
        elif i % 3 == 1:
            lance.write_dataset(data(next_id, 100), path, mode="append")
            next_id += 100
        else:
            ids = rng.choice(rows, 20, replace=False)
            ds.delete(f"id IN ({','.join(map(str, ids))})")


def child(path: str, bound: str) -> dict:
    import lance_cdf.core.table_schemas
    from lance_cdf.core.feed import ChangeFeed

    if bound != "default":
        lance_cdf.core.table_schemas.METADATA_CACHE_BYTES = int(float(bound) * (1 << 20))
    else:
        lance_cdf.core.table_schemas.METADATA_CACHE_BYTES = None  # type: ignore[assignment]
    feed = ChangeFeed(path)
    latest = feed.latest_version()
    start = 2
    schema = feed.user_schema(start, latest)
    n = 0
    t0 = time.perf_counter()
    t_warm = t0
    for v in range(start, latest + 1):
        if v == start + 20:
            t_warm = time.perf_counter()
        for b in feed.events(feed.plan(v), schema):
            n += b.num_rows
    t1 = time.perf_counter()
    ds = next(iter(feed.reader.schemas._datasets.values()))
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    return {
        "bound": bound,
        "versions": latest - start + 1,
        "events": n,
        "seconds": t1 - t0,
        "seconds_after_warmup": t1 - t_warm,
        "session_mb": ds.session().size_bytes() / 2**20,
        "rss_mb": rss,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--fragments", type=int, default=200)
    ap.add_argument("--versions", type=int, default=300)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--bound", action="append", default=None, help="MiB or 'default'")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    path = os.path.join(args.dir, f"metacache_{args.rows}_{args.fragments}_{args.versions}.lance")
    if args.child is not None:
        print(json.dumps(child(path, args.child)))
        return
    if not (args.reuse and os.path.exists(path)):
        t = time.perf_counter()
        build(path, args.rows, args.fragments, args.versions, args.dim)
        print(f"built {path} in {time.perf_counter() - t:.0f} s", flush=True)
    runs = []
    for r in range(args.rounds):
        for bound in args.bound or ["default", "32"]:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    __spec__.name,  # (this module, from the same working directory)
                    "--child",
                    bound,
                    "--dir",
                    args.dir,
                    "--rows",
                    str(args.rows),
                    "--fragments",
                    str(args.fragments),
                    "--versions",
                    str(args.versions),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            res = json.loads(out.strip().splitlines()[-1]) | {
                "round": r,
                "load": os.getloadavg()[0],
            }
            print(json.dumps(res), flush=True)
            runs.append(res)
    write_result(args.out, {"args": vars(args), "runs": runs}, indent=1)


if __name__ == "__main__":
    main()
