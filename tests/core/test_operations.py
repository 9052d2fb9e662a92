"""Each Lance operation gives the documented events; Lance's own delta() agrees
where it defines the answer, and the snapshot oracle wins where it does not."""

from datetime import timedelta

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lance_cdf
from lance_cdf.errors import (
    CorruptFileError,
    LanceCdfError,
    StableRowIdsRequiredError,
    TableNotFoundError,
    VersionNotFoundError,
)
from tests.support.oracle import feed_events, feed_events_as_of, feed_ids, snapshot_events
from tests.support.oracle import lance_delta_ids as delta_ids


def make(tmp_path, n=100, rows_per_file=40, name="t.lance"):
    uri = str(tmp_path / name)
    table = pa.table(
        {"id": np.arange(n), "v": np.arange(n) * 1.5, "s": [f"s{i}" for i in range(n)]}
    )
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=rows_per_file)
    return uri


def changes(uri, version, **kw):
    return lance_cdf.read_changes(uri, version, version, **kw).read_all()


def kinds(events):
    out = {}
    for k in events["_change_type"].to_pylist():
        out[k] = out.get(k, 0) + 1
    return out


def test_append_delete_update_match_oracle_and_lance_delta(tmp_path):
    uri = make(tmp_path)
    lance.write_dataset(
        pa.table({"id": [100, 101], "v": [0.0, 1.0], "s": ["a", "b"]}), uri, mode="append"
    )
    lance.dataset(uri).delete("id < 5")
    lance.dataset(uri).update({"s": "'x'"}, where="id >= 50 AND id < 53")
    for version in (1, 2, 3, 4):
        events = changes(uri, version)
        assert feed_events(events, version) == snapshot_events(uri, version)
        if version > 1:
            assert feed_ids(events) == delta_ids(uri, version)
    ev = changes(uri, 4)
    assert ev["_change_type"].to_pylist() == ["update_preimage", "update_postimage"] * 3
    assert ev["s"].to_pylist() == ["s50", "x", "s51", "x", "s52", "x"]
    assert changes(uri, 3)["id"].to_pylist() == [0, 1, 2, 3, 4]  # deletes carry their values


def test_merge_insert_upsert_and_delete_by_source(tmp_path):
    uri = make(tmp_path)
    src = pa.table({"id": [1, 2, 200], "v": [9.0, 9.0, 9.0], "s": ["m", "m", "new"]})
    lance.dataset(uri).merge_insert(
        "id"
    ).when_matched_update_all().when_not_matched_insert_all().execute(src)
    assert kinds(changes(uri, 2)) == {"update_preimage": 2, "update_postimage": 2, "insert": 1}
    src = pa.table({"id": [1, 2], "v": [1.0, 1.0], "s": ["z", "z"]})
    (
        lance.dataset(uri)
        .merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_by_source_delete("id >= 90")
        .execute(src)
    )
    ev = changes(uri, 3)
    assert kinds(ev) == {"update_preimage": 2, "update_postimage": 2, "delete": 11}
    for v in (2, 3):
        assert feed_events(changes(uri, v), v) == snapshot_events(uri, v)
        assert feed_ids(changes(uri, v)) == delta_ids(uri, v)


def test_compaction_index_and_config_give_no_events(tmp_path):
    uri = make(tmp_path, n=200, rows_per_file=20)
    lance.dataset(uri).delete("id % 4 = 0")
    before = lance.dataset(uri).version
    lance.dataset(uri).optimize.compact_files(
        target_rows_per_fragment=1000, materialize_deletions_threshold=0.0
    )
    lance.dataset(uri).create_scalar_index("id", "BTREE")
    lance.dataset(uri).update_config({"team": "data"})
    latest = lance.dataset(uri).version
    assert latest >= before + 3
    assert (
        lance.dataset(uri).get_fragments()[0].metadata.physical_rows == 150
    )  # deletions materialized
    assert lance_cdf.read_changes(uri, before + 1, latest).read_all().num_rows == 0


def test_overwrite_deletes_everything_and_inserts_new_rows(tmp_path):
    uri = make(tmp_path, n=10)
    lance.write_dataset(
        pa.table({"id": [7, 8], "v": [0.5, 0.5], "s": ["a", "b"]}), uri, mode="overwrite"
    )
    ev = changes(uri, 2)
    assert kinds(ev) == {"delete": 10, "insert": 2}
    assert feed_events(ev, 2) == snapshot_events(uri, 2)


