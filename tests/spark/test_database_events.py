"""A whole database as one Spark stream of events with `_table`
(spark/source/database_events.py): every table's events, selected by `_table`, equal
`read_changes` of that table exactly (the oracle: all its columns; the other tables'
columns null); tables taken up while running; a restart from the checkpoint neither loses
nor repeats; columns that cannot share one stream refused in one line; a batch read
equals the same."""

import pickle
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import lance_cdf
from lance_cdf.errors import CheckpointMismatchError, DatabaseSchemaError, LanceCdfError
from lance_cdf.spark.source.database_events import (
    TABLE_COLUMN,
    DatabaseBatchReader,
    DatabaseEventReader,
    database_schema,
)

lancedb = pytest.importorskip("lancedb")
STABLE = {"new_table_enable_stable_row_ids": "true"}
SORT = ["_commit_version", "_change_type", "_rowid"]
SNIPPETS = Path(__file__).resolve().parents[2] / "docs/snippets"


def items(lo, hi):
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": [f"i{i}" for i in ids], "x": ids * 0.5})


def orders(lo, hi):
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "amount": ids * 2.0, "note": [f"o{i}" for i in ids]})


def logs(lo, hi):
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": [f"l{i}" for i in ids], "flag": ids % 2 == 0})


def path(table):
    return table.uri.removeprefix("file://")


def database(tmp_path):
    """Three tables of different schemas, one in a child namespace, each with a history."""
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_namespace(["sales"])
    tables = {
        "items": db.create_table("items", items(0, 20), storage_options=STABLE),
        "sales.orders": db.create_table(
            "orders", orders(0, 10), namespace_path=["sales"], storage_options=STABLE
        ),
        "logs": db.create_table("logs", logs(0, 5), storage_options=STABLE),
    }
    tables["items"].update(where="id < 3", values={"s": "u"})
    tables["sales.orders"].delete("id >= 8")
    return root, db, tables


def normalized(table: pa.Table, columns) -> list[dict]:
    """Rows of `columns`, timestamps as integers, in a fixed order."""
    arrays = []
    for name in columns:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        elif pa.types.is_unsigned_integer(column.type):
            column = column.cast(pa.int64())
        arrays.append(column)
    rows = pa.table(arrays, names=list(columns)).to_pylist()
    return sorted(rows, key=lambda r: tuple(r[k] for k in SORT))


def check(got: pa.Table, tables, first=None):
    """Each table's events in `got` equal read_changes of it (from `first[name]`, default 1)
    on all its columns, and are null in every other column."""
    names = set(got.column(TABLE_COLUMN).to_pylist())
    assert names <= set(tables)
    for name, table in tables.items():
        mine = got.filter(pa.compute.equal(got.column(TABLE_COLUMN), name))
        start = (first or {}).get(name, 1)
        oracle = lance_cdf.read_changes(path(table), start).read_all()
        assert len(oracle) > 0
        assert normalized(mine, oracle.column_names) == normalized(oracle, oracle.column_names)
        others = [c for c in got.column_names if c not in oracle.column_names + [TABLE_COLUMN]]
        assert others and all(mine.column(c).null_count == len(mine) for c in others)


def executor(r):
    """The reader as Spark's executors have it: pickled once, when the query starts (Spark's
    own mechanism), so it knows none of the tables the driver takes up later."""
    return pickle.loads(pickle.dumps(r))


def read_back(r, remote, start, end) -> pa.Table:
    """A micro-batch read as Spark reads it: partitions planned on the driver (`r`), each
    read by the executors' copy (`remote`)."""
    batches = [b for p in r.partitions(start, end) for b in remote.read(p)]
    return pa.Table.from_batches(batches, r.target)


