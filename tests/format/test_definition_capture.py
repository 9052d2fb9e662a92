"""A table's definition as format/definition_capture.py reads it from pylance: each index
type round-trips (captured on table A, built from the definition on a copy B with the same
rows, captured again: equal), optimize changes segments but not the definition, the
replicator's key index is left out, config and metadata are read."""

from __future__ import annotations

from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_cdf.format.definition_capture import KEY_COLUMN, DefinitionCapture, capture, settled
from lance_cdf.format.definitions import IndexDefinition, TableDefinition

ROWS = 1200
DIM = 16

# each index, how the test builds it on A (the build type and arguments a user gives)
BUILDS: list[tuple[str, str, dict[str, object]]] = [
    ("id", "BTREE", {}),
    ("cat", "BITMAP", {}),
    ("tags", "LABEL_LIST", {}),
    ("s", "NGRAM", {}),
    ("n", "ZONEMAP", {}),
    (
        "text",
        "INVERTED",
        {"with_position": True, "base_tokenizer": "whitespace", "stem": False, "lower_case": True},
    ),
    ("vec", "IVF_PQ", {"metric": "cosine", "num_partitions": 4, "num_sub_vectors": 4}),
    ("vec", "IVF_FLAT", {"metric": "dot", "num_partitions": 3}),
    ("vec", "IVF_SQ", {"num_partitions": 2}),
    ("vec", "IVF_HNSW_SQ", {"metric": "l2", "num_partitions": 2, "m": 8, "ef_construction": 90}),
    ("vec", "IVF_HNSW_PQ", {"num_partitions": 2, "num_sub_vectors": 2}),
]


def rows() -> pa.Table:
    rng = np.random.default_rng(7)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(ROWS * DIM, dtype=np.float32)), DIM)
    return pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "n": pa.array(rng.integers(0, 1000, ROWS), pa.int64()),
            "cat": pa.array([f"c{i % 5}" for i in range(ROWS)]),
            "tags": pa.array([[f"t{i % 3}", f"u{i % 7}"] for i in range(ROWS)]),
            "s": pa.array([f"name-{i}" for i in range(ROWS)]),
            "text": pa.array([f"The quick brown fox {i} jumps" for i in range(ROWS)]),
            "vec": vec,
        }
    )


def build(ds: lance.LanceDataset, d: IndexDefinition) -> None:
    """What a replicator does with a definition (the interface's contract)."""
    params = d.parameters()
    if d.index_type.startswith("IVF_"):
        ds.create_index(list(d.columns), d.index_type, name=d.name, replace=True, **params)
    else:
        (column,) = d.columns
        ds.create_scalar_index(column, d.index_type, name=d.name, replace=True, **params)


def test_every_index_type_round_trips(tmp_path: Path) -> None:
    a = lance.write_dataset(rows(), str(tmp_path / "a.lance"), enable_stable_row_ids=True)
    b = lance.write_dataset(rows(), str(tmp_path / "b.lance"), enable_stable_row_ids=True)
    for i, (column, kind, kwargs) in enumerate(BUILDS):
        name = f"{column}_{kind.lower()}_{i}"
        if kind.startswith("IVF_"):
            a.create_index(column, kind, name=name, **kwargs)  # type: ignore[arg-type]
        else:
            a.create_scalar_index(column, kind, name=name, **kwargs)  # type: ignore[arg-type]
    a = lance.dataset(a.uri)
    source = capture(a)
    assert [i.name for i in source.indexes] == sorted(
        f"{c}_{k.lower()}_{i}" for i, (c, k, _) in enumerate(BUILDS)
    )
    # the build types and the arguments given come back (the oracle: what the test built)
    for i, (column, kind, kwargs) in enumerate(BUILDS):
        d = source.index(f"{column}_{kind.lower()}_{i}")
        assert d is not None and d.index_type == kind and d.columns == (column,)
        for k, v in kwargs.items():
            assert d.parameters()[k] == v, (d, k)
    for d in source.indexes:
        build(b, d)
    assert capture(lance.dataset(b.uri)) == source


