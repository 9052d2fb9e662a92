"""One answer per operation: a column's presence alone is never a changed
value, its values are — a row is compared as the later version presents it (a column the
earlier version lacks reads as null; one the later version lacks is no change):
add_columns by writers without row versions, restores to before (or after)
add_columns — checked against the snapshot oracle (tests/support/oracle.py, the same rule) and
the values oracle for old writers."""

from __future__ import annotations

import shutil
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import lance_cdf
from tests.support.oracle import feed_events, feed_events_as_of, snapshot_events, values_events

FIXTURES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "old_tables"


def pairs(events: list[tuple]) -> list[int]:
    return [rid for kind, rid, _ in events if kind == "update_postimage"]


def at(uri: str, version: int) -> list[tuple]:
    return feed_events(lance_cdf.read_changes(uri, version, version).read_all(), version)


@pytest.mark.parametrize("release", ["0.32.1", "0.36.0", "0.38.3"])
def test_add_columns_by_an_old_writer_gives_an_update_where_the_new_column_has_a_value(
    release,
):
    """Each fixture's add_columns(y = id * 2) (version 5; 6 on 0.32.1), a writer without
    row versions: the rows are compared as the new version presents them (y null before),
    so a row is an update pair exactly where y holds a value — as pylance 14's
    add_columns, which stamps every row — and a consumer (a replica) gets y's values."""
    uri = str(FIXTURES / f"pylance-{release}.lance")
    versions = [v["version"] for v in lance.dataset(uri).versions()]
    added = next(v for v in versions if "y" in lance.dataset(uri, version=v).schema.names)
    assert added in (5, 6)
    got = at(uri, added)
    assert got == values_events(uri, added)
    rows = lance.dataset(uri, version=added).to_table(columns=["y"], with_row_id=True)
    valued = sorted(r["_rowid"] for r in rows.to_pylist() if r["y"] is not None)
    assert valued and sorted(pairs(got)) == valued
    assert {kind for kind, _, _ in got} == {"update_preimage", "update_postimage"}


def test_restores_across_add_columns(tmp_path):
    """pylance 14: add_columns stamps every row (Lance's answer: an update pair each). A
    restore to before it lacks y: only the rows an update changed are pairs (as
    drop_columns gives none); one back to after it brings y's values back: every row
    where y holds a value is a pair, as the add_columns was."""
    uri = str(tmp_path / "t.lance")
    table = pa.table({"id": list(range(12)), "s": [f"s{i}" for i in range(12)]})
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=5)
    lance.dataset(uri).add_columns({"y": "id * 2"})  # v2
    lance.dataset(uri).update({"s": "'new'"}, where="id IN (1, 7)")  # v3
    lance.dataset(uri).delete("id = 9")  # v4
    lance.dataset(uri, version=1).restore()  # v5: y gone, s and row 9 back
    lance.dataset(uri, version=3).restore()  # v6: y back, s new again, row 9 back
    lance.dataset(uri).drop_columns(["y"])  # v7
    expected_pairs = {2: list(range(12)), 3: [1, 7], 4: [], 5: [1, 7], 6: list(range(12)), 7: []}
    events = lance_cdf.read_changes(uri, 2).read_all()
    for version, want in expected_pairs.items():
        got = feed_events_as_of(uri, events, version)
        assert got == snapshot_events(uri, version), version
        assert sorted(pairs(got)) == want, version
    assert [(k, r) for k, r, _ in feed_events_as_of(uri, events, 5) if k != "update_preimage"] == [
        ("update_postimage", 1),
        ("update_postimage", 7),
        ("insert", 9),
    ]


def test_restore_to_before_add_columns_on_an_old_table(tmp_path):
    """A pylance 14 restore on the 0.36 fixture (no row versions) back to version 4 (before
    add_columns y): pairs only for rows whose id, s or x differ."""
    uri = str(tmp_path / "t.lance")
    shutil.copytree(FIXTURES / "pylance-0.36.0.lance", uri)
    lance.dataset(uri, version=4).restore()
    latest = lance.dataset(uri).version
    got = at(uri, latest)
    assert got == values_events(uri, latest)
    before = {
        r["_rowid"]: r
        for r in lance.dataset(uri, version=latest - 1)
        .to_table(columns=["id", "s", "x", "_rowid"])
        .to_pylist()
    }
    after = {
        r["_rowid"]: r
        for r in lance.dataset(uri, version=latest)
        .to_table(columns=["id", "s", "x", "_rowid"])
        .to_pylist()
    }
    differ = sorted(rid for rid in before.keys() & after.keys() if before[rid] != after[rid])
    assert differ and sorted(pairs(got)) == differ
