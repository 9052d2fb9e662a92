"""Change extraction for every shape of change: lance-cdf vs what a user would hand-write.

    python -m bench.core.bench_core --rows 1000000 10000000 --out bench/results/results_core.json

For each table size, builds (or with --reuse, reopens) a table (id int64, name string,
vec fixed_size_list<float32>[128], stable row IDs, --fragments fragments), then for every
cell of the matrix

    changed rows {1, 1,000, 100,000} x layout {clustered, scattered over all fragments}
    x change {insert, update, delete, merge_insert mix, a two-commit range}

makes the commit(s) and times, side by side in one run:
  * cold      `read_changes(uri, a, b)` from a fresh call: every event, all columns,
              pre-images of updates and the values of deleted rows;
  * warm      the same versions through a `ChangeFeed` held across the whole run (open
              readers, cached sequences; its plan cache is cleared between timings);
  * delta     Lance's `Dataset.delta(a-1, b)` alone: post-images of inserts and updates,
              the IDs of deleted rows;
  * delta+take  delta() plus pylance `_take_rows` of the pre-images and deleted rows at
              version a-1: the same information a user would hand-write.
Inserts always land in new fragments, so they have one (clustered) layout. Each commit
goes on top of the previous one: the table size stays about constant. Prints a markdown
table and, with --out, writes JSON results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from datetime import UTC, datetime

import lance
import numpy as np
import pyarrow as pa

import lance_cdf
from bench.support import stats
from bench.support.results import write_result
from bench.support.tables import id_name_vec
from lance_cdf.core.feed import ChangeFeed

DIM = 128
CHANGES = ["insert", "update", "delete", "merge_insert", "range"]


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


class Table:
    """The benchmark table and the ids it holds (kept in memory to pick rows to change)."""

    def __init__(self, uri: str, seed: int):
        self.uri = uri
        self.ids = np.sort(lance.dataset(uri).to_table(columns=["id"])["id"].to_numpy())
        self.next_id = int(self.ids[-1]) + 1
        self.rng = np.random.default_rng(seed)

    @property
    def version(self) -> int:
        return lance.dataset(self.uri).version

    def pick(self, n: int, layout: str) -> np.ndarray:
        """n existing ids: a contiguous block of the id order, or spread over the table."""
        if layout == "clustered":
            lo = int(self.rng.integers(0, self.ids.size - n))
            return self.ids[lo : lo + n]
        return np.sort(self.rng.choice(self.ids, n, replace=False))

    def rows(self, ids: np.ndarray, tag: int) -> pa.Table:
        t = id_name_vec(0, ids.size, tag, DIM)
        return t.set_column(0, "id", pa.array(ids, pa.int64()))

    def new_ids(self, n: int) -> np.ndarray:
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        return ids

    def insert(self, n: int, layout: str, tag: int) -> None:
        ids = self.new_ids(n)
        lance.write_dataset(self.rows(ids, tag), self.uri, mode="append")
        self.ids = np.concatenate([self.ids, ids])

    def update(self, n: int, layout: str, tag: int) -> None:
        ids = self.pick(n, layout)
        ds = lance.dataset(self.uri)
        ds.merge_insert("id").when_matched_update_all().execute(self.rows(ids, tag))

    def delete(self, n: int, layout: str, tag: int) -> None:
        ids = self.pick(n, layout)
        ds = lance.dataset(self.uri)
        ds.merge_insert("id").when_matched_delete().execute(self.rows(ids, tag))
        self.ids = np.setdiff1d(self.ids, ids, assume_unique=True)

    def merge_insert(self, n: int, layout: str, tag: int) -> None:
        """One upsert: 2/3 of the rows update existing ids, 1/3 are new."""
        n_upd = max(1, (2 * n) // 3) if n > 1 else 1
        n_ins = n - n_upd
        ids = np.concatenate([self.pick(n_upd, layout), self.new_ids(n_ins)])
        ds = lance.dataset(self.uri)
        builder = ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
        builder.execute(self.rows(ids, tag))
        self.ids = np.concatenate([self.ids, ids[n_upd:]])

    def range(self, n: int, layout: str, tag: int) -> None:
        """Two commits: an update of n rows, then a delete of n other rows."""
        self.update(n, layout, tag)
        self.delete(n, layout, tag + 1)


def run_cold(uri: str, a: int, b: int) -> int:
    return sum(batch.num_rows for batch in lance_cdf.read_changes(uri, a, b))


def run_warm(feed: ChangeFeed, a: int, b: int) -> int:
    feed._plans.clear()  # time planning too; readers and decoded sequences stay
    feed.latest_version()
    schema = feed.user_schema(a, b)
    return sum(batch.num_rows for batch in feed.range_events(feed.plans(a, b), schema))


def _delta(uri: str, a: int, b: int):
    d = lance.dataset(uri, version=b).delta(begin_version=a - 1, end_version=b)
    parts = [d.get_inserted_rows(), d.get_updated_rows(), d.get_deleted_row_ids()]
    return [p.read_all() if hasattr(p, "read_all") else p for p in parts]


def run_delta(uri: str, a: int, b: int) -> int:
    return sum(t.num_rows for t in _delta(uri, a, b))


def run_delta_take(uri: str, a: int, b: int) -> int:
    inserted, updated, deleted = _delta(uri, a, b)
    before = pa.concat_arrays(
        [updated["_rowid"].combine_chunks(), deleted["_rowid"].combine_chunks()]
    )
    images = lance.dataset(uri, version=a - 1)._take_rows(before) if len(before) else None
    n = inserted.num_rows + updated.num_rows + deleted.num_rows
    return n + (images.num_rows if images is not None else 0)


def timed(fn, *args, repeat: int) -> tuple[float, float, int]:
    """(median wall time, median CPU time of the process, all threads, result).

    CPU time is reported beside wall time: on a shared 2-core machine the wall time of a
    call includes waiting for a core, its CPU time does not."""
    times, cpu, out = [], [], 0
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn(*args)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return stats.median(times), stats.median(cpu), out


def run_size(args, rows: int) -> dict:
    base = os.path.join(args.dir, f"core_{rows}.lance")
    t0 = time.perf_counter()
    if not (args.reuse and os.path.isdir(base)):
        build(base, rows, rows // args.fragments)
    build_s = time.perf_counter() - t0
    table = Table(base, seed=rows)
    feed = ChangeFeed(base)
    results = []
    tag = 0
    for changes in args.changes:
        for change in args.only or CHANGES:
            for layout in ("clustered",) if change == "insert" else ("clustered", "scattered"):
                tag += 10
                first = table.version + 1
                t1 = time.perf_counter()
                getattr(table, change)(changes, layout, tag)
                commit_s = time.perf_counter() - t1
                a, b = first, table.version
                repeat = args.repeat if changes < 100_000 else max(1, args.repeat // 2)
                row = dict(rows=rows, changes=changes, layout=layout, change=change)
                row.update(start=a, end=b, commit_s=commit_s)
                # untimed: the pages of the images every method reads (the first method
                # timed on a fresh commit otherwise pays the disk reads for all of them)
                run_cold(base, a, b)
                for name, fn, arg in (
                    ("warm", run_warm, feed),
                    ("cold", run_cold, base),
                    ("delta", run_delta, base),
                    ("delta_take", run_delta_take, base),
                ):
                    wall, cpu, out = timed(fn, arg, a, b, repeat=repeat)
                    row[f"{name}_s"], row[f"{name}_cpu_s"], row[f"{name}_rows"] = wall, cpu, out
                for kind in ("s", "cpu_s"):
                    row[f"cold_vs_delta_take_{kind}"] = (
                        row[f"cold_{kind}"] / row[f"delta_take_{kind}"]
                    )
                    row[f"warm_vs_delta_take_{kind}"] = (
                        row[f"warm_{kind}"] / row[f"delta_take_{kind}"]
                    )
                    row[f"cold_vs_delta_{kind}"] = row[f"cold_{kind}"] / row[f"delta_{kind}"]
                results.append(row)
                print(json.dumps(row), flush=True)
    return dict(rows=rows, fragments=args.fragments, build_s=build_s, results=results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--fragments", type=int, default=10)
    ap.add_argument("--changes", type=int, nargs="+", default=[1, 1000, 100_000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--only", nargs="+", choices=CHANGES, default=None, help="time only these changes"
    )
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--out", default=None, help="write JSON results here")
    ap.add_argument("--reuse", action="store_true", help="reuse existing base tables")
    ap.add_argument(
        "--malloc-default",
        action="store_true",
        help="leave glibc's malloc as a fresh process has it (default: opt in with "
        "lance_cdf.keep_freed_memory(), as the lance-cdf command does)",
    )
    args = ap.parse_args()
    if not args.malloc_default:
        # the documented opt-in (lance_cdf.ops.malloc): builds older than the opt-in did it
        # by themselves in every process that read rows
        lance_cdf.keep_freed_memory()
    os.makedirs(args.dir, exist_ok=True)
    t0 = time.perf_counter()
    sizes = [run_size(args, rows) for rows in args.rows]
    meta = dict(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        pylance=lance.__version__,
        pyarrow=pa.__version__,
        repeat=args.repeat,
        total_s=time.perf_counter() - t0,
    )
    for size in sizes:
        print(f"\n{size['rows']:,} rows, {size['fragments']} fragments: ms wall (CPU)\n")
        print(
            "| changed | layout | change | events | lance-cdf cold | warm ChangeFeed | delta() "
            "| delta()+_take_rows | cold / hand-written | cold / delta() |"
        )
        print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in size["results"]:
            cells = [f"{r['changes']:,}", r["layout"], r["change"], f"{r['cold_rows']:,}"]
            for name in ("cold", "warm", "delta", "delta_take"):
                cells.append(f"{r[name + '_s'] * 1e3:.1f} ({r[name + '_cpu_s'] * 1e3:.1f})")
            for ratio in ("cold_vs_delta_take", "cold_vs_delta"):
                cells.append(f"{r[ratio + '_s']:.2f}x ({r[ratio + '_cpu_s']:.2f}x)")
            print("| " + " | ".join(cells) + " |")
    print(f"\ntotal {meta['total_s']:.0f} s")
    write_result(args.out, {"meta": meta, "sizes": sizes})


if __name__ == "__main__":
    main()
