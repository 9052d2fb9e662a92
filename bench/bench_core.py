"""Change extraction for one commit: lance-cdf vs Lance's Dataset.delta() vs a full diff.

    python bench/bench_core.py --rows 10000000 --changes 1 1000 100000

Builds a table (id int64, name string, vec fixed_size_list<float32>[128]) with
stable row IDs, then for each change size makes ONE commit that updates,
inserts and deletes about a third each (merge_insert with
when_not_matched_by_source_delete) and times, side by side in one run:
  * lance-cdf  `read_changes(uri, v, v)`: pre- and post-images, all columns;
  * delta      `Dataset.delta(v-1, v)`: post-images of inserts and updates and
               the deleted row IDs (no pre-images, no deleted values);
  * full diff  scan both versions with `_rowid` and `_row_last_updated_at_version`
               and all columns, join on `_rowid`, keep what changed.
Prints a markdown table and, with --out, writes JSON results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from datetime import UTC, datetime

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tables import id_name_vec  # noqa: E402  (bench/ is on sys.path)

import lance_cdf

DIM = 128
SYS = ["_rowid", "_row_last_updated_at_version"]


def build(uri: str, n: int, rows_per_file: int) -> None:
    shutil.rmtree(uri, ignore_errors=True)
    chunk = 500_000

    def batches():
        for start in range(0, n, chunk):
            yield from id_name_vec(start, min(chunk, n - start), start, DIM).to_batches()

    schema = id_name_vec(0, 1, 0, DIM).schema
    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=rows_per_file,
    )


def commit_change(uri: str, n_rows: int, changes: int, next_id: int, seed: int) -> int:
    """One merge_insert commit: ~1/3 updates, ~1/3 inserts, ~1/3 deletes."""
    rng = np.random.default_rng(seed)
    n_upd = max(1, changes // 3) if changes >= 3 else (1 if changes >= 1 else 0)
    n_ins = changes // 3 if changes >= 3 else 0
    n_del = changes - n_upd - n_ins
    lo = int(rng.integers(0, n_rows - changes - 1))
    upd = id_name_vec(lo, n_upd, seed, DIM)
    upd = upd.set_column(1, "name", pa.array([f"updated-{seed}"] * n_upd, pa.string()))
    src = pa.concat_tables([upd, id_name_vec(next_id, n_ins, seed + 1, DIM)])
    builder = lance.dataset(uri).merge_insert("id").when_matched_update_all()
    builder = builder.when_not_matched_insert_all()
    if n_del:
        d0 = lo + n_upd
        builder = builder.when_not_matched_by_source_delete(f"id >= {d0} AND id < {d0 + n_del}")
    builder.execute(src)
    return next_id + n_ins


def run_cdf(uri: str, v: int) -> int:
    return sum(b.num_rows for b in lance_cdf.read_changes(uri, v, v))


def run_delta(uri: str, v: int) -> int:
    d = lance.dataset(uri, version=v).delta(begin_version=v - 1, end_version=v)
    n = 0
    for part in (d.get_inserted_rows(), d.get_updated_rows(), d.get_deleted_row_ids()):
        n += (part.read_all() if hasattr(part, "read_all") else part).num_rows
    return n


def run_full_diff(uri: str, v: int) -> int:
    cols = lance.dataset(uri, version=v).schema.names
    old = lance.dataset(uri, version=v - 1).to_table(columns=cols + SYS)
    new = lance.dataset(uri, version=v).to_table(columns=cols + SYS)
    keys_old = old.select(SYS).rename_columns(["_rowid", "v_old"])
    keys_new = new.select(SYS).rename_columns(["_rowid", "v_new"])
    joined = keys_old.join(keys_new, "_rowid", join_type="full outer")
    inserted = joined.filter(pc.is_null(joined["v_old"]))["_rowid"]
    deleted = joined.filter(pc.is_null(joined["v_new"]))["_rowid"]
    both = joined.filter(pc.and_(pc.is_valid(joined["v_old"]), pc.is_valid(joined["v_new"])))
    updated = both.filter(pc.not_equal(both["v_old"], both["v_new"]))["_rowid"]
    post = new.filter(
        pc.is_in(
            new["_rowid"], pa.concat_arrays([inserted.combine_chunks(), updated.combine_chunks()])
        )
    )
    pre = old.filter(
        pc.is_in(
            old["_rowid"], pa.concat_arrays([deleted.combine_chunks(), updated.combine_chunks()])
        )
    )
    return post.num_rows + pre.num_rows


def timed(fn, *args, repeat: int) -> tuple[float, int]:
    times, out = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--rows-per-file", type=int, default=1_000_000)
    ap.add_argument("--changes", type=int, nargs="+", default=[1, 1000, 100_000])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--full-diff-repeat", type=int, default=1)
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--out", default=None, help="write JSON results here")
    ap.add_argument("--reuse", action="store_true", help="reuse an existing base table")
    args = ap.parse_args()

    os.makedirs(args.dir, exist_ok=True)
    base = os.path.join(args.dir, f"core_{args.rows}.lance")
    t0 = time.perf_counter()
    if not (args.reuse and os.path.isdir(base)):
        build(base, args.rows, args.rows_per_file)
    build_s = time.perf_counter() - t0
    base_version = lance.dataset(base).version
    results = []
    # new ids continue after the largest id present (a reused table has had inserts)
    next_id = pc.max(lance.dataset(base).to_table(columns=["id"])["id"]).as_py() + 1
    for i, changes in enumerate(args.changes):
        uri = base  # each commit goes on top of the previous one: table size stays ~constant
        next_id = commit_change(uri, args.rows, changes, next_id, seed=1000 + i)
        v = lance.dataset(uri).version
        cdf_s, cdf_n = timed(run_cdf, uri, v, repeat=args.repeat)
        delta_s, delta_n = timed(run_delta, uri, v, repeat=args.repeat)
        full_s, full_n = timed(run_full_diff, uri, v, repeat=args.full_diff_repeat)
        row = dict(
            changes=changes, version=v, cdf_s=cdf_s, cdf_events=cdf_n, delta_s=delta_s,
            delta_rows=delta_n, full_diff_s=full_s, full_diff_rows=full_n,
            cdf_vs_delta=cdf_s / delta_s, full_vs_cdf=full_s / cdf_s,
        )  # fmt: skip
        results.append(row)
        print(json.dumps(row), flush=True)
    meta = dict(
        rows=args.rows, rows_per_file=args.rows_per_file, build_s=build_s,
        base_version=base_version, date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        pylance=lance.__version__, pyarrow=pa.__version__,
    )  # fmt: skip
    print(f"\n{args.rows:,} rows, {args.rows_per_file:,} rows per fragment\n")
    header = ["changed rows", "lance-cdf (s)", "delta() (s)", "full diff (s)"]
    header += ["lance-cdf / delta", "full diff / lance-cdf"]
    print("| " + " | ".join(header) + " |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['changes']:,} | {r['cdf_s']:.3f} | {r['delta_s']:.3f} | {r['full_diff_s']:.2f} "
            f"| {r['cdf_vs_delta']:.2f}x | {r['full_vs_cdf']:.0f}x |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
