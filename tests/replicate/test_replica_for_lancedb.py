"""Replicas opened with LanceDB 0.40 (which reads with the older Lance it embeds): no index
it cannot read, while the replicator's key lookups stay indexed (the in-memory key map for
integer keys; a BTREE index that pylance's scans use for other keys)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_cdf.replicate import key_lookup
from lance_cdf.replicate.replica import OFFSETS_PROPERTY, SOURCE_ROWID, ReplicaTable

pytest.importorskip("lancedb")
pytestmark = pytest.mark.unit

# Opens the replica through LanceDB's own API and queries it by key; stderr carries what
# LanceDB's Lance logs (its warnings are on by default).
OPEN_WITH_LANCEDB = """
import json, sys, lancedb
db = lancedb.connect(sys.argv[1])
t = db.open_table(sys.argv[2])
q = t.search().where(sys.argv[3])
print(json.dumps({"rows": q.to_arrow().to_pylist(), "indices": len(t.list_indices()),
                  "plan": q.explain_plan(verbose=True)}, default=str))
"""


def open_with_lancedb(root: str, name: str, where: str) -> tuple[dict, str]:
    env = {**os.environ, "RUST_LOG": "warn"}
    done = subprocess.run(
        [sys.executable, "-c", OPEN_WITH_LANCEDB, root, name, where],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout), done.stderr


def apply_rounds(rep: ReplicaTable, key: str, keys_of) -> dict:
    """Inserts, updates, deletes and a compaction through `rep`; returns the model."""
    rng = np.random.default_rng(5)
    model: dict = {}
    for step in range(8):
        live = np.array(sorted(model))
        gone = rng.choice(live, min(len(live), 20), replace=False) if len(live) else []
        for k in gone:
            del model[k]
        upserted = sorted(set(range(step * 200, step * 200 + 300)) - set(gone))
        for k in upserted:
            model[k] = step
        up = pa.table({key: keys_of(upserted), "v": pa.array([step] * len(upserted), pa.int64())})
        dl = pa.table({key: keys_of(sorted(gone))}) if len(gone) else None
        rep.apply(up, dl, {OFFSETS_PROPERTY: f'{{"t": {{"0": {step}}}}}'})
        rep.maintain(compact=step == 5)
    return model


def test_lancedb_opens_a_replica_keyed_by_source_row_ids_without_warnings(tmp_path):
    """The default replica (integer key `_source_rowid`): the key map answers every lookup,
    so the replica carries no index LanceDB would warn about and ignore."""
    uri = str(tmp_path / "items.lance")
    rep = ReplicaTable(uri, [SOURCE_ROWID])
    model = apply_rounds(rep, SOURCE_ROWID, lambda ks: pa.array(ks, pa.int64()))
    assert rep.lookup.map is not None and rep.lookup.map_builds >= 1  # the map served
    ds = lance.dataset(uri)
    assert {r[SOURCE_ROWID]: r["v"] for r in ds.to_table().to_pylist()} == model
    assert ds.describe_indices() == []
    probe = max(model)
    got, stderr = open_with_lancedb(str(tmp_path), "items", f"{SOURCE_ROWID} = {probe}")
    assert "not supported" not in stderr and "WARN" not in stderr, stderr
    assert [(r[SOURCE_ROWID], r["v"]) for r in got["rows"]] == [(probe, model[probe])]


def test_a_key_the_map_cannot_hold_is_looked_up_through_the_btree_index(tmp_path, monkeypatch):
    """String keys: the replicator builds a BTREE on the key and pylance's probes use it."""
    monkeypatch.setattr(key_lookup, "INDEX_PROBE_ROWS_PER_KEY", 0)  # probe every batch
    uri = str(tmp_path / "items.lance")
    rep = ReplicaTable(uri, ["k"])
    model = apply_rounds(rep, "k", lambda ks: pa.array([f"k{k}" for k in ks], pa.string()))
    assert rep.lookup.map is None and rep.lookup.indexed
    ds = lance.dataset(uri)
    assert {int(r["k"][1:]): r["v"] for r in ds.to_table().to_pylist()} == model
    (index,) = rep.lookup.key_index(ds)
    plan = ds.scanner(filter="k IN ('k1', 'k2')", columns=[], with_row_address=True)
    assert f"@{index['name']}" in plan.explain_plan(), plan.explain_plan()


def test_a_source_btree_on_a_replica_is_one_lancedb_uses(tmp_path):
    """A source's BTREE index built on a replica, then kept current as rows arrive (built
    again, not merged by pylance): LanceDB opens the replica without a warning and its
    filter plan uses the index."""
    from lance_cdf.format.definitions import IndexDefinition, TableDefinition
    from lance_cdf.replicate.index_keeper import IndexKeeper

    uri = str(tmp_path / "items.lance")
    rows = pa.table({"id": np.arange(2000), "v": np.arange(2000)})
    ds = lance.write_dataset(rows, uri, enable_stable_row_ids=True)
    keeper = IndexKeeper()
    keeper.want(
        TableDefinition.of([IndexDefinition.of("id_idx", "BTREE", ("id",), {})], {}, {}, {})
    )
    keeper.upkeep(ds, set(), compact=False, batch_rows=10)
    more = pa.table({"id": np.arange(2000, 2500), "v": np.arange(500)})
    ds = lance.write_dataset(more, uri, mode="append")
    done = keeper.upkeep(ds, set(), compact=False, batch_rows=10)
    assert done.get("indexes_optimized") == 1  # 500 rows outside: over max(1 %, a batch)
    got, stderr = open_with_lancedb(str(tmp_path), "items", "id = 2400")
    assert "not supported" not in stderr and "WARN" not in stderr, stderr
    assert [r["v"] for r in got["rows"]] == [400]
    assert "ScalarIndexQuery" in got["plan"] and "id_idx" in got["plan"], got["plan"]
