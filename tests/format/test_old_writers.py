"""Tables written by older pylance releases (committed fixtures, made once by
tests/support/fixtures/make_old_tables.py in throwaway virtualenvs), read with the project's
pylance and compared with a values-only oracle: a full scan of every version diffed by
`_rowid` on all user column values."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.core.candidates import UndecidableChangeError
from lance_cdf.core.columns import BLOB, FIELD_ID
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.core.plan import diff_manifests
from lance_cdf.errors import LanceCdfError
from lance_cdf.format._proto import table_pb2
from lance_cdf.format.manifest import Manifest
from tests.support.oracle import feed_events, snapshot_events, values_events

FIXTURES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "old_tables"
RELEASES = ["0.32.1", "0.36.0", "0.38.3"]


@pytest.fixture(params=RELEASES)
def old_table(request, tmp_path):
    """A private copy of the table written by one release (tests may commit on it)."""
    uri = tmp_path / f"pylance-{request.param}.lance"
    shutil.copytree(FIXTURES / f"pylance-{request.param}.lance", uri)
    return request.param, str(uri)


def _versions(uri):
    return [v["version"] for v in lance.dataset(uri).versions()]


def _feed(uri, version, **kw):
    return feed_events(lance_cdf.read_changes(uri, version, version, **kw).read_all(), version)


def test_fixtures_are_what_the_generator_says():
    """The committed tables come from the releases named, version sequences written
    by 0.38.3 and not by the older two (guards against regenerating with the wrong pylance)."""
    for release in RELEASES:
        feed = ChangeFeed(str(FIXTURES / f"pylance-{release}.lance"))
        manifest = feed.table.manifest(feed.table.latest_version)
        assert manifest.writer.endswith(release), manifest.writer
        with_versions = [f.has_version_sequence for f in manifest.fragments]
        assert all(with_versions) if release == "0.38.3" else not any(with_versions)


def test_every_version_matches_the_values_oracle(old_table):
    release, uri = old_table
    kinds = set()
    for version in _versions(uri):
        got, want = _feed(uri, version), values_events(uri, version)
        assert got == want if release != "0.38.3" else _without_equal_pairs(got) == want, (
            release,
            version,
        )
        kinds |= {e[0] for e in want}
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}


def test_the_issue_reproduction_reports_the_update():
    """pylance 0.36.0, `update s where id % 7 == 0` at version 2: one pair per such row."""
    uri = str(FIXTURES / "pylance-0.36.0.lance")
    events = _feed(uri, 2)
    posts = [e for e in events if e[0] == "update_postimage"]
    assert len(posts) == 9 and all(e[2]["id"] % 7 == 0 for e in posts)
    assert all(e[2]["s"].endswith("!") for e in posts)
    assert events == values_events(uri, 2)


def test_restore_on_an_old_table_reports_reverted_rows():
    uri = str(FIXTURES / "pylance-0.36.0.lance")
    feed = ChangeFeed(uri)
    restore = next(v for v in _versions(uri) if feed.table.manifest(v).operation == "Restore")
    events = _feed(uri, restore)
    # the restore goes back to before add_columns: rows whose only difference is column y
    # are no event; the rows the upsert at version 4 changed come back
    assert sum(e[0] == "update_postimage" for e in events) >= 3
    assert events == values_events(uri, restore)


def test_compaction_of_an_old_table_is_no_event():
    uri = str(FIXTURES / "pylance-0.36.0.lance")
    feed = ChangeFeed(uri)
    rewrite = [v for v in _versions(uri) if feed.table.manifest(v).operation == "Rewrite"]
    assert rewrite
    for v in rewrite:
        plan = feed.plan(v)
        assert plan.num_events == 0 and plan.num_candidates == 0


def test_projection_still_sees_updates_of_other_columns():
    """`columns=["id"]`: an update that touched only s or y is still an update pair."""
    uri = str(FIXTURES / "pylance-0.36.0.lance")
    for version in _versions(uri):
        got = _feed(uri, version, columns=["id"])
        assert got == values_events(uri, version, columns=["id"]), version


def test_carry_over_rows_are_kept_out_on_old_tables_only_when_equal():
    """The upsert at version 3 rewrote 4 rows with their own values: on a table without
    versions those are no event (values decide); 10 changed rows are pairs."""
    uri = str(FIXTURES / "pylance-0.36.0.lance")
    assert sum(e[0] == "update_postimage" for e in _feed(uri, 3)) == 10
    newer = str(FIXTURES / "pylance-0.38.3.lance")  # versions recorded: carry-overs are pairs
    assert sum(e[0] == "update_postimage" for e in _feed(newer, 3)) == 14
    assert _feed(newer, 3) == snapshot_events(newer, 3)


def test_pylance_14_commits_on_top_of_an_old_table(old_table):
    release, uri = old_table
    rng = np.random.default_rng(7)
    first_new = lance.dataset(uri).version + 1
    ds = lance.dataset(uri)
    ds.update({"x": "x + 1"}, where="id % 3 = 0")
    ids = lance.dataset(uri).to_table(columns=["id"])["id"].to_numpy()
    pick = rng.choice(ids, 6, replace=False)
    source = lance.dataset(uri).to_table(filter=f"id IN ({', '.join(map(str, pick))})")
    source = source.set_column(
        source.schema.get_field_index("s"), "s", pa.array([f"u{i}" for i in range(len(pick))])
    )
    lance.dataset(uri).merge_insert("id").when_matched_update_all().execute(source)
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=1000)
    lance.dataset(uri).delete("id % 4 = 1")
    lance.dataset(uri, version=first_new - 1).restore()  # back to the old writer's fragments
    lance.dataset(uri, version=first_new + 1).restore()
    for version in range(first_new, lance.dataset(uri).version + 1):
        got, want = _feed(uri, version), values_events(uri, version)
        assert _without_equal_pairs(got) == want, (release, version)


def test_spark_source_gives_the_same_events(spark):
    """Candidates that turn out unchanged must not upset the Spark source's row counts
    and partitions: the batch read equals the values oracle, version by version."""
    uri = str(FIXTURES / "pylance-0.36.0.lance")
    df = (
        spark.read.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 1)
        .option("rowsPerPartition", 40)
        .load()
    )
    table = pa.Table.from_pylist([r.asDict() for r in df.collect()])
    table = table.set_column(
        table.schema.get_field_index("_rowid"), "_rowid", table["_rowid"].cast(pa.uint64())
    )
    for version in _versions(uri):
        want = values_events(uri, version)
        cols = set(lance.dataset(uri, version=version).schema.names)
        cols |= set(lance.dataset(uri, version=version - 1).schema.names) if version > 1 else set()
        got = [
            (k, rid, {c: v for c, v in vals.items() if c in cols})
            for k, rid, vals in feed_events(table, version)
        ]
        assert got == want, version


def test_out_of_range_deletion_offsets_are_ignored(tmp_path, caplog):
    """pylance 0.25-0.30 could write deletion offsets past a fragment's rows; pylance
    ignores them. A hand-made deletion file with offsets 2, 25 and 40 on a 20-row
    fragment deletes only row 2, in the plan, the events and the snapshot row counts."""
    uri = str(tmp_path / "t.lance")
    table = pa.table({"id": np.arange(20), "s": [f"r{i}" for i in range(20)]})
    lance.write_dataset(table, uri, enable_stable_row_ids=True)
    feed = ChangeFeed(uri)
    old = feed.table.manifest(1)
    proto = table_pb2.Manifest()
    proto.CopyFrom(old.whole_proto())
    proto.version = 2
    proto.fragments[0].deletion_file.CopyFrom(
        table_pb2.DeletionFile(
            file_type=table_pb2.DeletionFile.ARROW_ARRAY,
            read_version=1,
            id=99,
            num_deleted_rows=3,
        )
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, pa.schema([("offsets", pa.int32())])) as writer:
        writer.write_table(pa.table({"offsets": pa.array([2, 25, 40], pa.int32())}))
    fid = proto.fragments[0].id
    (Path(uri) / "_deletions").mkdir(exist_ok=True)
    (Path(uri) / "_deletions" / f"{fid}-1-99.arrow").write_bytes(sink.getvalue().to_pybytes())
    new = Manifest(path="hand-made", proto=proto)
    with caplog.at_level(logging.DEBUG, logger="lance_cdf.format.table"):
        plan = diff_manifests(feed.table, old, new)
    assert plan.deleted.offsets.tolist() == [2] and len(plan.inserted) == 0
    assert "ignoring 2 deletion offset(s)" in caplog.text
    frag = new.fragments[0]
    assert feed.table.deletions(frag).live_offsets(20).size == 19
    assert feed.table.deletions(frag).logical_offsets(np.array([5])).tolist() == [4]


def test_undecidable_candidates_raise_naming_fragment_version_and_writer(tmp_path, monkeypatch):
    """A blob column is read as descriptors, so its values cannot be compared: a moved
    row without versions there is an error naming the fragment, version and writer."""
    uri = str(tmp_path / "t.lance")
    shutil.copytree(FIXTURES / "pylance-0.36.0.lance", uri)
    feed = ChangeFeed(uri)
    plan = __import__("lance_cdf.core.plan", fromlist=["plan_version"]).plan_version(feed.table, 2)
    assert plan.num_candidates > 0
    # a blob column as the tagged schemas carry it (lance_cdf.core.columns.annotate)
    meta = {FIELD_ID: b"9", BLOB: b"1"}
    blob = pa.schema([pa.field("b", pa.large_binary(), metadata=meta)])
    monkeypatch.setattr(feed.reader, "tagged", lambda version, origin: blob)
    with pytest.raises(UndecidableChangeError) as err:
        feed.plan(2)
    msg = str(err.value)
    assert "version 2" in msg and "lance 0.36.0" in msg and "fragment(s) [" in msg
    assert "rewrite it with a current pylance" in msg and isinstance(err.value, LanceCdfError)


def test_unreadable_data_file_names_the_file_and_writer(tmp_path):
    uri = tmp_path / "t.lance"
    shutil.copytree(FIXTURES / "pylance-0.36.0.lance", uri)
    feed = ChangeFeed(str(uri))
    frag = feed.table.manifest(1).fragments[0]
    path = uri / "data" / frag.data_files[0]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(LanceCdfError) as err:
        lance_cdf.read_changes(str(uri), 1, 1).read_all()
    msg = str(err.value)
    assert frag.data_files[0] in msg and "lance 0.36.0" in msg


def _without_equal_pairs(events):
    """`events` (sorted by row ID) less the update pairs whose two images are equal."""
    images = {}
    for kind, rid, values in events:
        if kind in ("update_preimage", "update_postimage"):
            images.setdefault(rid, {})[kind] = values
    same = {rid for rid, p in images.items() if p["update_preimage"] == p["update_postimage"]}
    return [e for e in events if not (e[0].startswith("update_") and e[1] in same)]
