"""A replica made equal to the source's definition (replicate/replica_definition.py,
index_keeper.py) without Kafka: a replica with rows and its key index, a TableDefinition,
and the upkeep. The oracles are the definition itself (indexes by name, type and columns;
config; metadata), pylance's own description of the replica, and `explain_plan`."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_cdf.format.definitions import IndexDefinition, TableDefinition
from lance_cdf.replicate.index_keeper import (
    IndexKeeper,
    describe_indexes,
    unbuilt_lines,
    unindexed_rows,
)
from lance_cdf.replicate.replica import OFFSETS_PROPERTY, ReplicaTable
from lance_cdf.replicate.replica_definition import BUILT_CONFIG, reconcile

DIM = 16


def rows(start: int, n: int) -> pa.Table:
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "_source_rowid": pa.array(ids, pa.int64()),
            "id": pa.array(ids, pa.int64()),
            "cat": pa.array([f"c{i % 5}" for i in ids]),
            "tags": pa.array([[f"t{i % 3}", f"u{i % 7}"] for i in ids]),
            "text": pa.array(
                [f"the quick fox number {i} jumps {'high' if i % 2 else 'low'}" for i in ids]
            ),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(n * DIM, dtype=np.float32)), DIM
            ),
        }
    )


def replica_with_rows(tmp_path, n: int = 2000, keeper: IndexKeeper | None = None) -> ReplicaTable:
    """A replica of `n` rows keyed by `_source_rowid`, with the replicator's key index."""
    replica = ReplicaTable(
        str(tmp_path / "replica"), ["_source_rowid"], key_map=False, keeper=keeper
    )
    replica.apply(rows(0, n), None, {OFFSETS_PROPERTY: '{"t": {"0": 1}}'})
    replica.apply(rows(n, 10), None, {OFFSETS_PROPERTY: '{"t": {"0": 2}}'})  # the key index
    return replica


def definition(**changed: IndexDefinition | None) -> TableDefinition:
    indexes = {
        "id_idx": IndexDefinition.of("id_idx", "BTREE", ("id",), {}),
        "cat_idx": IndexDefinition.of("cat_idx", "BITMAP", ("cat",), {}),
        "tags_idx": IndexDefinition.of("tags_idx", "LABEL_LIST", ("tags",), {}),
        "text_idx": IndexDefinition.of(
            "text_idx", "INVERTED", ("text",), {"with_position": True, "lower_case": True}
        ),
        "vec_idx": IndexDefinition.of(
            "vec_idx",
            "IVF_PQ",
            ("vec",),
            {"metric": "cosine", "num_partitions": 4, "num_sub_vectors": 4},
        ),
    }
    for name, d in changed.items():
        if d is None:
            indexes.pop(name)
        else:
            indexes[name] = d
    return TableDefinition.of(
        list(indexes.values()),
        {"lance.auto_cleanup.interval": "1", "app.tier": "gold", "app.owner": "search"},
        {"embedding_functions": b'[{"name": "openai"}]'},
        {"vec": {"lancedb:embedding": b"source_column=text"}},
    )


def indexes_of(ds: lance.LanceDataset) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {i["name"]: (i["type"], tuple(i["columns"])) for i in describe_indexes(ds)}


