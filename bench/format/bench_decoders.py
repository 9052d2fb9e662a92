"""Do the format's hand-written decoders pay? Each one on against forced off, alternated.

    python -m bench.format.bench_decoders --rows 1000000 --changes 1000 100000 1 1000 \
        --repeat 5 --out bench/results/results_decoders.json

`lance_cdf.format` reads three formats with a library and, next to it, may keep one hand
path in numpy that returns None (-> the library) for layouts it does not know:

  deletions  `.arrow` deletion files: `deletions._offsets_by_hand` (else `pa.ipc.open_file`)
  rowids     Range-only row-ID sequences: `rowids._range_segments` (else protobuf's parse)
  manifest   a manifest's fragment entries kept as bytes and compared byte for byte:
             `manifest._manifest_entries` (else protobuf parses the whole Manifest)

On a table built like bench/core/bench_core.py's (id, name, 128-d vector, stable row IDs,
--fragments fragments), every commit of the matrix

    changed rows (--changes, in order: later levels run on a table the earlier ones aged)
    x {insert, update, delete, merge_insert} x {clustered, scattered}

is read by the two user-visible operations:
  * cold      a fresh `lance_cdf.read_changes(uri, v, v)`: the changes of commit v (its
              plan diffs versions v-1 and v), every event consumed;
  * followed  a `ChangeFeed` already open that has read version v-1 (untimed), then the
              plan of version v and its events (a micro-batch of a followed feed).
For each cell and each repeat, the modes `hand` (every hand path present) and
`no_<format>` (that one hand path patched to return None, i.e. the library reads
everything) run one after the other, the order rotated at every repeat, so the machine's
load falls on all modes alike. Reported: medians of wall and process CPU time per mode
and `saving` = 1 - hand / no_<format> (the fraction of the operation the hand path saves).
Only hand paths that exist in the checked-out code are switched.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime

import lance
import pyarrow as pa

import lance_cdf
from bench.core.bench_core import Table, build
from bench.support import stats
from bench.support.results import write_result
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.format import deletions, manifest, rowids

CHANGES = ["insert", "update", "delete", "merge_insert"]

# format -> (module, attribute of its hand path); the bench patches it to decline
HAND_PATHS = {
    "deletions": (deletions, "_offsets_by_hand"),
    "rowids": (rowids, "_range_segments"),
    "manifest": (manifest, "_manifest_entries"),
}


def _decline(*args, **kwargs):
    return None


def switches() -> dict[str, tuple]:
    """format -> (module, attribute, the hand path) for the hand paths that exist."""
    out = {}
    for name, (module, attr) in HAND_PATHS.items():
        if hasattr(module, attr):
            out[name] = (module, attr, getattr(module, attr))
    return out


def set_mode(mode: str, paths: dict[str, tuple]) -> None:
    for name, (module, attr, hand) in paths.items():
        setattr(module, attr, _decline if mode == f"no_{name}" else hand)


def cold(uri: str, v: int) -> int:
    return sum(b.num_rows for b in lance_cdf.read_changes(uri, v, v))


def _events(feed: ChangeFeed, v: int) -> int:
    schema = feed.user_schema(v, v)
    return sum(b.num_rows for b in feed.range_events(feed.plans(v, v), schema))


def followed(uri: str, v: int) -> tuple[float, float, int]:
    feed = ChangeFeed(uri)
    _events(feed, v - 1)  # untimed: the feed has read the previous version
    c0, t0 = time.process_time(), time.perf_counter()
    n = _events(feed, v)
    return time.perf_counter() - t0, time.process_time() - c0, n


def timed_cold(uri: str, v: int) -> tuple[float, float, int]:
    c0, t0 = time.process_time(), time.perf_counter()
    n = cold(uri, v)
    return time.perf_counter() - t0, time.process_time() - c0, n


def measure(uri: str, v: int, modes: list[str], paths: dict, repeat: int) -> dict:
    samples = {
        m: {op: {"wall": [], "cpu": [], "rows": set()} for op in ("cold", "followed")}
        for m in modes
    }
    for r in range(repeat):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for mode in order:
            set_mode(mode, paths)
            for op, fn in (("cold", timed_cold), ("followed", followed)):
                wall, cpu, n = fn(uri, v)
                s = samples[mode][op]
                s["wall"].append(wall)
                s["cpu"].append(cpu)
                s["rows"].add(n)
    set_mode("hand", paths)
    out = {}
    for op in ("cold", "followed"):
        rows = {n for m in modes for n in samples[m][op]["rows"]}
        if len(rows) != 1:
            raise AssertionError(f"modes disagree on the number of events: {rows}")
        cell = {"events": rows.pop()}
        for m in modes:
            cell[f"{m}_wall_ms"] = stats.median(samples[m][op]["wall"]) * 1e3
            cell[f"{m}_cpu_ms"] = stats.median(samples[m][op]["cpu"]) * 1e3
        for m in modes[1:]:
            for kind in ("wall", "cpu"):
                hand, off = cell[f"hand_{kind}_ms"], cell[f"{m}_{kind}_ms"]
                cell[f"saving_{m[3:]}_{kind}"] = 1 - hand / off
        out[op] = cell
    return out


def run_size(args, rows: int, paths: dict) -> dict:
    uri = os.path.join(args.dir, f"decoders_{rows}.lance")
    t0 = time.perf_counter()
    if not (args.reuse and os.path.isdir(uri)):
        build(uri, rows, rows // args.fragments)
    build_s = time.perf_counter() - t0
    table = Table(uri, seed=rows)
    modes = ["hand"] + [f"no_{name}" for name in paths]
    results, tag = [], 0
    for level, changes in enumerate(args.changes):
        for change in args.only or CHANGES:
            for layout in ("clustered",) if change == "insert" else ("clustered", "scattered"):
                tag += 10
                getattr(table, change)(changes, layout, tag)
                v = table.version
                cold(uri, v)  # untimed: the data pages every mode reads
                repeat = args.repeat if changes < 100_000 else max(3, args.repeat // 2)
                row = dict(
                    rows=rows,
                    level=level,
                    changes=changes,
                    change=change,
                    layout=layout,
                    version=v,
                    repeat=repeat,
                )
                row.update(measure(uri, v, modes, paths, repeat))
                results.append(row)
                print(json.dumps(row), flush=True)
    return dict(rows=rows, fragments=args.fragments, build_s=build_s, results=results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--fragments", type=int, default=10)
    ap.add_argument("--changes", type=int, nargs="+", default=[1000, 100_000, 1, 1000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", nargs="+", choices=CHANGES, default=None)
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--out", default=None, help="write JSON results here")
    ap.add_argument("--reuse", action="store_true", help="reuse existing base tables")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    paths = switches()
    t0 = time.perf_counter()
    sizes = [run_size(args, rows, paths) for rows in args.rows]
    meta = dict(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        pylance=lance.__version__,
        pyarrow=pa.__version__,
        hand_paths=sorted(paths),
        changes=args.changes,
        total_s=time.perf_counter() - t0,
    )
    for size in sizes:
        print(f"\n{size['rows']:,} rows: saving of each hand path, medians, wall (CPU)\n")
        heads = [f"saving {name}" for name in paths]
        print(
            "| level | changed | change | layout | op | events | hand ms | "
            + " | ".join(heads)
            + " |"
        )
        print("|" + "---|" * (7 + len(heads)))
        for r in size["results"]:
            for op in ("cold", "followed"):
                c = r[op]
                cells = [
                    str(r["level"]),
                    f"{r['changes']:,}",
                    r["change"],
                    r["layout"],
                    op,
                    f"{c['events']:,}",
                    f"{c['hand_wall_ms']:.1f} ({c['hand_cpu_ms']:.1f})",
                ]
                for name in paths:
                    cells.append(
                        f"{c[f'saving_{name}_wall']:+.0%} ({c[f'saving_{name}_cpu']:+.0%})"
                    )
                print("| " + " | ".join(cells) + " |")
    print(f"\ntotal {meta['total_s']:.0f} s")
    write_result(args.out, {"meta": meta, "sizes": sizes})


if __name__ == "__main__":
    main()
