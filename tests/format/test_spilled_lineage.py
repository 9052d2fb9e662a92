"""Spilled row lineage (pylance 14's `lance.row_lineage.spill`, reader flag 2048): row-ID
and version sequences that move out of the manifest into hidden columns of data files.
Checked against the snapshot oracle and Lance's own `delta()`, on tables where
most fragments spill and on tables that mix spilled and inline sequences."""

from __future__ import annotations

import random
from dataclasses import dataclass

import lance
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.errors import StableRowIdsRequiredError, UnsupportedTableFeatureError
from lance_cdf.format.manifest import FLAG_SPILLED_ROW_LINEAGE
from lance_cdf.format.table import TableLog
from tests.support.oracle import feed_events, lance_delta_ids, snapshot_events
from tests.support.workload import Workload

SPILL = {"lance.row_lineage.spill": "true", "lance.row_lineage.inline_max_bytes": "16"}
DATA_OPS = [
    "append",
    "delete_sparse",
    "delete_dense",
    "update",
    "upsert",
    "upsert_delete_missing",
    "compact",
]


def spilled_fragments(uri: str) -> int:
    """Fragments of the latest version with a spilled (column) row-ID sequence."""
    table = TableLog(uri)
    manifest = table.manifest(table.latest_version, operation=False)
    return sum(
        f.proto.WhichOneof("row_id_sequence") == "column_row_ids" for f in manifest.fragments
    )


@pytest.mark.parametrize("seed,spill_at", [(0, 1), (1, 1), (2, 6), (3, 10)])
def test_spilled_sequences_match_the_snapshot_oracle(tmp_path, seed, spill_at):
    """Spilling turned on at the first step, or after some commits (mixed tables: early
    fragments inline, rewritten rows spilled)."""
    uri = str(tmp_path / "t.lance")
    w = Workload(uri, 700 + seed, rows=400, rows_per_file=100)
    rng = random.Random(seed)
    for step in range(16):
        if step == spill_at:
            w.ds.update_config(SPILL)
            w.log.append((w.ds.version, "config"))
        w.step(rng.choice(DATA_OPS))
    latest = w.ds.version
    assert lance.dataset(uri).latest_version == latest
    flags = TableLog(uri).manifest(latest, operation=False).reader_feature_flags
    assert flags & FLAG_SPILLED_ROW_LINEAGE and spilled_fragments(uri) > 0, "nothing spilled"
    events = lance_cdf.read_changes(uri, 1).read_all()
    for version, op in w.log:
        expected = snapshot_events(uri, version)
        assert feed_events(events, version) == expected, f"seed {seed} version {version} ({op})"
        if op in DATA_OPS and op != "compact":
            assert lance_delta_ids(uri, version) == (
                sorted(events.filter(_at(events, version, "insert"))["_rowid"].to_pylist()),
                sorted(
                    events.filter(_at(events, version, "update_postimage"))["_rowid"].to_pylist()
                ),
                sorted(events.filter(_at(events, version, "delete"))["_rowid"].to_pylist()),
            ), op


def _at(events: pa.Table, version: int, kind: str) -> pa.Array:
    pc = pa.compute
    return pc.and_(
        pc.equal(events["_commit_version"], version), pc.equal(events["_change_type"], kind)
    )


def test_one_version_of_a_spilled_table_in_a_fresh_call(tmp_path):
    """A 1-row scattered update after spilling: planning reads the spilled columns of the
    fragments it compares (fresh process caches aside: a fresh feed)."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": list(range(2000)), "s": [str(i) for i in range(2000)]}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=500,
    )
    lance.dataset(uri).update_config(SPILL)
    lance.dataset(uri).update({"s": "'x'"}, where="id % 9 = 4")
    lance.dataset(uri).update({"s": "'y'"}, where="id = 13")
    v = lance.dataset(uri).version
    assert spilled_fragments(uri) > 0
    got = lance_cdf.read_changes(uri, v, v).read_all().to_pylist()
    assert [(e["_change_type"], e["id"], e["s"]) for e in got] == [
        ("update_preimage", 13, "x"),
        ("update_postimage", 13, "y"),
    ]


@dataclass
class _Manifest:
    version: int
    reader_feature_flags: int
    stable_row_ids: bool = True
    writer: str = "lance 99.0.0"


def test_unknown_reader_features_are_refused_by_name(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1]}), uri, enable_stable_row_ids=True)
    table = TableLog(uri)
    table.require_stable_row_ids(_Manifest(3, 2 | FLAG_SPILLED_ROW_LINEAGE))  # known: fine
    with pytest.raises(UnsupportedTableFeatureError, match=r"64 \(data overlay files\), 4096"):
        table.require_stable_row_ids(_Manifest(3, 2 | 64 | 4096))


def test_no_stable_row_ids_names_the_pylance_and_the_lancedb_way(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1]}), uri)
    with pytest.raises(StableRowIdsRequiredError) as refused:
        lance_cdf.read_changes(uri, 1).read_all()
    text = str(refused.value)
    assert "enable_stable_row_ids=True" in text
    assert "new_table_enable_stable_row_ids" in text and "child namespace" in text
