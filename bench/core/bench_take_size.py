"""Reading the same number of scattered rows from small and large data files, side by side.

    python -m bench.core.bench_take_size --dir /work/r18c-bench --rows 1000000 10000000

Opens bench_core's tables (`core_{rows}.lance` under --dir; nothing is written to them) at
their latest version, picks --take live rows spread at random over the table's first
--fragments fragments (bench_core builds them with rows/fragments rows each: 100,000-row
files at 1M rows, 1,000,000-row files at 10M), and times reading those rows, warm (readers
open, row-ID index built, the rows read once before), alternating between the methods:

  * lance-cdf   `RowReader.read` of the rows at their (fragment, physical offset): what
                read_changes does for pre-images and deleted rows (all columns), and the
                same per column;
  * _take_rows  pylance `LanceDataset._take_rows(row_ids)` on an open dataset: the
                hand-written peer's read (all columns, and per column);
  * in two reads  the same rows as two `RowReader.read` calls of every other row (what a
                range does when one version's pre-images and the next version's deleted
                rows lie in the same data files): how much one call per data file saves.

Prints CPU ms (medians of --repeat) per table size and the ratio of the largest size to
the smallest for each method: whether reading scattered rows from bigger files costs more
per row, and whether pylance's own take pays the same. Beside it, the read system calls
one call made (`syscr` of /proc/self/io, Linux): pylance reads a data file with one
positioned read per I/O request it could not merge with a neighbour.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import lance
import numpy as np
import pyarrow as pa

from bench.support import stats
from lance_cdf.core.plan import RowSet
from lance_cdf.core.rows import RowReader
from lance_cdf.format.table import TableLog


def pick(ds: lance.LanceDataset, fragments: int, n: int, seed: int) -> RowSet:
    """n live rows spread at random over the first `fragments` fragments, by row ID order."""
    rng = np.random.default_rng(seed)
    parts = []
    for frag in ds.get_fragments()[:fragments]:
        t = frag.to_table(columns=[], with_row_id=True, with_row_address=True)
        parts.append(t)
    t = pa.concat_tables(parts)
    chosen = np.sort(rng.choice(t.num_rows, n, replace=False))
    rowids = t["_rowid"].to_numpy()[chosen].astype(np.uint64)
    addr = t["_rowaddr"].to_numpy()[chosen].astype(np.uint64)
    order = np.argsort(rowids, kind="stable")
    return RowSet(
        rowids[order],
        (addr[order] >> np.uint64(32)).astype(np.int64),
        (addr[order] & np.uint64(0xFFFFFFFF)).astype(np.int64),
        np.zeros(n, np.uint64),
    )


def cpu_ms(fn, repeat: int) -> float:
    cpu = []
    for _ in range(repeat):
        c0 = time.process_time()
        fn()
        cpu.append(time.process_time() - c0)
    return stats.median(cpu) * 1e3


def read_calls() -> int | None:
    """Read system calls of this process so far (None where /proc/self/io is missing)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("syscr"))
    except (OSError, StopIteration):
        return None


def calls_of(fn) -> int | None:
    before = read_calls()
    fn()
    after = read_calls()
    return None if before is None or after is None else after - before - 1  # its own read


def run_size(args, rows: int) -> dict:
    uri = os.path.join(args.dir, f"core_{rows}.lance")
    ds = lance.dataset(uri)
    version = ds.version
    sel = pick(ds, args.fragments, args.take, seed=rows)
    reader = RowReader(TableLog(uri))
    full = reader.annotated(version)
    columns = [[f.name] for f in full] + [full.names]
    rowids = pa.array(sel.rowids, pa.uint64())
    out = dict(rows=rows, version=version, take=args.take, fragments=args.fragments)
    calls = {}
    for cols in columns:
        schema = pa.schema([full.field(c) for c in cols])
        label = "+".join(cols) if len(cols) > 1 else cols[0]
        calls[f"lance-cdf {label}"] = lambda schema=schema: reader.read(sel, version, schema)
        calls[f"_take_rows {label}"] = lambda cols=cols: ds._take_rows(rowids, columns=cols)
    halves = [sel.take(slice(0, None, 2)), sel.take(slice(1, None, 2))]
    calls["lance-cdf in two reads, id+name+vec"] = lambda: [
        reader.read(half, version, full) for half in halves
    ]
    for fn in calls.values():  # readers open, index built, pages in the page cache
        fn()
    got = {name: [] for name in calls}
    for _ in range(args.rounds):  # methods alternate: the machine's load hits all alike
        for name, fn in calls.items():
            got[name].append(cpu_ms(fn, args.repeat))
    out["cpu_ms"] = {name: stats.median(v) for name, v in got.items()}
    out["read_calls"] = {name: calls_of(fn) for name, fn in calls.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--fragments", type=int, default=10)
    ap.add_argument("--take", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sizes = [run_size(args, rows) for rows in args.rows]
    names = list(sizes[0]["cpu_ms"])
    head = " | ".join(f"{s['rows']:,} rows" for s in sizes)
    print(f"\n{args.take:,} scattered rows, CPU ms (medians)\n")
    calls = " | ".join(f"read calls, {s['rows']:,}" for s in sizes)
    print(f"| read | {head} | largest / smallest | {calls} |")
    print("|---|" + "---:|" * (2 * len(sizes) + 1))
    for name in names:
        vals = [s["cpu_ms"][name] for s in sizes]
        cells = " | ".join(f"{v:.1f}" for v in vals)
        n_calls = " | ".join(str(s["read_calls"][name]) for s in sizes)
        print(f"| {name} | {cells} | {vals[-1] / vals[0]:.2f}x | {n_calls} |")
    if args.out:
        meta = dict(
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            load=os.getloadavg(),
            pylance=lance.__version__,
        )
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "sizes": sizes}, f, indent=2)


if __name__ == "__main__":
    main()
