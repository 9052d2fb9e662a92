"""Feed modes of read_changes -- snapshot bootstrap, net changes, carry-over
filtering -- against brute-force oracles built from full table snapshots."""

from datetime import timedelta

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.core.modes import net_changes, values_equal
from lance_cdf.errors import LanceCdfError, VersionNotFoundError
from tests.support.oracle import (
    apply_events,
    feed_events_with_version,
    net_snapshot_events,
    snapshot_events,
    table_state,
    without_unchanged_pairs,
)
from tests.support.workload import Workload


class CarryOverWorkload(Workload):
    """Workload plus commits that rewrite rows without changing their values
    (merge_insert of rows as they are, an update setting a column to itself),
    mixed with real changes; no schema changes (the oracles compare values)."""

    def upsert_same(self):
        ds = self.ds
        table = ds.to_table()
        if table.num_rows == 0:
            return self.append()
        pick = sorted(self.rng.sample(range(table.num_rows), min(table.num_rows, 25)))
        rows = table.take(pick)
        if self.rng.random() < 0.5:  # some rows really change
            score = rows["score"].to_numpy().copy()
            score[:: self.rng.randint(2, 5)] += 1.0
            rows = rows.set_column(rows.schema.get_field_index("score"), "score", pa.array(score))
        ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(rows)

    def update_same(self):
        self.ds.update({"name": "name"}, where=f"id % {self.rng.randint(2, 9)} = 0")

    OPS = Workload.OPS + ["upsert_same", "update_same"]
    #   append del_s del_d upd ups ups_del cmp idx cfg add drop ovw rst ren cast bulk same same
    WEIGHTS = [4, 3, 2, 3, 2, 2, 1, 0, 1, 0, 0, 1, 2, 0, 0, 0, 4, 2]


def run(tmp_path, seed, steps, cls=CarryOverWorkload):
    w = cls(str(tmp_path / "t.lance"), seed, rows=200, rows_per_file=48)
    w.WEIGHTS = list(cls.WEIGHTS) + [0] * (len(w.OPS) - len(cls.WEIGHTS))
    for _ in range(steps):
        w.step()
    return w


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_net_changes_match_snapshot_oracle(tmp_path, seed):
    w = run(tmp_path, seed, steps=14)
    latest = lance.dataset(w.uri).version
    rng = np.random.default_rng(seed)
    ranges = [(1, latest), (2, latest)] + [
        tuple(sorted(rng.integers(1, latest + 1, size=2))) for _ in range(4)
    ]
    for start, end in ranges:
        got = lance_cdf.read_changes(w.uri, int(start), int(end), net=True).read_all()
        expected = net_snapshot_events(w.uri, int(start), int(end))
        assert feed_events_with_version(got) == expected, f"seed {seed} net {start}..{end}"
        kinds = got["_change_type"].to_pylist()
        assert len(set(got["_rowid"].to_pylist())) == len(kinds) - kinds.count("update_postimage")
        # applying the net changes to the table at start-1 gives the table at end
        base = table_state(w.uri, int(start) - 1)
        assert apply_events(got, base) == table_state(w.uri, int(end))
        both = lance_cdf.read_changes(
            w.uri, int(start), int(end), net=True, drop_unchanged_updates=True
        ).read_all()
        assert feed_events_with_version(both) == without_unchanged_pairs(expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_drop_unchanged_updates_match_snapshot_oracle(tmp_path, seed):
    w = run(tmp_path, 50 + seed, steps=14)
    got = lance_cdf.read_changes(w.uri, 1, drop_unchanged_updates=True).read_all()
    dropped_some = False
    for version, op in w.log:
        want = snapshot_events(w.uri, version)
        kept = [e for e in without_unchanged_pairs(_with_pre_first(want))]
        dropped_some |= len(kept) < len(want)
        mine = got.filter(pa.compute.equal(got["_commit_version"], version))
        assert _plain(feed_events_with_version(mine)) == kept, f"seed {seed} v{version} ({op})"
    assert dropped_some  # the workload really produced carry-over updates


def _with_pre_first(events):
    rank = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}
    return sorted(events, key=lambda e: (e[1], rank[e[0]]))


def _plain(events):
    return [(kind, rid, values) for kind, rid, _, values in events]