def test_optimize_changes_segments_not_the_definition(tmp_path: Path) -> None:
    ds = lance.write_dataset(rows(), str(tmp_path / "t.lance"), enable_stable_row_ids=True)
    ds.create_scalar_index("id", "BTREE")
    ds.create_index("vec", "IVF_PQ", num_partitions=3, num_sub_vectors=2)  # v3, from v2
    cap = DefinitionCapture()
    before, origins = cap.capture_with_origins(lance.dataset(ds.uri))
    assert origins == {"id_idx": 1, "vec_idx": 2}
    assert before.index("vec_idx").parameters()["num_partitions"] == 3  # type: ignore[union-attr]
    ds = lance.write_dataset(rows().slice(0, 1), ds.uri, mode="append")  # v4
    ds.optimize.optimize_indices(num_indices_to_merge=0)  # v5: a delta segment per index
    ds.optimize.optimize_indices()  # v6: merged, the vector index trained again
    after = lance.dataset(ds.uri)
    assert {i.uuid for d in after.describe_indices() for i in d.segments} != {
        i.uuid for d in lance.dataset(ds.uri, version=3).describe_indices() for i in d.segments
    }
    now, now_origins = cap.capture_with_origins(after)
    assert now_origins == origins  # the segments' origin stays
    # pylance sized the merged index's partitions by its rows: the definition keeps the
    # count it was built with
    assert now != before and settled(now, now_origins, before, 3) == before
    # a replace is a new build: its own parameters
    after.create_index(
        "vec", "IVF_PQ", name="vec_idx", replace=True, num_partitions=2, num_sub_vectors=4
    )
    rebuilt, rebuilt_origins = capture_with_new(lance.dataset(ds.uri))
    assert rebuilt_origins["vec_idx"] == 6
    got = settled(rebuilt, rebuilt_origins, before, 3).index("vec_idx")
    assert got is not None and got.parameters()["num_sub_vectors"] == 4


def capture_with_new(ds: lance.LanceDataset) -> tuple[TableDefinition, dict[str, int]]:
    return DefinitionCapture().capture_with_origins(ds)


def test_replicator_key_index_is_left_out(tmp_path: Path) -> None:
    from lance_cdf.replicate.replica import SOURCE_ROWID

    assert SOURCE_ROWID == KEY_COLUMN
    t = rows().append_column(KEY_COLUMN, pa.array(range(ROWS), pa.int64()))
    ds = lance.write_dataset(t, str(tmp_path / "r.lance"), enable_stable_row_ids=True)
    ds.create_scalar_index(KEY_COLUMN, "BTREE")  # as the replicator names it
    ds.create_scalar_index(KEY_COLUMN, "BITMAP", name="user_made")  # a user's: kept
    assert [i.name for i in capture(lance.dataset(ds.uri)).indexes] == ["user_made"]


def test_config_and_metadata(tmp_path: Path) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), metadata={"doc": "the key"}),
            pa.field("st", pa.struct([pa.field("a", pa.int32(), metadata={"unit": "m"})])),
        ],
        metadata={"embedding_functions": "[]"},
    )
    t = pa.table({"id": [1, 2], "st": [{"a": 1}, {"a": 2}]}, schema=schema)
    ds = lance.write_dataset(t, str(tmp_path / "m.lance"), enable_stable_row_ids=True)
    assert capture(ds) == TableDefinition.of(
        [],
        {},
        {"embedding_functions": b"[]"},
        {"id": {"doc": b"the key"}, "st.a": {"unit": b"m"}},
    )
    ds.update_config({"k": "v"})
    ds.replace_schema_metadata({"x": "y"})
    got = capture(lance.dataset(ds.uri))
    assert dict(got.config) == {"k": "v"}
    assert dict(got.schema_metadata) == {"x": b"y"}


pytestmark = pytest.mark.unit
