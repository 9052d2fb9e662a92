"""read_changes against a brute-force snapshot diff on random operation sequences."""

import os

import lance
import pytest
from oracle import (
    changed_values_without_version_bump,
    feed_events_as_of,
    feed_ids,
    lance_delta_ids,
    snapshot_events,
)
from workload import Workload

import lance_cdf

# Operations whose net changes Lance's own Dataset.delta() defines.
DELTA_DEFINED = {
    "append",
    "delete_sparse",
    "delete_dense",
    "delete_bulk",
    "update",
    "upsert",
    "upsert_delete_missing",
}

SMALL = [dict(seed=s, rows=300, rows_per_file=64, steps=20, bulk=0) for s in range(10)]
# big fragments and bulk deletes: roaring deletion files, RangeWithBitmap segments
LARGE = [dict(seed=100 + s, rows=14000, rows_per_file=14000, steps=10, bulk=2) for s in range(2)]


@pytest.mark.parametrize("case", SMALL + LARGE, ids=lambda c: f"seed{c['seed']}-{c['rows']}rows")
def test_random_sequences_match_snapshot_oracle(tmp_path, case):
    seed = case["seed"]
    w = Workload(
        str(tmp_path / "t.lance"), seed, rows=case["rows"], rows_per_file=case["rows_per_file"]
    )
    w.WEIGHTS = w.WEIGHTS[:-1] + [case["bulk"]]
    if case["bulk"]:
        w.step("delete_bulk")
    for _ in range(case["steps"]):
        w.step()
    latest = lance.dataset(w.uri).version
    events = lance_cdf.read_changes(w.uri, 1).read_all()
    assert set(events["_commit_version"].to_pylist()) <= set(range(1, latest + 1))
    for version, op in w.log:
        columns = lance.dataset(w.uri, version=version).schema.names
        expected = snapshot_events(w.uri, version)
        got = feed_events_as_of(w.uri, events, version)
        assert got == expected, f"seed {seed} version {version} ({op}), columns {columns}"
        if op in DELTA_DEFINED:
            assert feed_ids(events, version) == lance_delta_ids(w.uri, version), op
        if op not in ("add_column", "drop_column", "overwrite"):
            assert changed_values_without_version_bump(w.uri, version) == [], op
    if case["bulk"]:
        # the large cases must exercise roaring deletion files
        assert any(n.endswith(".bin") for n in os.listdir(os.path.join(w.uri, "_deletions")))
