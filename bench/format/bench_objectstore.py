"""Change extraction with the table on a local S3-compatible server vs on local disk,
and the object-store requests each commit step costs.

    python -m bench.format.bench_objectstore --rows 1000000 --rows-per-file 20000 \
        --out bench/results/results_objectstore_1m.json

Writes the same table (id int64, name string, vec fixed_size_list<float32>[16], stable
row IDs) to local disk and to `lance_cdf_devtools.S3Server` (moto on 127.0.0.1), then
applies the same commits to both, each touching a known number of fragments. For each
commit `v` it times the extraction (`ChangeFeed` planning + reading, which is what
`read_changes(uri, v, v)` does) on both, and counts requests for one extraction:
  * client  requests lance-cdf's own object-store client made (manifests, row-ID and
            deletion files, the _versions/ listing), counted in ObjectStoreFileSystem;
  * server  every request the S3 server served for that extraction, pylance's data
            reads included (counted by the server).
The target: requests grow with the fragments a commit changed, not with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from datetime import UTC, datetime

import lance
import numpy as np
import pyarrow as pa

from bench.support import stats
from bench.support.tables import id_name_vec
from lance_cdf.core.feed import ChangeFeed
from lance_cdf_devtools import S3Server

DIM = 16


def build(uri: str, n: int, rows_per_file: int, so: dict | None) -> None:
    chunk = 250_000
    schema = id_name_vec(0, 1, 0, DIM).schema

    def batches():
        for start in range(0, n, chunk):
            yield from id_name_vec(start, min(chunk, n - start), start, DIM).to_batches()

    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()),
        uri,
        schema=schema,
        enable_stable_row_ids=True,
        max_rows_per_file=rows_per_file,
        storage_options=so,
    )


def commits(n: int, per_file: int) -> list[tuple[str, object]]:
    """(label, operation) pairs; each operation commits one version."""
    frags = n // per_file

    def update(where):
        return lambda ds, uri, so: ds.update({"name": "'upd'"}, where=where)

    def delete(where):
        return lambda ds, uri, so: ds.delete(where)

    def append(ds, uri, so):
        lance.write_dataset(id_name_vec(n, 1000, n, DIM), uri, mode="append", storage_options=so)

    def upsert(ds, uri, so):
        src = pa.concat_tables(
            [
                id_name_vec(per_file // 2, 500, per_file // 2, DIM),
                id_name_vec(n + 5000, 500, n + 5000, DIM),
            ]
        )
        ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)

    return [
        ("update 1 row (1 fragment)", update("id = 3")),
        ("update 100 rows (1 fragment)", update("id >= 100 AND id < 200")),
        (
            f"update 1 row in each of {min(10, frags)} fragments",
            update(f"id % {per_file} = 5 AND id < {min(10, frags) * per_file}"),
        ),
        (f"update 1 row in each of {frags} fragments", update(f"id % {per_file} = 7")),
        (f"delete 1,000 rows across {frags} fragments", delete(f"id % {n // 1000} = 11")),
        ("append 1,000 rows (1 new fragment)", append),
        ("merge_insert 500 updates (1 fragment) + 500 inserts", upsert),
    ]


def extract(uri: str, version: int, so: dict | None) -> tuple[int, ChangeFeed, object]:
    """What read_changes(uri, version, version) does; returns (events, feed, plan)."""
    feed = ChangeFeed(uri, so)
    start, end = feed.resolve_range(version, version, refresh=False)
    schema = feed.user_schema(start, end)
    n = 0
    for changes in feed.plans(start, end):
        for batch in feed.events(changes, schema):
            n += batch.num_rows
    return n, feed, feed.plan(version)


def changed_fragments(plan) -> int:
    ids = np.concatenate(
        [
            plan.inserted.fragment_ids,
            plan.deleted.fragment_ids,
            plan.update_pre.fragment_ids,
            plan.update_post.fragment_ids,
        ]
    )
    return int(np.unique(ids).size)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return stats.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rows-per-file", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="lance-cdf-bench-s3-")
    local = os.path.join(work, "t.lance")
    with S3Server() as s3:
        s3.create_bucket("bench")
        so = s3.storage_options()
        remote = "s3://bench/t.lance"
        t = time.perf_counter()
        build(local, args.rows, args.rows_per_file, None)
        build(remote, args.rows, args.rows_per_file, so)
        print(f"built both tables in {time.perf_counter() - t:.1f}s", flush=True)
        steps = commits(args.rows, args.rows_per_file)
        results = []
        for label, op in steps:
            for uri, opts in ((local, None), (remote, so)):
                op(lance.dataset(uri, storage_options=opts), uri, opts)
            v = lance.dataset(local).version
            assert lance.dataset(remote, storage_options=so).version == v
            n_local, _, plan = extract(local, v, None)
            s3.reset_counts()
            n_remote, feed, _ = extract(remote, v, so)
            server = s3.request_counts()
            client = feed.table.fs.requests
            assert n_local == n_remote
            t_local = timed(lambda: extract(local, v, None), args.repeat)  # noqa: B023
            t_remote = timed(lambda: extract(remote, v, so), args.repeat)  # noqa: B023
            row = {
                "version": v,
                "commit": label,
                "changed_fragments": changed_fragments(plan),
                "events": n_local,
                "local_s": round(t_local, 4),
                "s3_s": round(t_remote, 4),
                "s3_over_local": round(t_remote / t_local, 2),
                "client_requests": sum(client.values()),
                "client_by_kind": dict(client),
                "server_requests": sum(server.values()),
                "server_by_kind": dict(server),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    fragments = -(-args.rows // args.rows_per_file)
    print(f"\n{args.rows:,} rows in {fragments} fragments; medians of {args.repeat}\n")
    print(
        "| commit | changed fragments | events | local (s) | S3 (s) | S3 / local | "
        "client requests | server requests |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['commit']} | {r['changed_fragments']} | {r['events']:,} | {r['local_s']} | "
            f"{r['s3_s']} | {r['s3_over_local']}x | {r['client_requests']} | "
            f"{r['server_requests']} |"
        )
    if args.out:
        meta = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "rows": args.rows,
            "rows_per_file": args.rows_per_file,
            "fragments": fragments,
            "repeat": args.repeat,
            "server": "moto (lance_cdf_devtools.S3Server) on 127.0.0.1",
            "python": platform.python_version(),
            "pylance": lance.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
