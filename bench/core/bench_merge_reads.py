"""read_changes with the image reads of consecutive versions merged per data file, and not.

    python -m bench.core.bench_merge_reads --uri DIR/core_10000000.lance --ranges 73-74 65-68

For each version range A-B of the table, checks that both ways give the same events and
times a fresh `read_changes(uri, A, B)` alternately with merging on (the default:
`RowReader.merge_reads`, one take per data file for the rows of up to 8 small consecutive
versions) and off (each version's reads on their own, as before), CPU ms, medians.
`--source`: the same for the Spark source's partitions instead (a batch read's
partitions, each read by the reader a Spark task gets, in this process: its `ChangeFeed`
stays open across timings, as in an executor).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import lance_cdf
import lance_cdf.core.feed as feed
from bench.support import stats

ON = feed._GROUP_IMAGES


def run(uri: str, a: int, b: int, merge: bool, source: bool = False) -> tuple[float, object]:
    feed._GROUP_IMAGES = ON if merge else 0  # 0: no group is small enough to merge
    if source:
        return _run_source(uri, a, b)
    c0 = time.process_time()
    table = lance_cdf.read_changes(uri, a, b).read_all()
    return (time.process_time() - c0) * 1e3, table


_READERS: dict = {}


def _run_source(uri: str, a: int, b: int) -> tuple[float, object]:
    import pyarrow as pa

    from lance_cdf.spark.source.data_source import LanceCdfDataSource

    key = (uri, a, b)
    if key not in _READERS:
        ds = LanceCdfDataSource({"path": uri, "startingVersion": str(a), "endingVersion": str(b)})
        reader = ds.reader(ds.schema())
        _READERS[key] = (reader, reader.partitions())
    reader, partitions = _READERS[key]
    c0 = time.process_time()
    table = pa.Table.from_batches([batch for p in partitions for batch in reader.read(p)])
    return (time.process_time() - c0) * 1e3, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", action="append", required=True)
    ap.add_argument("--ranges", nargs="+", required=True, help="A-B version ranges")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--source", action="store_true", help="the Spark source's partitions")
    args = ap.parse_args()
    rows = []
    print("| table | versions | events | merged CPU ms | separate CPU ms | merged / separate |")
    print("|---|---|---:|---:|---:|---:|")
    for uri in args.uri:
        for spec in args.ranges:
            a, b = (int(x) for x in spec.split("-"))
            _, on = run(uri, a, b, True, args.source)
            _, off = run(uri, a, b, False, args.source)
            if not on.equals(off):
                raise SystemExit(f"{uri} {a}-{b}: merged reads changed the events")
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeat):
                for merge in (True, False):
                    times[merge].append(run(uri, a, b, merge, args.source)[0])
            m, s = stats.median(times[True]), stats.median(times[False])
            rows.append(
                dict(
                    uri=uri,
                    start=a,
                    end=b,
                    events=on.num_rows,
                    merged_cpu_ms=m,
                    separate_cpu_ms=s,
                    source=args.source,
                )
            )
            name = os.path.basename(uri.rstrip("/"))
            print(f"| {name} | {a}-{b} | {on.num_rows:,} | {m:.1f} | {s:.1f} | {m / s:.2f}x |")
    if args.out:
        meta = dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), load=os.getloadavg())
        with open(args.out, "w") as fh:
            json.dump({"meta": meta, "results": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
