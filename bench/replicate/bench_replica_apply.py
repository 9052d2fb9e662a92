"""Per-batch apply time into replicas of growing size: is the cost the batch's or the table's?

    python -m bench.replicate.bench_replica_apply --sizes 100000 1000000 10000000 \
        --batches 1000 100000 --repeat 5 --methods merge_insert replica_index replica \
        --out bench/results/results_replica_apply.json

No Kafka, no Avro: one batch of final row states (80% updates of existing keys, 10% new
keys, 10% deletes; key `id`, 5 narrow columns) applied to a replica of N rows by
  * merge_insert   the replicator's original path: merge_insert(key) delete + upsert, two
                   commits, no index on the key (`use_index(False)`: a full join);
  * merge_index    the same two merge_inserts with a BTREE index on the key and
                   `use_index(True)` (pylance's index-backed merge_insert);
  * replica        `ReplicaTable.apply` (lance_cdf/replicate/replica.py) as the
                   replicator runs it now: key lookup in the in-memory key map
                   (keymap.py: sorted keys + row addresses, `np.searchsorted`), built
                   once from one scan of the key column before the clock starts (its
                   build time and size are reported); the new keys flagged fresh;
                   deletion vectors on the touched fragments, new fragments, one
                   `LanceOperation.Update` commit;
  * replica_index  the previous build's path (branch r21b), `key_map=False`: key lookup
                   through the BTREE index the replicator
                   builds (KEY_INDEX_ZONE_ROWS-row pages, preloaded into the index cache
                   when the ReplicaTable first meets it, before the clock starts), or one
                   key-column scan for a batch too large to probe; the new keys flagged
                   fresh (as the replicator flags source inserts) and not looked up;
                   deletion vectors on the touched fragments, new fragments, one
                   `LanceOperation.Update` commit;
  * replica_prev   the same path as the previous build ran it: Lance's default 4096-row
                   index pages, no preloading (pages read from storage as probes touch
                   them, then cached), every key looked up;
  * replica_keep   `replica` with `keep_row_ids=True` (updated rows keep their replica
                   row IDs; Lance then resolves them against the whole table at commit).
Each method runs on its own copy of the base replica (the index differs), interleaved.
Every commit records the properties the replicator writes in each batch's commit of a
keyed replica, whole source versions (position, owner, source version; `--bare-props`:
only the offsets, as the bench did before replicas recorded their owner and source
version).
After every apply the replica is restored to its base version, so each apply sees the
same table (the key map of `replica` is reset to the one built at the base version: a
restore is a commit the map was not told about, which the replicator would rebuild it
after). Each time is the median of --repeat applies. Replicas are built once under
--dir and reused.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import time

import lance
import numpy as np
import pyarrow as pa

from bench.support import stats
from bench.support.results import write_result
from bench.support.tables import narrow
from lance_cdf.replicate.key_lookup import KEY_INDEX_ZONE_ROWS, key_index_config
from lance_cdf.replicate.replica import (
    OFFSETS_PROPERTY,
    RECORDS_THROUGH_PROPERTY,
    SOURCE_TABLE_PROPERTY,
    SOURCE_VERSION_PROPERTY,
    TOPIC_PROPERTY,
    TRANSACTION_OFFSET_PROPERTY,
    VERSION_OFFSETS_PROPERTY,
    ReplicaTable,
)

KEY = "id"


def build(path: str, n: int, zone: int = KEY_INDEX_ZONE_ROWS) -> float:
    """The base replica of n rows with a BTREE index on the key, `zone` rows per index
    page (built once; a base with the other page size is copied and re-indexed)."""
    try:
        ds = lance.dataset(path)
        if ds.count_rows() == n and ds.list_indices():
            return 0.0
    except (ValueError, FileNotFoundError, OSError):
        pass
    t0 = time.perf_counter()
    config = key_index_config() if zone == KEY_INDEX_ZONE_ROWS else "BTREE"
    other = base_path(
        os.path.dirname(path), n, 4096 if zone == KEY_INDEX_ZONE_ROWS else KEY_INDEX_ZONE_ROWS
    )
    if os.path.exists(other):
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(other, path)
        ds = lance.dataset(path)
        if ds.count_rows() == n:  # the same rows (every bench apply is restored away)
            ds.create_scalar_index(KEY, config, replace=True)
            return time.perf_counter() - t0
        shutil.rmtree(path)
    chunk = 1_000_000

    def batches():
        for start in range(0, n, chunk):
            yield from narrow(min(chunk, n - start), start).to_batches()

    schema = narrow(1).schema
    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()),
        path,
        mode="overwrite",
        enable_stable_row_ids=True,
    )
    lance.dataset(path).create_scalar_index(KEY, config)
    return time.perf_counter() - t0


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def base_path(root: str, n: int, zone: int) -> str:
    return os.path.join(root, f"apply_base_{n}_z{zone}.lance")


def zone_of(method: str) -> int:
    return 4096 if method == "replica_prev" else KEY_INDEX_ZONE_ROWS


def batch(n: int, b: int, seed: int) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """(upserts, deleted keys, new-key flags of the upserts): 80% updates, 10% new keys,
    10% deletes."""
    rng = np.random.default_rng(seed)
    existing = rng.choice(n, size=int(b * 0.9), replace=False)
    upd, dele = existing[: int(b * 0.8)], existing[int(b * 0.8) :]
    new = np.arange(n, n + b - existing.size) + seed * b
    ids = np.concatenate([upd, new]).astype(np.int64)
    rows = narrow(len(ids)).set_column(0, KEY, pa.array(ids))
    rows = rows.set_column(2, "score", pa.array(np.full(len(ids), -1.0)))
    fresh = np.arange(len(ids)) >= upd.size
    return rows, pa.table({KEY: pa.array(dele.astype(np.int64))}), fresh


def commit_props(r: int, bare: bool) -> dict[str, str]:
    """What the replicator records in the commit of batch r (applier.py, `BatchApplier`):
    the offsets it read up to, whose replica it is, the source version it equals, and where
    the transaction topic and each partition stand after that version."""
    offsets = json.dumps({"bench": {str(p): 1000 * r + p for p in range(4)}})
    if bare:
        return {OFFSETS_PROPERTY: offsets}
    return {
        OFFSETS_PROPERTY: offsets,
        TOPIC_PROPERTY: "bench",
        SOURCE_TABLE_PROPERTY: json.dumps({"table": "bench", "uri": "/data/bench.lance"}),
        SOURCE_VERSION_PROPERTY: str(r + 2),
        TRANSACTION_OFFSET_PROPERTY: str(2 * r + 2),
        VERSION_OFFSETS_PROPERTY: json.dumps({"bench": {str(p): 1000 * r + p for p in range(4)}}),
        RECORDS_THROUGH_PROPERTY: str(r + 2),
    }


def merge_insert(
    path: str, rows: pa.Table, deletes: pa.Table, use_index: bool, props: dict[str, str]
) -> None:
    ds = lance.dataset(path)
    tx, _ = (
        ds.merge_insert(KEY).when_matched_delete().use_index(use_index).execute_uncommitted(deletes)
    )
    ds = lance.LanceDataset.commit(path, tx, read_version=ds.version)
    builder = ds.merge_insert(KEY).when_matched_update_all().when_not_matched_insert_all()
    tx, _ = builder.use_index(use_index).execute_uncommitted(rows)
    tx.transaction_properties = props
    lance.LanceDataset.commit(path, tx, read_version=ds.version)


def check(path: str, base: int, n: int, rows: pa.Table, deletes: pa.Table) -> None:
    """Rows added / deleted as expected, every upserted row holds its new value once."""
    ds = lance.dataset(path)
    new = int((rows[KEY].to_numpy() >= n).sum())
    expect = lance.dataset(path, version=base).count_rows() + new - deletes.num_rows
    assert ds.count_rows() == expect, (ds.count_rows(), expect)
    assert ds.count_rows(filter="score = -1") == rows.num_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--batches", type=int, nargs="+", default=[1_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["merge_insert", "replica_index", "replica"])
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--bare-props",
        action="store_true",
        help="record only the offsets in each commit (not the replicator's set)",
    )
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    results: dict = {"runs": []}
    for n in args.sizes:
        paths = {m: base_path(args.dir, n, zone_of(m)) for m in args.methods}
        zones = {p: zone_of(m) for m, p in paths.items()}  # one base per index page size
        built = {p: build(p, n, z) for p, z in zones.items()}
        bases = {p: lance.dataset(p).version for p in built}
        print(f"replica {n} rows ready ({sum(built.values()):.1f}s to build)", flush=True)
        for b in args.batches:
            times: dict[str, list[float]] = {m: [] for m in args.methods}
            # one per method, kept across applies: the key index stays in its cache
            replicas = {
                m: ReplicaTable(
                    paths[m],
                    [KEY],
                    keep_row_ids=m == "replica_keep",
                    prewarm=m != "replica_prev",
                    key_map=m == "replica",
                )
                for m in args.methods
            }
            base_maps = {}
            row = {
                "replica_rows": n,
                "batch_rows": b,
                "build_s": sum(built.values()),
                "props": "bare" if args.bare_props else "replicator",
            }
            for m, replica in replicas.items():  # the replicator preloads once, at start
                if m != "replica_prev":
                    ds = replica.lookup.with_key_index(replica.open(), replica.open)
                if m == "replica":  # the key map: built once per process
                    rss0 = rss_mb()
                    t0 = time.perf_counter()
                    km = replica.lookup.current_map(ds, ds.schema.field(KEY).type, None, None)
                    row["map_build_s"] = time.perf_counter() - t0
                    row["map_mb"] = km.nbytes / 2**20
                    row["map_rss_mb"] = rss_mb() - rss0
                    base_maps[m] = copy.deepcopy(km)
            for r in range(args.repeat):
                rows, deletes, fresh = batch(n, b, seed=r + 1)
                props = commit_props(r, args.bare_props)
                for m in args.methods:
                    replica, path = replicas[m], paths[m]
                    if m in base_maps:  # the table holds the base rows (restored)
                        replica.lookup.map = copy.deepcopy(base_maps[m])
                        replica.lookup.map.version = lance.dataset(path).version
                    t0 = time.perf_counter()
                    if m.startswith("replica"):
                        new = fresh if m in ("replica", "replica_index", "replica_keep") else None
                        replica.apply(rows, deletes, props, fresh=new)
                    else:
                        merge_insert(path, rows, deletes, m == "merge_index", props)
                    times[m].append(time.perf_counter() - t0)
                    if m in base_maps:
                        assert replica.map_builds == 1, "the key map was rebuilt in a timed apply"
                    check(path, bases[path], n, rows, deletes)
                    lance.dataset(path, version=bases[path]).restore()
            row.update({f"{m}_s": stats.median(t) for m, t in times.items()})
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
    write_result(args.out, results)


if __name__ == "__main__":
    sys.exit(main())
