"""read_changes against a brute-force snapshot diff on random operation sequences."""

import random

import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.format import open_filesystem
from tests.support.oracle import (
    apply_events,
    changed_values_without_version_bump,
    feed_events_renamed,
    feed_ids,
    lance_delta_ids,
    snapshot_events,
    table_state,
)
from tests.support.workload import Workload

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
    check_random_sequence(str(tmp_path / "t.lance"), case)


# The same, with the table written by pylance to the local S3-compatible server and read
# back through the object-store client (manifests, row-ID and deletion files) and pylance.
ON_S3 = [SMALL[0], dict(seed=200, rows=14000, rows_per_file=14000, steps=5, bulk=2)]


@pytest.mark.parametrize("case", ON_S3, ids=lambda c: f"seed{c['seed']}-{c['rows']}rows")
def test_random_sequences_on_object_storage_match_snapshot_oracle(s3_server, s3_uri, case):
    check_random_sequence(s3_uri, case, s3_server.storage_options())


def check_random_sequence(uri: str, case: dict, storage_options: dict | None = None):
    seed, so = case["seed"], storage_options
    w = Workload(
        uri, seed, rows=case["rows"], rows_per_file=case["rows_per_file"], storage_options=so
    )
    w.WEIGHTS = w.WEIGHTS[:-1] + [case["bulk"]]
    if case["bulk"]:
        w.step("delete_bulk")
    for _ in range(case["steps"]):
        w.step()
    latest = w.ds.version
    events = lance_cdf.read_changes(uri, 1, storage_options=so).read_all()
    assert set(events["_commit_version"].to_pylist()) <= set(range(1, latest + 1))
    for version, op in w.log:
        columns = w.open(version).schema.names
        expected = snapshot_events(uri, version, so)
        if events.schema.field("score").type == pa.float32():
            # the newest type wins over the whole range: older doubles come out as floats
            expected = [(k, r, as_float32(vals)) for k, r, vals in expected]
        got = feed_events_renamed(uri, events, version, latest, so)
        assert got == expected, f"seed {seed} version {version} ({op}), columns {columns}"
        if op in DELTA_DEFINED:
            assert feed_ids(events, version) == lance_delta_ids(uri, version, so), op
        if op not in ("add_column", "drop_column", "overwrite", "cast"):
            assert changed_values_without_version_bump(uri, version, so) == [], op
    # a snapshot at a random version plus the changes after it, replayed, is the table
    # at the end (columns by their names at the end: renames and casts included)
    start = random.Random(seed).randint(1, latest)
    replayed = lance_cdf.read_changes(uri, start, snapshot=True, storage_options=so).read_all()
    end_columns = w.open(latest).schema.names
    keep = end_columns + ["_rowid", "_change_type", "_commit_version", "_commit_timestamp"]
    replica = apply_events(replayed.select(keep))
    assert replica == table_state_of(uri, latest, so), f"seed {seed}: replay from {start}"
    if case["bulk"]:
        # the large cases must exercise roaring deletion files
        names = open_filesystem(uri, so).list_dir("_deletions")
        assert any(n.endswith(".bin") for n in names)


def table_state_of(uri: str, version: int, storage_options=None) -> dict[int, dict]:
    if storage_options is None:
        return table_state(uri, version)
    import lance

    ds = lance.dataset(uri, version=version, storage_options=storage_options)
    rows = ds.to_table(columns=ds.schema.names, with_row_id=True).to_pylist()
    return {r.pop("_rowid"): r for r in rows}


def as_float32(values: dict) -> dict:
    score = values.get("score")
    return values if score is None else {**values, "score": float(np.float32(score))}