def test_the_stream_of_every_table_equals_read_changes_per_table(tmp_path):
    root, db, tables = database(tmp_path)
    db.create_table("legacy", logs(0, 3))  # no stable row IDs: left out, in one line
    options = {"database": root, "startingVersion": "1", "idlePollMax": "0"}
    schema = database_schema(options)
    # the union by name: shared columns once, then the metadata columns and _table
    assert schema.fieldNames() == [
        "id",
        "s",
        "x",
        "flag",
        "amount",
        "note",
        "_rowid",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
        TABLE_COLUMN,
    ]
    r = DatabaseEventReader(options, schema)
    remote = executor(r)
    o0 = r.initialOffset()
    assert sorted(o0["tables"]) == ["items", "logs", "sales.orders"]
    assert "stable row IDs" in r.skipped["legacy"]
    o1 = r.latestOffset(o0, ReadAllAvailable())
    check(read_back(r, remote, o0, o1), tables)
    # writes while running; a table created while running is taken up from its first version
    tables["logs"].add(logs(5, 8))
    returns = db.create_table(
        "returns", orders(0, 4), namespace_path=["sales"], storage_options=STABLE
    )
    returns.update(where="id = 1", values={"note": "z"})
    r.listed_at -= 60  # (the next listing is due)
    o2 = r.latestOffset(o1, ReadAllAvailable())
    assert o2["tables"]["sales.returns"]["version"] == 0
    o3 = r.latestOffset(o2, ReadAllAvailable())
    got = pa.concat_tables([read_back(r, remote, o1, o2), read_back(r, remote, o2, o3)])
    done = lance_cdf.read_changes(path(tables["logs"]), 1).read_all()
    latest = max(done.column("_commit_version").to_pylist())
    check(got, {"logs": tables["logs"], "sales.returns": returns}, {"logs": latest})
    # a restart from the checkpoint's offset: the same tables, nothing again, then the new;
    # a dropped table is let go, the others go on
    again = DatabaseEventReader(options, schema)
    remote = executor(again)
    assert again.latestOffset(o3, ReadAllAvailable()) == o3
    with pytest.raises(CheckpointMismatchError, match="started with startingVersion 1; "):
        DatabaseEventReader({**options, "startingVersion": "2"}, schema).latestOffset(
            o3, ReadAllAvailable()
        )
    tables["items"].delete("id = 19")
    db.drop_table("logs")
    o4 = again.latestOffset(o3, ReadAllAvailable())
    assert sorted(o4["tables"]) == ["items", "sales.orders", "sales.returns"]
    latest = max(
        lance_cdf.read_changes(path(tables["items"]), 1)
        .read_all()
        .column("_commit_version")
        .to_pylist()
    )
    check(read_back(again, remote, o3, o4), {"items": tables["items"]}, {"items": latest})


def test_a_table_created_again_at_its_path_is_read_afresh(tmp_path):
    """LanceDB drops a root table's directory and creates a new table of that name at the same
    path: an executor that read the old table (its feed, with cached manifests) must read the
    new table's events from the new table's manifests."""
    from lance_cdf.spark.source import table_feeds

    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_table("items", items(0, 10), storage_options=STABLE).add(items(10, 20))
    options = {"database": root, "startingVersion": "1", "idlePollMax": "0"}
    r = DatabaseEventReader(options, database_schema(options))
    remote = executor(r)
    o0 = r.initialOffset()
    o1 = r.latestOffset(o0, ReadAllAvailable())
    assert len(read_back(r, remote, o0, o1)) == 20
    held = dict(table_feeds._FEEDS)  # what an executor holds after that micro-batch
    db.drop_table("items")
    r.listed_at -= 60
    o2 = r.latestOffset(o1, ReadAllAvailable())
    assert "items" not in o2["tables"]
    new = db.create_table("items", items(50, 53), storage_options=STABLE)
    new.update(where="id = 51", values={"s": "z"})
    new.add(items(60, 62))
    r.listed_at -= 60
    o3 = r.latestOffset(o2, ReadAllAvailable())
    o4 = r.latestOffset(o3, ReadAllAvailable())
    table_feeds._FEEDS.update(held)  # the executor still holds the old table's feed
    got = read_back(r, remote, o3, o4)
    oracle = lance_cdf.read_changes(path(new), 1).read_all()
    assert normalized(got, oracle.column_names) == normalized(oracle, oracle.column_names)


def test_a_restart_reads_columns_dropped_since_the_checkpoint(tmp_path):
    """Versions committed while the query was stopped hold a column a later version drops:
    the restarted stream (whose schema has it) delivers its values, as read_changes does."""
    root, _, tables = database(tmp_path)
    options = {"database": root, "startingVersion": "1", "idlePollMax": "0"}
    r = DatabaseEventReader(options, database_schema(options))
    o1 = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    first = tables["logs"].version + 1
    tables["logs"].add(logs(5, 9))
    tables["logs"].drop_columns(["flag"])
    schema = database_schema(options)
    assert "flag" in schema.fieldNames()
    again = DatabaseEventReader(options, schema)
    remote = executor(again)
    o2 = again.latestOffset(o1, ReadAllAvailable())
    got = read_back(again, remote, o1, o2)
    oracle = lance_cdf.read_changes(path(tables["logs"]), first).read_all()
    assert "flag" in oracle.column_names and oracle.column("flag").null_count == 0
    assert normalized(got, oracle.column_names) == normalized(oracle, oracle.column_names)


