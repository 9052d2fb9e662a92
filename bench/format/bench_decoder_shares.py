"""How much of a user-visible read each format's decoding takes: the most a faster decoder
of that format could save, measured without alternation noise.

    python -m bench.format.bench_decoder_shares --uri bench/out/decoders_1000000.lance \
        --repeat 3 --out bench/results/results_decoder_shares_1m.json

For every version of the table (made by bench/format/bench_decoders.py), a fresh
`lance_cdf.read_changes(uri, v, v)` ("cold") and a followed micro-batch (a `ChangeFeed`
that has read v-1, then version v: "followed") run with the three formats' decoders
wrapped by timers: deletion files (`deletions._decode`), manifests (`parse_manifest` as
`TableLog` calls it) and row-ID sequences (`RowIdSequence.from_bytes`). Reported per
version and operation: the operation's wall time and each format's share of it (medians
of --repeat runs). --no-hand reads row-ID sequences by protobuf only, to show what the
kept hand path reads in its place. A hand path for a format can save at most its share
of the operation: below 20%, none can pay (a hand path is kept only where it saves at
least 20% of a user-visible read in both wall and CPU time), whatever the alternated
timings' noise on a shared machine says.
"""

from __future__ import annotations

import argparse
import json
import time

import lance_cdf
from bench.support import stats
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.format import deletions, rowids, table

SPENT = {"deletions": 0.0, "manifest": 0.0, "rowids": 0.0}


def _timed(name, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - t0

    return wrapper


def install() -> None:
    deletions._decode = _timed("deletions", deletions._decode)
    table.parse_manifest = _timed("manifest", table.parse_manifest)
    from_bytes = rowids.RowIdSequence.from_bytes.__func__
    rowids.RowIdSequence.from_bytes = classmethod(_timed("rowids", from_bytes))


def _events(feed: ChangeFeed, v: int) -> int:
    schema = feed.user_schema(v, v)
    return sum(b.num_rows for b in feed.range_events(feed.plans(v, v), schema))


def one(op: str, uri: str, v: int) -> dict:
    feed = None
    if op == "followed":
        feed = ChangeFeed(uri)
        _events(feed, v - 1)
    for k in SPENT:
        SPENT[k] = 0.0
    t0 = time.perf_counter()
    if op == "cold":
        n = sum(b.num_rows for b in lance_cdf.read_changes(uri, v, v))
    else:
        n = _events(feed, v)
    total = time.perf_counter() - t0
    return {"total": total, "events": n, **dict(SPENT)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", required=True)
    ap.add_argument("--versions", type=int, nargs="*", default=None, help="default: all > 2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--no-hand",
        action="store_true",
        help="row-ID sequences by protobuf only (the hand path patched off)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.no_hand:
        rowids._range_segments = lambda data: None
    install()
    feed = ChangeFeed(args.uri)
    versions = args.versions or list(range(3, feed.latest_version() + 1))
    rows = []
    for v in versions:
        op_name = feed.table.manifest(v).operation
        for op in ("cold", "followed"):
            runs = [one(op, args.uri, v) for _ in range(args.repeat)]
            row = {"version": v, "operation": op_name, "op": op, "events": runs[0]["events"]}
            row["total_ms"] = stats.median(r["total"] for r in runs) * 1e3
            for k in SPENT:
                row[f"{k}_share"] = stats.median(r[k] / r["total"] for r in runs)
            rows.append(row)
            print(
                f"v{v:<4} {op_name:<12} {op:<9} {row['events']:>8} events "
                f"{row['total_ms']:8.1f} ms  "
                + "  ".join(f"{k} {row[f'{k}_share']:6.1%}" for k in SPENT),
                flush=True,
            )
    for k in SPENT:
        top = max(rows, key=lambda r: r[f"{k}_share"])
        print(f"largest {k} share: {top[f'{k}_share']:.1%} (v{top['version']}, {top['op']})")
    if args.out:
        with open(args.out, "w") as f:
            meta = {"uri": args.uri, "repeat": args.repeat, "no_hand": args.no_hand}
            json.dump({**meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
