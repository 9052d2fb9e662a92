"""Columns across a range: renames by field id, the newest type, blob columns,
columns=[], metadata-name clashes, cleanup advice and inline transactions."""

import os
import shutil
from datetime import timedelta

import lance
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.errors import LanceCdfError, VersionNotFoundError
from tests.support.oracle import apply_events, table_state

META = ["_rowid", "_change_type", "_commit_version", "_commit_timestamp"]


def user_rows(events: pa.Table) -> list[dict]:
    return events.drop_columns(META).to_pylist()


def test_rename_is_one_column_under_its_newest_name(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2], "s": ["a", "b"]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).alter_columns({"path": "s", "name": "t"})  # v2
    lance.dataset(uri).update({"t": "'B'"}, where="id = 2")  # v3
    net = lance_cdf.read_changes(uri, 1, snapshot=True, net=True).read_all()
    assert net.schema.names[:2] == ["id", "t"]
    assert sorted(user_rows(net), key=lambda r: r["id"]) == [
        {"id": 1, "t": "a"},
        {"id": 2, "t": "B"},
    ]
    # snapshot + changes replayed give the table at the end
    events = lance_cdf.read_changes(uri, 1, snapshot=True).read_all()
    assert apply_events(events) == table_state(uri, 3)
    plain = lance_cdf.read_changes(uri, 1).read_all()
    assert user_rows(plain) == [
        {"id": 1, "t": "a"},
        {"id": 2, "t": "b"},
        {"id": 2, "t": "b"},
        {"id": 2, "t": "B"},
    ]


