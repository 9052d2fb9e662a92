"""Replica index upkeep: batches applied to a replica with and without the source's indexes
kept (replicate/index_keeper.py), no Kafka.

    python -m bench.replicate.bench_replica_indexes BASE_ROWS BATCH_ROWS BATCHES [COMPACT_EVERY]

A replica of BASE_ROWS rows (id, a 20-value category, short text, a 128-d float vector),
then BATCHES batches of BATCH_ROWS new rows applied by `ReplicaTable.apply` and its upkeep
(`maintain`, a compaction every COMPACT_EVERY batches, default 100): once with no
definition, once with BTREE, BITMAP, INVERTED and IVF_PQ (32 partitions, 16 sub-vectors)
built first (the initial build time is printed) and kept current. Prints rows/s, the upkeep
seconds, and the unindexed rows per index at the end.
"""

import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from lance_cdf.format.definitions import IndexDefinition, TableDefinition
from lance_cdf.replicate.index_keeper import IndexKeeper, unindexed_rows
from lance_cdf.replicate.replica import OFFSETS_PROPERTY, ReplicaTable

dim = 128
base = int(sys.argv[1])
batch = int(sys.argv[2])
nb = int(sys.argv[3])
every = int(sys.argv[4]) if len(sys.argv) > 4 else 100


def rows(lo, n, seed):
    rng = np.random.default_rng(seed)
    ids = np.arange(lo, lo + n)
    return pa.table(
        {
            "_source_rowid": ids,
            "id": ids,
            "cat": pa.array([f"c{i % 20}" for i in ids]),
            "text": pa.array([f"word{i % 97} word{i % 31} item {i}" for i in ids]),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.standard_normal(n * dim).astype(np.float32)), dim
            ),
        }
    )


d = TableDefinition.of(
    [
        IndexDefinition.of("id_idx", "BTREE", ("id",), {}),
        IndexDefinition.of("cat_idx", "BITMAP", ("cat",), {}),
        IndexDefinition.of("text_idx", "INVERTED", ("text",), {}),
        IndexDefinition.of(
            "vec_idx",
            "IVF_PQ",
            ("vec",),
            {"metric": "l2", "num_partitions": 32, "num_sub_vectors": 16},
        ),
    ],
    {},
    {},
    {},
)
for mode in ("none", "indexes"):
    keeper = IndexKeeper() if mode == "indexes" else None
    r = ReplicaTable(tempfile.mkdtemp() + "/r", ["_source_rowid"], keeper=keeper)
    r.apply(rows(0, base, 0), None, {OFFSETS_PROPERTY: "{}"})
    if keeper:
        keeper.want(d)
        t0 = time.perf_counter()
        r.maintain()
        print(f"initial build {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    up = 0.0
    for i in range(nb):
        r.apply(rows(base + i * batch, batch, i + 1), None, {OFFSETS_PROPERTY: "{}"})
        t1 = time.perf_counter()
        r.maintain(compact=(i % every == every - 1), batch_rows=batch)
        up += time.perf_counter() - t1
    el = time.perf_counter() - t0
    loose = unindexed_rows(r.open(), skip={"_source_rowid_idx"})
    print(
        f"{mode}: {nb} batches of {batch} rows into {base}: {nb * batch / el:.0f} rows/s, "
        f"upkeep {up:.1f}s of {el:.1f}s; unindexed {loose}"
    )