def test_restore_is_the_diff_to_the_restored_state_which_lance_delta_misses(tmp_path):
    uri = make(tmp_path, n=10)
    lance.dataset(uri).delete("id < 3")  # v2
    lance.dataset(uri).update({"s": "'u'"}, where="id = 5")  # v3
    lance.write_dataset(pa.table({"id": [50], "v": [1.0], "s": ["n"]}), uri, mode="append")  # v4
    lance.dataset(uri, version=1).restore()  # v5 == v1 again
    ev = changes(uri, 5)
    assert feed_events(ev, 5) == snapshot_events(uri, 5)  # the oracle
    assert kinds(ev) == {"insert": 3, "update_preimage": 1, "update_postimage": 1, "delete": 1}
    assert ev.filter(pc.equal(ev["_change_type"], "update_postimage"))["s"].to_pylist() == ["s5"]
    # Lance's own delta() sees the delete but misses the rows that came back and
    # the reverted update (their versions go backwards): the oracle wins.
    assert feed_ids(ev) == ([0, 1, 2], [5], [10])
    assert delta_ids(uri, 5) == ([], [], [10])


def test_schema_evolution_across_a_range(tmp_path):
    uri = make(tmp_path, n=6, rows_per_file=3)
    lance.dataset(uri).add_columns({"double": "id * 2"})  # v2: every row's version advances
    lance.dataset(uri).update({"double": "0"}, where="id = 1")  # v3
    lance.dataset(uri).drop_columns(["s"])  # v4: schema only
    lance.dataset(uri).delete("id = 2")  # v5
    ev = lance_cdf.read_changes(uri, 1).read_all()
    # union of all versions' columns: the newest first, dropped ones after
    assert ev.schema.names[:4] == ["id", "v", "double", "s"]
    assert kinds(changes(uri, 2)) == {"update_preimage": 6, "update_postimage": 6}
    v2 = changes(uri, 2)
    assert v2["double"].to_pylist()[:2] == [None, 0]  # absent before add_columns -> null
    assert changes(uri, 4).num_rows == 0
    deleted = ev.filter(pc.equal(ev["_commit_version"], 5))
    assert deleted["id"].to_pylist() == [2] and deleted["s"].to_pylist() == [None]
    assert changes(uri, 5).schema.names[:3] == ["id", "v", "double"]  # s gone before 4..5
    for v in range(1, 6):
        assert feed_events_as_of(uri, ev, v) == snapshot_events(uri, v)


def test_alter_column_type_is_cast_across_the_range(tmp_path):
    import lance as _l

    uri = make(tmp_path, n=4)
    lance.dataset(uri).update({"v": "2.0"}, where="id = 0")
    lance.dataset(uri).alter_columns({"path": "id", "data_type": pa.int32()})
    ev = lance_cdf.read_changes(uri, 1).read_all()
    assert ev.schema.field("id").type == pa.int32()
    assert ev["id"].to_pylist()[:4] == [0, 1, 2, 3]
    assert _l.dataset(uri).schema.field("id").type == pa.int32()


def test_columns_option_and_event_schema(tmp_path):
    uri = make(tmp_path, n=5)
    ev = lance_cdf.read_changes(uri, 1, columns=["s"]).read_all()
    assert ev.schema.names == [
        "s",
        "_rowid",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    ]
    assert ev.schema.field("_rowid").type == pa.uint64()
    assert ev.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    with pytest.raises(LanceCdfError, match="unknown column"):
        lance_cdf.read_changes(uri, 1, columns=["nope"])