def expected(d: TableDefinition) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The indexes of `d` as `status` names them: each by the build type the source used."""
    return {i.name: (i.index_type, i.columns) for i in d.indexes}


def test_definition_built_replaced_dropped_and_settings_equal(tmp_path):
    replica = replica_with_rows(tmp_path)
    ds = replica.open()
    key_index = {s["name"] for s in replica.lookup.key_index(ds)}
    assert key_index, "the replicator's key index exists before the definition"
    extra = (IndexDefinition.of("own_cat", "BTREE", ("cat",), {}),)
    d1 = definition()
    r = reconcile(ds, d1, key_index, extra)
    assert not r.unbuilt
    ds = replica.open()
    own = {k: ("BTREE", ("_source_rowid",)) for k in key_index} | {"own_cat": ("BTREE", ("cat",))}
    assert indexes_of(ds) == expected(d1) | own
    config = {k: v for k, v in ds.config().items() if not k.startswith("lance-cdf.")}
    # (auto cleanup stays the replica's own: it would remove the versions holding its position)
    assert config == {k: v for k, v in d1.config if not k.startswith("lance.auto_cleanup.")}
    assert ds.schema.metadata == {b"embedding_functions": b'[{"name": "openai"}]'}
    assert ds.schema.field("vec").metadata == {b"lancedb:embedding": b"source_column=text"}
    assert ds.schema.field("text").metadata in (None, {})

    # again: nothing to do
    assert not reconcile(ds, d1, key_index, extra).changed()

    # the vector index's parameters change, the BITMAP is dropped, config and metadata change
    vec2 = IndexDefinition.of(
        "vec_idx", "IVF_PQ", ("vec",), {"metric": "l2", "num_partitions": 2, "num_sub_vectors": 4}
    )
    d2 = TableDefinition.of(
        [i for i in definition(vec_idx=vec2, cat_idx=None).indexes],
        {"app.owner": "ranking"},
        {},
        {"text": {"k": b"v"}},
    )
    before = {i["name"]: i["uuid"] for i in ds.list_indices()}
    r = reconcile(ds, d2, key_index, extra)
    assert (r.created, r.replaced, r.dropped, r.unbuilt) == ([], ["vec_idx"], ["cat_idx"], [])
    ds = replica.open()
    assert indexes_of(ds) == expected(d2) | own
    after = {i["name"]: i["uuid"] for i in ds.list_indices()}
    assert after["vec_idx"] != before["vec_idx"] and after["id_idx"] == before["id_idx"]
    assert ds.stats.index_stats("vec_idx")["indices"][0]["metric_type"] == "l2"
    assert {k: v for k, v in ds.config().items() if not k.startswith("lance-cdf.")} == {
        "app.owner": "ranking"
    }
    assert not ds.schema.metadata
    assert ds.schema.field("text").metadata == {b"k": b"v"}
    assert ds.schema.field("vec").metadata in (None, {})
    assert "vec_idx" in ds.config()[BUILT_CONFIG]


def test_queries_use_the_replica_indexes(tmp_path):
    replica = replica_with_rows(tmp_path)
    ds = replica.open()
    reconcile(ds, definition(), set())
    ds = replica.open()
    q = np.random.default_rng(7).random(DIM, dtype=np.float32)
    vector_plan = ds.scanner(nearest={"column": "vec", "q": q, "k": 10}).explain_plan()
    assert "ANNSubIndex" in vector_plan or "ANNIvfPartition" in vector_plan, vector_plan
    filter_plan = ds.scanner(filter="cat = 'c3'").explain_plan()
    assert "ScalarIndexQuery" in filter_plan or "MaterializeIndex" in filter_plan, filter_plan
    fts_plan = ds.scanner(full_text_query="fox").explain_plan()
    assert "MatchQuery" in fts_plan or "FTS" in fts_plan.upper(), fts_plan
    # and the answers are the rows' own
    got = ds.to_table(filter="cat = 'c3'", columns=["id"])["id"].to_pylist()
    assert sorted(got) == [i for i in range(2010) if i % 5 == 3]


def test_unbuildable_definition_named_rest_built_retried(tmp_path):
    keeper = IndexKeeper()
    replica = replica_with_rows(tmp_path, n=40, keeper=keeper)
    big = IndexDefinition.of(
        "vec_idx", "IVF_PQ", ("vec",), {"num_partitions": 256, "num_sub_vectors": 4}
    )
    odd = IndexDefinition.of("geo_idx", "NOT_A_TYPE", ("id",), {})
    gone = IndexDefinition.of("gone_idx", "BTREE", ("no_such_column",), {})
    d = definition(vec_idx=big, geo_idx=odd, gone_idx=gone)
    keeper.want(d)
    done = replica.maintain()
    assert done["indexes_unbuilt"] == 3
    ds = replica.open()
    names = set(indexes_of(ds))
    assert {"id_idx", "cat_idx", "tags_idx", "text_idx"} <= names
    assert not names & {"vec_idx", "geo_idx", "gone_idx"}
    lines = unbuilt_lines(ds)
    assert sorted(line.split("'")[1] for line in lines) == ["geo_idx", "gone_idx", "vec_idx"]
    assert all(line.count("\n") == 0 and "; " in line for line in lines)
    # enough rows later (and a compaction upkeep): the vector index is built then
    replica.apply(rows(100, 3000), None, {OFFSETS_PROPERTY: '{"t": {"0": 3}}'})
    keeper.want(
        definition(
            vec_idx=IndexDefinition.of(
                "vec_idx", "IVF_PQ", ("vec",), {"num_partitions": 8, "num_sub_vectors": 4}
            )
        )
    )
    replica.maintain(compact=True)
    ds = replica.open()
    assert "vec_idx" in indexes_of(ds)
    assert unbuilt_lines(ds) == []
    # the recorded position is the data commit's, stepped over by the upkeep's commits
    assert replica.position()[OFFSETS_PROPERTY] == '{"t": {"0": 3}}'


def test_upkeep_bounds_unindexed_rows_and_no_indexes(tmp_path):
    keeper = IndexKeeper()
    replica = replica_with_rows(tmp_path, keeper=keeper)
    keeper.want(definition())
    replica.maintain()
    batch = rows(5000, 500)
    replica.apply(batch, None, {OFFSETS_PROPERTY: '{"t": {"0": 3}}'})
    ds = replica.open()
    assert max(unindexed_rows(ds)[n] for n in ("id_idx", "vec_idx")) == 500
    replica.maintain(batch_rows=10)  # 500 > max(1% of 2510, 10): optimized
    ds = replica.open()
    loose = unindexed_rows(ds)
    assert all(loose[n] == 0 for n in ("id_idx", "cat_idx", "text_idx", "vec_idx")), loose
    replica.apply(rows(6000, 20), None, {OFFSETS_PROPERTY: '{"t": {"0": 4}}'})
    replica.maintain(batch_rows=20)  # 20 rows: under the bound, left for later
    assert unindexed_rows(replica.open())["id_idx"] == 20

    # --no-indexes: settings still follow, no source index built or dropped
    keeper2 = IndexKeeper(
        source_indexes=False, extra=(IndexDefinition.of("mine", "BITMAP", ("cat",), {}),)
    )
    replica2 = replica_with_rows(tmp_path / "two", keeper=keeper2)
    keeper2.want(definition())
    replica2.maintain()
    ds2 = replica2.open()
    assert set(indexes_of(ds2)) == {s["name"] for s in replica2.lookup.key_index(ds2)} | {"mine"}
    assert ds2.config()["app.owner"] == "search"


@pytest.mark.parametrize("key_map", [True])
def test_key_map_survives_index_commits(tmp_path, key_map):
    keeper = IndexKeeper()
    replica = ReplicaTable(str(tmp_path / "r"), ["_source_rowid"], key_map=key_map, keeper=keeper)
    replica.apply(rows(0, 500), None, {OFFSETS_PROPERTY: '{"t": {"0": 1}}'})
    replica.apply(rows(0, 10), None, {OFFSETS_PROPERTY: '{"t": {"0": 2}}'})
    builds = replica.map_builds
    keeper.want(definition(vec_idx=None))
    replica.maintain()
    replica.apply(rows(5, 10), None, {OFFSETS_PROPERTY: '{"t": {"0": 3}}'})
    assert replica.map_builds == builds
    assert replica.open().count_rows() == 500


def test_status_lists_replica_indexes_and_unbuilt(tmp_path, capsys):
    import json

    from lance_cdf import cli

    keeper = IndexKeeper(extra=(IndexDefinition.of("mine", "BITMAP", ("cat",), {}),))
    replica = replica_with_rows(tmp_path, keeper=keeper)
    odd = IndexDefinition.of("odd_idx", "NOT_A_TYPE", ("id",), {})
    keeper.want(definition(vec_idx=None, odd_idx=odd))
    replica.maintain()
    replica.apply(rows(9000, 7), None, {OFFSETS_PROPERTY: '{"t": {"0": 3}}'})
    source = lance.write_dataset(rows(0, 1), str(tmp_path / "source"), enable_stable_row_ids=True)
    capsys.readouterr()
    assert cli.main(["status", "--table", source.uri, "--replica", replica.uri, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    got = {
        i["name"]: (i["type"], i["columns"], i["unindexed_rows"]) for i in report["replica_indexes"]
    }
    assert got["cat_idx"] == ("BITMAP", ["cat"], 7)
    assert got["text_idx"] == ("INVERTED", ["text"], 7)
    assert got["mine"] == ("BITMAP", ["cat"], 7)
    assert set(got) == {"id_idx", "cat_idx", "tags_idx", "text_idx", "mine", "_source_rowid_idx"}
    assert len(report["replica_unbuilt_indexes"]) == 1
    assert "odd_idx" in report["replica_unbuilt_indexes"][0]
    assert cli.main(["status", "--table", source.uri, "--replica", replica.uri]) == 0
    text = capsys.readouterr().out
    assert "text_idx (INVERTED on text): 7 rows unindexed" in text
    assert "odd_idx" in text


def test_index_flag():
    import argparse

    from lance_cdf.cli.flags import index_flag

    d = index_flag("emb=ivf_pq:vec:metric=cosine,num_partitions=8,num_sub_vectors=4")
    assert (d.name, d.index_type, d.columns) == ("emb", "IVF_PQ", ("vec",))
    assert d.parameters() == {"metric": "cosine", "num_partitions": 8, "num_sub_vectors": 4}
    assert index_flag("t=INVERTED:text:with_position=true").parameters() == {"with_position": True}
    assert index_flag("c=BITMAP:cat").parameters() == {}
    for bad in ("c", "c=BITMAP", "=BITMAP:cat", "c=BITMAP:cat:oops"):
        with pytest.raises(argparse.ArgumentTypeError):
            index_flag(bad)


def test_definition_json_round_trip():
    from lance_cdf.replicate.replica_definition import definition_json, definition_of_json

    d = definition()
    assert definition_of_json(definition_json(d)) == d
    assert definition_of_json(definition_json(TableDefinition())) == TableDefinition()
