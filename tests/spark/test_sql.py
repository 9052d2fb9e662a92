"""SQL: the table-valued function `lance_table_changes(path, start [, end])` and a view
`USING lance-cdf`, against `read_changes` of the same range on random workloads."""

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lance_cdf
from tests.support.workload import Workload

OPS = [
    "append",
    "update",
    "upsert",
    "delete_sparse",
    "delete_dense",
    "upsert_delete_missing",
    "compact",
    "add_column",
    "restore",
]


def expected(uri, start, end=None) -> list:
    events = lance_cdf.read_changes(uri, start, end).read_all()
    micros = pc.cast(events["_commit_timestamp"], pa.int64())
    events = events.drop_columns(["_commit_timestamp"]).append_column("ts", micros)
    return sorted((sorted(r.items()) for r in events.to_pylist()), key=repr)


def got(spark, query: str) -> list:
    df = spark.sql(query)
    cols = [c for c in df.columns if c != "_commit_timestamp"]
    df = df.selectExpr(*[f"`{c}`" for c in cols], "unix_micros(_commit_timestamp) AS ts")
    rows = [r.asDict(recursive=True) for r in df.collect()]
    return sorted((sorted(r.items()) for r in rows), key=repr)


@pytest.mark.parametrize("seed", [1, 2])
def test_table_changes_equals_read_changes(spark, tmp_path, seed):
    uri = str(tmp_path / "t.lance")
    rng = random.Random(seed)
    w = Workload(uri, seed=seed, rows=150)
    for _ in range(6):
        w.step(rng.choice(OPS))
    latest = w.ds.version
    for _ in range(3):
        start = rng.randint(1, latest)
        end = rng.randint(start, latest)
        want = expected(uri, start, end)
        assert got(spark, f"SELECT * FROM lance_table_changes('{uri}', {start}, {end})") == want
    # no end: through the latest version
    start = rng.randint(1, latest)
    assert got(spark, f"SELECT * FROM lance_table_changes('{uri}', {start})") == expected(
        uri, start
    )


def test_table_changes_composes_with_sql(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    w = Workload(uri, seed=3, rows=100)
    for op in ("update", "delete_sparse", "append"):
        w.step(op)
    counts = spark.sql(
        f"SELECT _change_type, count(*) AS n FROM lance_table_changes('{uri}', 2, 4) "
        "GROUP BY _change_type"
    ).collect()
    events = lance_cdf.read_changes(uri, 2, 4).read_all()
    want = events.group_by("_change_type").aggregate([("_rowid", "count")]).to_pylist()
    assert {r["_change_type"]: r["n"] for r in counts} == {
        r["_change_type"]: r["_rowid_count"] for r in want
    }


def test_view_using_lance_cdf(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    w = Workload(uri, seed=4, rows=100)
    for op in ("upsert", "delete_sparse", "update"):
        w.step(op)
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW c USING `lance-cdf` "
        f"OPTIONS (path '{uri}', startingVersion 3, endingVersion 4)"
    )
    assert got(spark, "SELECT * FROM c") == expected(uri, 3, 4)


def test_table_changes_errors_name_the_problem(spark, tmp_path):
    uri = str(tmp_path / "t.lance")
    Workload(uri, seed=5, rows=20)
    with pytest.raises(Exception, match="version 9"):
        spark.sql(f"SELECT * FROM lance_table_changes('{uri}', 9)").collect()
    with pytest.raises(Exception, match="must be a constant"):
        spark.sql(
            f"SELECT * FROM lance_table_changes(concat('{uri}', string(rand())), 1)"
        ).collect()