@pytest.mark.parametrize("seed", range(4))
def test_snapshot_then_changes_rebuild_the_table(tmp_path, seed):
    w = run(tmp_path, 100 + seed, steps=12)
    latest = lance.dataset(w.uri).version
    v0 = max(1, latest // 2)
    got = lance_cdf.read_changes(w.uri, v0, snapshot=True).read_all()
    kinds = got["_change_type"].to_pylist()
    n_snap = kinds.count("snapshot")
    assert kinds[:n_snap] == ["snapshot"] * n_snap and "snapshot" not in kinds[n_snap:]
    snap, rest = got.slice(0, n_snap), got.slice(n_snap)
    # the snapshot is exactly the table at v0, stamped with v0
    assert apply_events(snap) == table_state(w.uri, v0)
    assert set(snap["_commit_version"].to_pylist()) <= {v0}
    ts = lance_cdf.ChangeFeed(w.uri).table.manifest(v0).timestamp_us
    assert {t.timestamp() * 1e6 for t in snap["_commit_timestamp"].to_pylist()} <= {ts}
    # then exactly the changes after it: no gap, no overlap
    after = lance_cdf.read_changes(w.uri, v0 + 1).read_all() if v0 < latest else rest
    assert rest.equals(after)
    assert apply_events(got) == table_state(w.uri, latest)
    # net over snapshot + changes: the table at the end, one event per row
    net = lance_cdf.read_changes(w.uri, v0, snapshot=True, net=True).read_all()
    assert apply_events(net) == table_state(w.uri, latest)
    assert net.num_rows == len(table_state(w.uri, latest))


def test_snapshot_after_cleanup_of_the_first_versions(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(50), "s": [f"s{i}" for i in range(50)]}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=16,
    )
    for i in range(4):
        lance.dataset(uri).delete(f"id = {i}")  # v2..v5
    lance.dataset(uri).update({"s": "'u'"}, where="id > 40")  # v6
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=3)  # 4..6
    with pytest.raises(VersionNotFoundError):
        lance_cdf.read_changes(uri, 1)
    got = lance_cdf.read_changes(uri, 4, snapshot=True).read_all()
    assert apply_events(got) == table_state(uri, 6)
    latest_only = lance_cdf.read_changes(uri, snapshot=True).read_all()  # snapshot at latest
    assert set(latest_only["_change_type"].to_pylist()) == {"snapshot"}
    assert apply_events(latest_only) == table_state(uri, 6)
    with pytest.raises(VersionNotFoundError, match="version 2 .* is gone"):
        lance_cdf.read_changes(uri, 2, snapshot=True)
    with pytest.raises(LanceCdfError, match="start_version is required"):
        lance_cdf.read_changes(uri)
    with pytest.raises(LanceCdfError, match="before the snapshot version 5"):
        lance_cdf.read_changes(uri, 5, 4, snapshot=True)


def test_net_rules_on_a_hand_made_sequence(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": [0, 1, 2, 3], "s": ["a", "b", "c", "d"]}), uri, enable_stable_row_ids=True
    )  # v1: rowids 0..3
    ds = lance.dataset(uri)
    ds.update({"s": "'b2'"}, where="id = 1")  # v2
    ds = lance.dataset(uri)
    ds.update({"s": "'b3'"}, where="id = 1")  # v3
    lance.write_dataset(pa.table({"id": [4, 5], "s": ["e", "f"]}), uri, mode="append")  # v4
    lance.dataset(uri).update({"s": "'e2'"}, where="id = 4")  # v5
    lance.dataset(uri).delete("id = 5 OR id = 2")  # v6
    net = lance_cdf.read_changes(uri, 2, net=True).read_all().to_pylist()
    got = [(r["_change_type"], r["id"], r["s"], r["_commit_version"]) for r in net]
    assert got == [
        ("update_preimage", 1, "b", 3),  # updated twice: first preimage, last postimage
        ("update_postimage", 1, "b3", 3),
        ("insert", 4, "e2", 5),  # inserted, then updated: one insert, final values
        ("delete", 2, "c", 6),  # deleted: the values before the range
    ]  # id 5: inserted then deleted -> nothing


def _same(x, y):
    """Python-level equality with NaN equal to NaN, nested."""
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(i, j) for i, j in zip(x, y, strict=True))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    return x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)


def test_values_equal_on_nested_types_nulls_and_nan():
    def check(a, b):
        a, b = pa.array(a[0], a[1]), pa.array(b[0], b[1])
        want = [_same(x, y) for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)]
        assert values_equal(a, b).tolist() == want, a.type

    nan = float("nan")
    check(([1.0, nan, None, 2.0, None], pa.float64()), ([1.0, nan, None, 3.0, 1.0], pa.float64()))
    vec = pa.list_(pa.float32(), 2)
    check(([[1, 2], [1, 2], None, [1, nan]], vec), ([[1, 2], [1, 3], None, [1, nan]], vec))
    check(
        ([[1], [1, 2], [], None, [None]], pa.list_(pa.int64())),
        ([[1], [1], [], [], [None]], pa.list_(pa.int64())),
    )
    st = pa.struct([("a", pa.int64()), ("b", pa.string())])
    check(
        ([{"a": 1, "b": "x"}, {"a": 1, "b": None}, None], st),
        ([{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, None], st),
    )
    mp = pa.map_(pa.string(), pa.int64())
    assert values_equal(
        pa.array([[("a", 1)], [("a", 1)], None], mp), pa.array([[("a", 1)], [("a", 2)], None], mp)
    ).tolist() == [True, False, True]
    check(([b"x", b"y"], pa.binary()), ([b"x", b"z"], pa.binary()))
    sliced = pa.array([[9], [1], [2]], pa.list_(pa.int64())).slice(1)
    assert values_equal(sliced, pa.array([[1], [3]], pa.list_(pa.int64()))).tolist() == [
        True,
        False,
    ]


def test_net_changes_of_an_empty_range_and_no_events(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).create_scalar_index("id", "BTREE")  # v2: no row changes
    assert lance_cdf.read_changes(uri, 2, net=True).read_all().num_rows == 0
    empty = lance_cdf.read_changes(uri, 2).read_all()
    assert net_changes(empty).num_rows == 0