def test_columns_that_cannot_share_one_stream(tmp_path):
    root, db, tables = database(tmp_path)
    db.create_table("clash", pa.table({"id": [1], "x": ["text"]}), storage_options=STABLE)
    with pytest.raises(DatabaseSchemaError) as refused:
        database_schema({"database": root})
    assert str(refused.value) == (
        "column x is string in table clash and double in table items: one stream cannot hold "
        "both; leave one table out (option include / exclude) or read each table in its own "
        "stream (option path)"
    )
    options = {"database": root, "exclude": "clash", "idlePollMax": "0"}
    schema = database_schema(options)
    assert "x" in schema.fieldNames()
    # a table taken up later whose columns the stream lacks stops the query, in one line
    r = DatabaseEventReader(options, schema)
    o0 = r.initialOffset()
    db.create_table("wide", pa.table({"id": [1], "z": [1.5]}), storage_options=STABLE)
    r.listed_at -= 60
    with pytest.raises(
        DatabaseSchemaError,
        match=r"table wide has column\(s\) \['z'\] the "
        r"stream lacks: .* restart the query",
    ):
        r.latestOffset(o0, ReadAllAvailable())
    # a followed table that adds a column stops it too (as a one-table stream stops)
    db.drop_table("wide")
    r = DatabaseEventReader(options, schema)
    o0 = r.initialOffset()
    tables["logs"].add_columns({"extra": "id * 2"})
    tables["logs"].add(pa.table({"id": [9], "s": ["l9"], "flag": [True], "extra": [18]}))
    with pytest.raises(LanceCdfError, match="new column"):
        r.latestOffset(o0, ReadAllAvailable())


def test_a_batch_read_from_a_time(tmp_path):
    """startingTimestamp: each table from its first commit at or after it; a table with
    none since reads nothing."""
    root, _, tables = database(tmp_path)
    time.sleep(0.01)
    since = datetime.now(UTC).isoformat()
    first = tables["items"].version + 1
    tables["items"].add(items(20, 25))
    tables["items"].delete("id = 0")
    options = {"database": root, "startingTimestamp": since, "idlePollMax": "0"}
    b = DatabaseBatchReader(options, database_schema(options))
    remote = executor(b)
    got = pa.Table.from_batches([r for p in b.partitions() for r in remote.read(p)], b.target)
    check(got, {"items": tables["items"]}, {"items": first})
    assert set(got.column(TABLE_COLUMN).to_pylist()) == {"items"}


def test_options_that_do_not_hold_across_tables(tmp_path):
    root, _, _ = database(tmp_path)
    # maxVersionsPerTrigger holds per table: each table's first version alone
    options = {
        "database": root,
        "startingVersion": "1",
        "maxVersionsPerTrigger": "1",
        "idlePollMax": "0",
    }
    r = DatabaseEventReader(options, database_schema(options))
    o1 = r.latestOffset(r.initialOffset(), r.getDefaultReadLimit())
    assert {n: t["version"] for n, t in o1["tables"].items()} == {
        "items": 1,
        "logs": 1,
        "sales.orders": 1,
    }
    with pytest.raises(LanceCdfError, match="unknown option"):
        database_schema({"database": root, "startingVersoin": "1"})
    with pytest.raises(LanceCdfError, match="names one table's version: a database batch"):
        DatabaseBatchReader(
            {"database": root, "startingVersion": "2"}, database_schema({"database": root})
        )
    with pytest.raises(LanceCdfError, match="endingVersion names one table's version"):
        database_schema({"database": root, "endingVersion": "3"})
    with pytest.raises(LanceCdfError, match="not startingTimestamp"):
        DatabaseEventReader(
            {"database": root, "startingTimestamp": "2026-01-01"},
            database_schema({"database": root}),
        )


def test_spark_stream_and_batch_read(spark, tmp_path):
    root, db, tables = database(tmp_path)
    seen = []

    def collect(df, batch_id):
        seen.append(df.toArrow())

    def run():
        q = (
            spark.readStream.format("lance-cdf")
            .option("database", root)
            .option("startingVersion", 1)
            .option("include", "items|logs|sales\\..*")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(180)
        assert q.exception() is None

    run()
    tables["logs"].add(logs(5, 8))
    returns = db.create_table(
        "returns", orders(0, 4), namespace_path=["sales"], storage_options=STABLE
    )
    returns.update(where="id = 1", values={"note": "z"})
    run()  # a restart from the checkpoint: the new commits and the new table, nothing again
    got = pa.concat_tables([t for t in seen if len(t)])
    everything = {**tables, "sales.returns": returns}
    check(got, everything)
    batch = (
        spark.read.format("lance-cdf")
        .option("database", root)
        .option("startingVersion", "earliest")
        .load()
    )
    check(batch.toArrow(), everything)
    # the guide's example, as written (its /tmp/db is this database)
    code = (SNIPPETS / "spark_database.py").read_text().replace("/tmp/", f"{tmp_path}/")
    exec(compile(code, "spark_database.py", "exec"), {"spark": spark})
    check(
        spark.sql("SELECT * FROM dbc").toArrow(),
        {n: t for n, t in everything.items() if n != "logs"},
    )