def test_nested_rename_keeps_older_values(tmp_path):
    uri = str(tmp_path / "t.lance")
    st = pa.array([{"a": 1, "b": 10}, {"a": 2, "b": 20}])
    lance.write_dataset(pa.table({"id": [1, 2], "st": st}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).alter_columns({"path": "st.b", "name": "bb"})  # v2
    lance.dataset(uri).delete("id = 1")  # v3
    events = lance_cdf.read_changes(uri, 1).read_all()
    assert events.schema.field("st").type == pa.struct([("a", pa.int64()), ("bb", pa.int64())])
    assert [r["st"] for r in events.to_pylist()] == [
        {"a": 1, "bb": 10},
        {"a": 2, "bb": 20},
        {"a": 1, "bb": 10},
    ]
    # a range after the rename only: the same names
    assert lance_cdf.read_changes(uri, 3).read_all()["st"].to_pylist() == [{"a": 1, "bb": 10}]


def test_swapped_names_follow_field_ids(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": [1], "x": ["x1"], "y": ["y1"]}), uri, enable_stable_row_ids=True
    )
    ds = lance.dataset(uri)
    ds.alter_columns({"path": "x", "name": "tmp"})
    lance.dataset(uri).alter_columns({"path": "y", "name": "x"})
    lance.dataset(uri).alter_columns({"path": "tmp", "name": "y"})
    lance.dataset(uri).update({"x": "'y2'"})
    events = lance_cdf.read_changes(uri, 1).read_all()
    # the column first called y is x now; its insert value was y1
    assert [(r["x"], r["y"]) for r in events.to_pylist()] == [
        ("y1", "x1"),
        ("y1", "x1"),
        ("y2", "x1"),
    ]
    assert apply_events(events) == table_state(uri, lance.dataset(uri).version)


def test_newest_type_wins_after_restore(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": [1, 2], "score": [47.397, 1.25]}), uri, enable_stable_row_ids=True
    )
    lance.dataset(uri).alter_columns({"path": "score", "data_type": pa.float32()})  # v2
    lance.dataset(uri, version=1).restore()  # v3: double again
    lance.dataset(uri).update({"score": "score + 1"})  # v4
    events = lance_cdf.read_changes(uri, 1, 4).read_all()
    assert events.schema.field("score").type == pa.float64()
    assert events.filter(pa.compute.equal(events["_commit_version"], 1))["score"].to_pylist() == [
        47.397,
        1.25,
    ]
    assert apply_events(events) == table_state(uri, 4)
    # the cast at v2 changed 47.397 -> 47.39699935913086: a real change, kept
    kept = lance_cdf.read_changes(uri, 1, 3, drop_unchanged_updates=True).read_all()
    at2 = kept.filter(pa.compute.equal(kept["_commit_version"], 2))
    assert at2["score"].to_pylist()[:2] == [47.397, float(pa.scalar(47.397, pa.float32()).as_py())]


BLOB = {"lance-encoding:blob": "true"}


@pytest.mark.parametrize("storage", ["2.1", "2.2"])
def test_blob_columns_carry_bytes(tmp_path, storage):
    uri = str(tmp_path / "b.lance")
    schema = pa.schema(
        [pa.field("id", pa.int64()), pa.field("img", pa.large_binary(), metadata=BLOB)]
    )
    data = pa.table({"id": [1, 2, 3], "img": [b"one", None, b"three"]}, schema=schema)
    lance.write_dataset(data, uri, enable_stable_row_ids=True, data_storage_version=storage)
    new = pa.table({"id": [1], "img": [b"uno"]}, schema=schema)
    lance.dataset(uri).merge_insert("id").when_matched_update_all().execute(new)  # v2
    lance.dataset(uri).delete("id = 3")  # v3
    events = lance_cdf.read_changes(uri, 1).read_all()
    assert events.schema.field("img").type == pa.large_binary()
    got = [(r["_change_type"], r["id"], r["img"]) for r in events.to_pylist()]
    assert got == [
        ("insert", 1, b"one"),
        ("insert", 2, None),
        ("insert", 3, b"three"),
        ("update_preimage", 1, b"one"),
        ("update_postimage", 1, b"uno"),
        ("delete", 3, b"three"),
    ]
    kept = lance_cdf.read_changes(uri, 2, 2, drop_unchanged_updates=True).read_all()
    assert kept["img"].to_pylist() == [b"one", b"uno"]
    snap = lance_cdf.read_changes(uri, 3, snapshot=True).read_all()
    assert sorted((r["id"], r["img"]) for r in snap.to_pylist()) == [(1, b"uno"), (2, None)]
    replica = apply_events(lance_cdf.read_changes(uri, 1, snapshot=True).read_all())
    expected = lance.dataset(uri).take_blobs("img", ids=sorted(replica))
    assert [replica[r]["img"] for r in sorted(replica)] == [
        f.readall() if f is not None else None for f in expected
    ]


def test_no_columns_gives_metadata_only_events(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).update({"id": "id + 10"}, where="id = 2")
    full = lance_cdf.read_changes(uri, 1).read_all()
    for kwargs in ({}, {"snapshot": True}, {"net": True}):
        start = 1
        got = lance_cdf.read_changes(uri, start, columns=[], **kwargs).read_all()
        assert got.schema.names == META
        with_cols = lance_cdf.read_changes(uri, start, **kwargs).read_all()
        assert got.to_pylist() == with_cols.select(META).to_pylist()
    assert full.num_rows == 4


def test_user_column_with_a_metadata_name_is_refused(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": [1], "_commit_version": [7]}), uri, enable_stable_row_ids=True
    )
    with pytest.raises(LanceCdfError, match=r"_commit_version.*columns=\["):
        lance_cdf.read_changes(uri, 1)
    with pytest.raises(LanceCdfError, match="_commit_version"):
        lance_cdf.read_changes(uri, 1, snapshot=True)
    got = lance_cdf.read_changes(uri, 1, columns=["id"]).read_all()
    assert got.schema.names == ["id"] + META and got["_commit_version"].to_pylist() == [1]


def test_cleanup_advice_names_the_first_readable_version(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": list(range(5))}), uri, enable_stable_row_ids=True)
    for i in range(4):  # v2..v5
        lance.dataset(uri).delete(f"id = {i}")
    lance.dataset(uri).tags.create("keep", 2)
    lance.dataset(uri).cleanup_old_versions(
        older_than=timedelta(0), retain_versions=2, error_if_tagged_old_versions=False
    )
    assert [v["version"] for v in lance.dataset(uri).versions()] == [2, 4, 5]
    for start in (2, 3):
        with pytest.raises(VersionNotFoundError, match="changes can be read is 5"):
            lance_cdf.read_changes(uri, start)
    assert lance_cdf.read_changes(uri, 5).read_all()["id"].to_pylist() == [3]


def test_shallow_clone_base_is_named(tmp_path):
    src = str(tmp_path / "src.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), src, enable_stable_row_ids=True)
    lance.dataset(src).delete("id = 1")  # v2
    dst = str(tmp_path / "dst.lance")
    clone = lance.dataset(src).shallow_clone(dst, 2)
    base = clone.version
    lance.dataset(dst).delete("id = 2")
    with pytest.raises(VersionNotFoundError, match="shallow-cloned") as err:
        lance_cdf.read_changes(dst, base)
    assert "cleanup_old_versions" not in str(err.value).split(".")[0]


def test_operation_from_inline_transaction(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).update({"id": "id + 10"}, where="id = 2")
    lance.dataset(uri).delete("id = 1")
    ds = lance.dataset(uri)
    expected = {v: type(ds.read_transaction(v).operation).__name__ for v in (1, 2, 3)}
    # the _transactions/ copies gone (as after cleanup with a branch keeping the version)
    shutil.rmtree(os.path.join(uri, "_transactions"))
    feed = ChangeFeed(uri)
    assert {v: feed.plan(v).summary()["operation"] for v in (1, 2, 3)} == expected
    assert expected[2] == "Update"


def test_blob_bytes_through_avro_to_a_replica(tmp_path):
    import io

    import fastavro

    from lance_cdf.avro.schema import change_records, envelope_schema, row_arrow_schema
    from lance_cdf.replicate.replica import ReplicaTable

    uri = str(tmp_path / "b.lance")
    schema = pa.schema(
        [pa.field("id", pa.int64()), pa.field("img", pa.large_binary(), metadata=BLOB)]
    )
    data = pa.table({"id": [1, 2], "img": [b"\x00one", None]}, schema=schema)
    lance.write_dataset(data, uri, enable_stable_row_ids=True)
    new = pa.table({"id": [2], "img": [b"two\xff"]}, schema=schema)
    lance.dataset(uri).merge_insert("id").when_matched_update_all().execute(new)
    events = lance_cdf.read_changes(uri, 1).read_all()
    user = events.schema.names[:2]
    envelope = envelope_schema(pa.schema([events.schema.field(c) for c in user]), "b")
    parsed = fastavro.parse_schema(envelope)
    decoded = []
    for _key, value, _meta in change_records(events, user, {}, "b", ["id"], "t", 0):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, value)  # a consumer lance-cdf did not write
        decoded.append(fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), parsed))
    afters = [v["after"] for v in decoded]
    assert afters == [
        {"id": 1, "img": b"\x00one"},
        {"id": 2, "img": None},
        {"id": 2, "img": b"two\xff"},
    ]
    replica = ReplicaTable(str(tmp_path / "replica.lance"), ["id"])
    rows = row_arrow_schema(envelope)
    for after in afters:
        replica.apply(pa.Table.from_pylist([after], schema=rows), None, {})
    got = lance.dataset(replica.uri).to_table().sort_by("id")
    assert got["img"].to_pylist() == [b"\x00one", b"two\xff"]
