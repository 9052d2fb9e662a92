"""What reading a table's definition costs the publisher's commit (spark/sink/definition_sync.py):
time, and object-store requests counted by the S3 server (lance_cdf_devtools.S3Server),
for a table with a BTREE, a BITMAP, an INVERTED and an IVF_PQ index on a --dim vector.

    python -m bench.spark.bench_definitions --rows 20000 --dim 128 \
        --out bench/results/results_definitions.json

Cases, each the median of --repeat runs (a fresh process state per case where marked):
  * cold      a process's first capture at a version (DefinitionCapture empty: every index
              described, the vector index's file opened for its partition count);
  * warm      the next version after an append (indexes unchanged: the segments are known,
              nothing but the manifest read);
  * optimize  the version after optimize_indices (new segments: described again);
  * commit    what one micro-batch's commit asks with nothing changed: the definitions at
              start and end (TableDefinitions.unchanged, the cached start).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from bench.support import stats
from bench.support.results import write_result
from lance_cdf.format.definition_capture import DefinitionCapture
from lance_cdf.spark.sink.definition_sync import Span, TableDefinitions
from lance_cdf_devtools import S3Server
from lance_cdf_devtools.s3app import UNCOUNTED_AGENT

BUCKET = "lance-cdf-bench"


def rows(lo: int, hi: int, dim: int) -> pa.Table:
    ids = np.arange(lo, hi)
    rng = np.random.default_rng(lo)
    vec = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.random(len(ids) * dim, dtype=np.float32)), dim
    )
    return pa.table(
        {
            "id": ids,
            "cat": [f"c{i % 8}" for i in ids],
            "text": [f"word{i % 97} and other words {i}" for i in ids],
            "vec": vec,
        }
    )


def measured(server: S3Server | None, fn: Any) -> tuple[float, int, dict[str, int]]:
    if server is not None:
        server.reset_counts()
    t = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t) * 1000
    counts: Counter[str] = server.request_counts() if server is not None else Counter()
    return ms, sum(counts.values()), dict(counts)


def run(uri: str, opts: dict[str, str], server: S3Server | None, repeat: int) -> dict[str, Any]:
    writer = {**opts, "user_agent": f"{UNCOUNTED_AGENT} bench writer"} if server else opts
    ds = lance.dataset(uri, storage_options=writer or None)
    v_built = ds.version
    lance.write_dataset(
        rows(10**7, 10**7 + 10, DIM), uri, mode="append", storage_options=writer or None
    )
    v_append = v_built + 1
    lance.dataset(uri, storage_options=writer or None).optimize.optimize_indices()
    v_opt = lance.dataset(uri, storage_options=writer or None).version
    out: dict[str, Any] = {}
    cases: dict[str, list[tuple[float, int, dict[str, int]]]] = {
        "cold": [],
        "warm": [],
        "optimize": [],
        "commit": [],
    }
    for _ in range(repeat):
        cap = DefinitionCapture()

        def at(v: int, cap: DefinitionCapture = cap) -> None:
            cap.capture(lance.dataset(uri, version=v, storage_options=opts or None))

        cases["cold"].append(measured(server, lambda: at(v_built)))
        cases["warm"].append(measured(server, lambda: at(v_append)))
        cases["optimize"].append(measured(server, lambda: at(v_opt)))
        defs = TableDefinitions(uri, opts)
        defs.at(v_built)  # the previous micro-batch's end
        cases["commit"].append(
            measured(server, lambda d=defs: d.unchanged(Span(v_built, v_append)))
        )
    for name, got in cases.items():
        out[name] = {
            "ms_median": round(stats.median(g[0] for g in got), 1),
            "requests_median": stats.median(g[1] for g in got),
            "requests_first": got[0][2],
        }
    return out


DIM = 128


def main() -> None:
    global DIM
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    DIM = args.dim
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = S3Server(tmp)
        server.start()
        try:
            server.create_bucket(BUCKET)
            opts = server.storage_options()
            for where, uri, o, srv in (
                ("local", os.path.join(tmp, "t.lance"), {}, None),
                ("s3 (moto)", f"s3://{BUCKET}/t.lance", opts, server),
            ):
                writer = {**o, "user_agent": f"{UNCOUNTED_AGENT} bench writer"} if srv else o
                ds = lance.write_dataset(
                    rows(0, args.rows, DIM),
                    uri,
                    enable_stable_row_ids=True,
                    storage_options=writer or None,
                )
                ds.create_scalar_index("id", "BTREE")
                ds.create_scalar_index("cat", "BITMAP")
                ds.create_scalar_index("text", "INVERTED")
                ds.create_index(
                    "vec",
                    "IVF_PQ",
                    num_partitions=args.partitions,
                    num_sub_vectors=DIM // 16,
                )
                results[where] = run(uri, o, srv, args.repeat)
                print(where, json.dumps(results[where], indent=1))
        finally:
            server.close()
    commit_id = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit_id,
        "command": " ".join([os.path.basename(sys.executable), "-m", __spec__.name, *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "results": results,
    }
    write_result(args.out, doc, indent=1)


if __name__ == "__main__":
    main()