def test_batch_size_bounds_batches_and_keeps_update_pairs_together(tmp_path):
    uri = make(tmp_path, n=100)
    lance.dataset(uri).update({"s": "'x'"})
    reader = lance_cdf.read_changes(uri, 2, 2, batch_size=10)
    batches = list(reader)
    assert sum(b.num_rows for b in batches) == 200
    assert all(b.num_rows <= 10 for b in batches)
    for b in batches:
        types = b.column("_change_type").to_pylist()
        assert types[0::2] == ["update_preimage"] * (len(types) // 2)


def test_file_uri_is_accepted(tmp_path):
    uri = make(tmp_path, n=3)
    assert lance_cdf.read_changes("file://" + uri, 1).read_all().num_rows == 3


def test_clear_errors(tmp_path):
    plain = str(tmp_path / "plain.lance")
    lance.write_dataset(pa.table({"id": [1]}), plain)
    with pytest.raises(StableRowIdsRequiredError, match="cannot be turned on"):
        lance_cdf.read_changes(plain, 1)
    with pytest.raises(StableRowIdsRequiredError, match="cannot be turned on"):
        lance_cdf.read_changes(plain, snapshot=True)
    with pytest.raises(StableRowIdsRequiredError, match="cannot be turned on"):
        lance_cdf.ChangeFeed(plain)
    uri = make(tmp_path, n=3)
    with pytest.raises(VersionNotFoundError, match="latest version is 1"):
        lance_cdf.read_changes(uri, 5)
    with pytest.raises(TableNotFoundError, match="no Lance table"):
        lance_cdf.read_changes(str(tmp_path / "missing.lance"), 1)
    with pytest.raises(LanceCdfError, match="after end_version"):
        lance_cdf.read_changes(uri, 1, 0)
    for i in range(3):
        lance.dataset(uri).delete(f"id = {i}")
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=2)
    with pytest.raises(VersionNotFoundError, match="first version whose changes can be read is 4"):
        lance_cdf.read_changes(uri, 2)
    assert changes(uri, 4)["id"].to_pylist() == [2]  # 3 is still there to diff against


def test_corrupt_deletion_file_is_named(tmp_path):
    import os

    uri = make(tmp_path, n=10)
    lance.dataset(uri).delete("id = 3")
    (name,) = os.listdir(os.path.join(uri, "_deletions"))
    with open(os.path.join(uri, "_deletions", name), "r+b") as f:
        f.truncate(10)
    with pytest.raises(CorruptFileError, match=name):
        changes(uri, 2)


def test_a_range_reads_only_its_own_manifests(tmp_path, monkeypatch):
    """read_changes(a, b) parses the manifests of versions a-1..b and no other (the latest
    one's size follows the table's history, not the range), and the transaction of the
    base version a-1 is never parsed (a large commit's is megabytes)."""
    import lance_cdf.format.manifest as manifest
    import lance_cdf.format.table as table

    uri = make(tmp_path)
    ds = lance.dataset(uri)
    ds.update({"v": "v + 1"}, where="id % 3 = 0")
    lance.dataset(uri).delete("id % 5 = 0")
    lance.dataset(uri).insert(pa.table({"id": [1000], "v": [1.0], "s": ["x"]}))
    assert lance.dataset(uri).version == 4
    manifests, transactions = [], []
    parse_manifest, parse_transaction = table.parse_manifest, manifest.parse_transaction

    def spied_manifest(data, path="<manifest>", transaction=True):
        m = parse_manifest(data, path, transaction)
        manifests.append(m.version)
        return m

    def spied_transaction(data, path):
        transactions.append(path)
        return parse_transaction(data, path)

    monkeypatch.setattr(table, "parse_manifest", spied_manifest)
    monkeypatch.setattr(manifest, "parse_transaction", spied_transaction)
    got = changes(uri, 2)
    assert sorted(manifests) == [1, 2]
    assert len(transactions) == 1  # version 2's: its operation names the commit
    assert feed_events(got, 2) == snapshot_events(uri, 2)
    manifests.clear()
    transactions.clear()
    got = lance_cdf.read_changes(uri, 2, 3).read_all()
    assert sorted(manifests) == [1, 2, 3] and len(transactions) == 2  # each read once
    assert feed_events(got, 3) == snapshot_events(uri, 3)
    # a base version asked for again as a commit of a range gets its operation
    log = lance_cdf.format.TableLog(uri)
    assert log.manifest(3, operation=False, base=True).transaction_skipped
    assert not log.manifest(2, operation=False).transaction_skipped
    assert log.manifest(3).operation == "Delete" and log.manifest(2).operation == "Update"
    feed = lance_cdf.ChangeFeed(uri)
    assert [feed.plan(v).operation for v in (4, 3, 2)] == ["Append", "Delete", "Update"]
