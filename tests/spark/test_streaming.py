"""The lance-cdf Spark source on a real local Spark (local[2], one shared session)."""

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from datetime import timedelta

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf

pytestmark = pytest.mark.integration  # a PySpark driver in a subprocess

KEY = ["_commit_version", "_change_type", "_rowid"]
COLUMNS = ["id", "s", "x", "_rowid", "_change_type", "_commit_version", "_commit_timestamp"]


def make(tmp_path, n=20, name="t.lance"):
    uri = str(tmp_path / name)
    table = pa.table(
        {"id": np.arange(n), "s": [f"s{i}" for i in range(n)], "x": np.arange(n) * 0.5}
    )
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=8)
    return uri


def expected(uri, start, end=None, drop=()):
    """read_changes as rows the way Spark hands them back (sorted)."""
    t = lance_cdf.read_changes(uri, start, end).read_all().drop_columns(list(drop))
    t = t.set_column(t.schema.get_field_index("_rowid"), "_rowid", t["_rowid"].cast(pa.int64()))
    # Spark returns timestamps as naive datetimes in the session zone (UTC here)
    ts = t.schema.get_field_index("_commit_timestamp")
    t = t.set_column(ts, "_commit_timestamp", t["_commit_timestamp"].cast(pa.timestamp("us")))
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


def rows(df):
    return sorted((tuple(r) for r in df.collect()), key=repr)


def churn(uri, seed=0):
    """One commit of each kind: append, update, delete, merge_insert, compaction."""
    base = 1000 * (seed + 1)
    lance.write_dataset(
        pa.table({"id": np.arange(base, base + 5), "s": ["a"] * 5, "x": np.ones(5)}),
        uri,
        mode="append",
    )
    lance.dataset(uri).update({"s": "'upd'"}, where="id % 5 = 1")
    lance.dataset(uri).delete("id % 7 = 3")
    src = pa.table({"id": np.array([2, 4, base + 100]), "s": ["m"] * 3, "x": np.zeros(3)})
    lance.dataset(uri).merge_insert(
        "id"
    ).when_matched_update_all().when_not_matched_insert_all().execute(src)
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=100)


def counts_by_version(spark_rows):
    by = {}
    for r in spark_rows:
        by.setdefault(r["_commit_version"], Counter())[r["_change_type"]] += 1
    return by


def commits_done(ck):
    path = os.path.join(ck, "commits")
    return len([n for n in os.listdir(path) if n.isdigit()]) if os.path.isdir(path) else 0


def stream(spark, uri, **options):
    reader = spark.readStream.format("lance-cdf").option("path", uri)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def to_parquet(df, out, ck, **trigger):
    writer = df.writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
    return writer.trigger(**(trigger or {"availableNow": True})).start()


# -- batch ------------------------------------------------------------------------


def test_batch_read_equals_read_changes(spark, tmp_path):
    uri = make(tmp_path)
    churn(uri)
    df = (
        spark.read.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 2)
        .option("endingVersion", 5)
        .load()
    )
    assert df.schema.names == COLUMNS
    assert df.schema["_rowid"].dataType.simpleString() == "bigint"
    assert rows(df) == expected(uri, 2, 5)
    everything = spark.read.format("lance-cdf").load(uri)  # earliest..latest by default
    want = expected(uri, 1)
    lance.dataset(uri).delete("id = 0")  # after load(): not part of `everything`
    assert rows(everything) == want
    one = spark.read.format("lance-cdf").option("columns", "s").load(uri)
    assert one.schema.names[0] == "s" and one.count() == len(expected(uri, 1))
    ts = lance_cdf.ChangeFeed(uri).table.manifest(3).timestamp.isoformat()
    since = spark.read.format("lance-cdf").option("startingTimestamp", ts).load(uri)
    assert rows(since) == expected(uri, 3)
    last = spark.read.format("lance-cdf").option("startingVersion", "latest").load(uri)
    latest = lance.dataset(uri).version
    assert rows(last) == expected(uri, latest, latest)


def test_batch_read_of_types_spark_lacks(spark, tmp_path):
    uri = str(tmp_path / "types.lance")
    n = 3
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "u8": pa.array([0, 1, 255], pa.uint8()),
            "u64": pa.array([0, 1, 2**63 - 1], pa.uint64()),
            "f16": pa.array(np.array([0.5, 1.5, 2.5], dtype=np.float16)),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float32)), 2),
            "ls": pa.array(["a", "b", "c"], pa.large_string()),
            "st": pa.array([{"a": i, "b": str(i)} for i in range(n)]),
            "tsn": pa.array([1_000_000_001, 2_000_000_000, None], pa.timestamp("ns")),
        }
    )
    lance.write_dataset(table, uri, enable_stable_row_ids=True)
    lance.dataset(uri).update({"u8": "u8 + 0"}, where="id = 0")  # v2: an update pair
    df = spark.read.format("lance-cdf").option("path", uri).option("startingVersion", 1).load()
    types = dict(df.dtypes)
    assert [types[c] for c in ("u8", "u64", "f16", "vec", "ls", "tsn")] == [
        "smallint",
        "bigint",
        "float",
        "array<float>",
        "string",
        "timestamp_ntz",
    ]
    got = {(r["_commit_version"], r["_change_type"], r["id"]): r for r in df.collect()}
    assert sorted(got) == [(1, "insert", 0), (1, "insert", 1), (1, "insert", 2)] + [
        (2, "update_postimage", 0),
        (2, "update_preimage", 0),
    ]
    last = got[(1, "insert", 2)]
    assert (last["u8"], last["u64"], last["f16"], last["vec"]) == (255, 2**63 - 1, 2.5, [4.0, 5.0])
    assert last["st"]["b"] == "2" and last["tsn"] is None
    assert got[(1, "insert", 0)]["tsn"] == dt.datetime(1970, 1, 1, 0, 0, 1)  # ns truncated


def test_batch_read_after_a_dropped_column(spark, tmp_path):
    uri = make(tmp_path)
    lance.dataset(uri).drop_columns(["x"])  # v2
    lance.dataset(uri).delete("id = 1")  # v3
    # With endingVersion (or startingVersion) the schema is read_changes' own: x included
    ranged = spark.read.format("lance-cdf").option("startingVersion", 1)
    assert rows(ranged.option("endingVersion", 3).load(uri)) == expected(uri, 1, 3)
    assert rows(ranged.load(uri)) == expected(uri, 1)
    # Neither: Spark fixes the schema before it says batch or stream, so it is the
    # table's current columns (documented)
    plain = spark.read.format("lance-cdf").load(uri)
    assert plain.schema.names == ["id", "s"] + COLUMNS[3:]
    assert rows(plain) == expected(uri, 1, drop=["x"])


def test_batch_read_of_a_rename_and_a_blob_column(spark, tmp_path):
    uri = str(tmp_path / "b.lance")
    blob = pa.field("img", pa.large_binary(), metadata={"lance-encoding:blob": "true"})
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string()), blob])
    data = pa.table({"id": [1, 2], "s": ["a", "b"], "img": [b"one", b"two"]}, schema=schema)
    lance.write_dataset(data, uri, enable_stable_row_ids=True)
    lance.dataset(uri).alter_columns({"path": "s", "name": "t"})  # v2
    lance.dataset(uri).update({"t": "'B'"}, where="id = 2")  # v3
    df = spark.read.format("lance-cdf").option("startingVersion", 1).load(uri)
    assert df.schema.names == ["id", "t", "img"] + COLUMNS[3:]
    got = sorted(
        (tuple(bytes(v) if isinstance(v, bytearray) else v for v in r) for r in df.collect()),
        key=repr,
    )
    assert got == expected(uri, 1)
    assert {r[2] for r in got} == {b"one", b"two"}  # bytes, not descriptors
    assert ("a" in {r[1] for r in got}) and None not in {r[1] for r in got}


def test_rename_mid_stream_stops_naming_it(spark, tmp_path):
    uri = make(tmp_path)
    q = stream(spark, uri).writeStream.format("memory").queryName("renamed")
    q = q.option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        q.processAllAvailable()
        lance.dataset(uri).delete("id = 0")  # v2
        lance.dataset(uri).alter_columns({"path": "s", "name": "t"})  # v3
        with pytest.raises(Exception, match=r"changed at version 3: renamed \['s -> t'\]"):
            q.processAllAvailable()
        assert rows(spark.table("renamed")) == expected(uri, 2, 2)
    finally:
        q.stop()


def test_large_commit_is_read_by_several_tasks(spark, tmp_path):
    uri = make(tmp_path, n=300)
    for i in range(3):
        lance.dataset(uri).delete(f"id = {i}")
    df = (
        spark.read.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 1)
        .option("rowsPerPartition", 50)
        .load()
    )
    assert df.rdd.getNumPartitions() == 7  # version 1 in 6 slices, 2..4 packed into one
    assert rows(df) == expected(uri, 1)


# -- streaming ----------------------------------------------------------------------


def test_stream_sees_commits_made_while_running(spark, tmp_path):
    uri = make(tmp_path)
    q = (
        stream(spark, uri)  # default: latest, only new commits
        .writeStream.format("memory")
        .queryName("live")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        q.processAllAvailable()
        assert spark.table("live").count() == 0
        churn(uri)  # versions 2..6
        q.processAllAvailable()
        by = counts_by_version(spark.table("live").collect())
        assert by[2] == {"insert": 5}  # append
        assert by[3] == {"update_preimage": 5, "update_postimage": 5}  # 1, 6, 11, 16, 1001
        assert by[4] == {"delete": 4}  # ids 3, 10, 17, 1004
        assert by[5] == {"update_preimage": 2, "update_postimage": 2, "insert": 1}  # merge
        assert 6 not in by and 7 not in by  # compaction (2 commits) moves rows, changes none
        churn(uri, 1)
        q.processAllAvailable()
        assert rows(spark.table("live")) == expected(uri, 2)
        end = json.loads(q.lastProgress["sources"][0]["endOffset"])
        assert end["version"] == lance.dataset(uri).version
        assert set(end) == {"version", "table", "from"}  # whose offset it is (identity.py)
    finally:
        q.stop()


def test_stop_and_restart_from_checkpoint_exactly_once(spark, tmp_path):
    uri = make(tmp_path)
    for seed in range(2):
        churn(uri, seed)  # versions 1..13 (a compaction is two commits)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    source = stream(spark, uri, startingVersion=1, maxVersionsPerTrigger=1)
    q = to_parquet(source, out, ck, processingTime="0 seconds")
    deadline = time.monotonic() + 120
    while commits_done(ck) < 2 and time.monotonic() < deadline and q.isActive:
        time.sleep(0.02)
    q.stop()  # mid-stream: one micro-batch per version
    assert 2 <= commits_done(ck) < lance.dataset(uri).version
    churn(uri, 2)
    again = stream(spark, uri, startingVersion=1, maxVersionsPerTrigger=4)
    to_parquet(again, out, ck).awaitTermination(120)
    churn(uri, 3)
    to_parquet(again, out, ck).awaitTermination(120)
    got = rows(spark.read.parquet(out).select(*COLUMNS))
    assert got == expected(uri, 1)  # no gap, no duplicate


def test_killed_driver_restarts_without_loss_or_duplicates(spark, tmp_path):
    uri = make(tmp_path)
    for seed in range(3):
        churn(uri, seed)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    script = textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        import lance_cdf.spark
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.sql.session.timeZone", "UTC").getOrCreate())
        lance_cdf.spark.register(spark)
        (spark.readStream.format("lance-cdf").option("path", {uri!r}).option("startingVersion", 1)
         .option("maxVersionsPerTrigger", 1).load()
         .writeStream.format("parquet").option("path", {out!r}).option("checkpointLocation", {ck!r})
         .trigger(processingTime="200 milliseconds").start().awaitTermination())
    """)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while commits_done(ck) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Python workers, mid-stream
        proc.wait()
    assert 3 <= commits_done(ck) < lance.dataset(uri).version  # really stopped part-way
    churn(uri, 3)
    to_parquet(stream(spark, uri, startingVersion=1), out, ck).awaitTermination(120)
    assert rows(spark.read.parquet(out).select(*COLUMNS)) == expected(uri, 1)


def versions_per_batch(spark, uri, tmp_path, name, during=None, **options):
    """The sorted _commit_version sets of the micro-batches of an AvailableNow run."""
    seen = []

    def collect(df, batch_id):
        seen.append(sorted({r[0] for r in df.select("_commit_version").collect()}))
        if during is not None and batch_id == 0:
            during()

    q = (
        stream(spark, uri, startingVersion=1, **options)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / f"ck-{name}"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)  # AvailableNow drains and stops by itself
    return [b for b in seen if b], q


def test_admission_control_and_available_now(spark, tmp_path):
    uri = make(tmp_path, n=10)  # v1: 10 inserts
    lance.dataset(uri).update({"s": "'u'"}, where="id < 3")  # v2: 6 events
    lance.dataset(uri).delete("id = 9")  # v3: 1
    lance.write_dataset(pa.table({"id": [50], "s": ["n"], "x": [1.0]}), uri, mode="append")  # v4
    lance.write_dataset(pa.table({"id": [51], "s": ["n"], "x": [1.0]}), uri, mode="append")  # v5
    by_versions, _ = versions_per_batch(spark, uri, tmp_path, "v", maxVersionsPerTrigger=2)
    assert by_versions == [[1, 2], [3, 4], [5]]
    # a version is never split; one larger than the limit is a micro-batch of its own
    by_rows, q = versions_per_batch(spark, uri, tmp_path, "r", maxRowsPerTrigger=7)
    assert by_rows == [[1], [2, 3], [4, 5]]
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [10, 7, 2]

    # AvailableNow stops at the version that was latest when it started
    def commit_more():
        lance.write_dataset(pa.table({"id": [52], "s": ["n"], "x": [1.0]}), uri, mode="append")

    late, _ = versions_per_batch(spark, uri, tmp_path, "late", during=commit_more)
    assert late == [[1, 2, 3, 4, 5]] and lance.dataset(uri).version == 6


def test_fail_on_data_loss(spark, tmp_path):
    uri = make(tmp_path)
    for i in range(4):
        lance.dataset(uri).delete(f"id = {i}")  # v2..v5
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=2)  # 4, 5
    lossy = stream(spark, uri, startingVersion=2)
    q = lossy.writeStream.format("memory").queryName("lossy")
    q = q.option("checkpointLocation", str(tmp_path / "ck1")).trigger(availableNow=True).start()
    with pytest.raises(Exception, match=r"version\(s\) 2..4 of .* can no longer be read"):
        q.awaitTermination(120)
    q = (
        stream(spark, uri, startingVersion=2, failOnDataLoss="false")
        .writeStream.format("memory")
        .queryName("skipped")
        .option("checkpointLocation", str(tmp_path / "ck2"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert rows(spark.table("skipped")) == expected(uri, 5)


def test_schema_change_mid_stream(spark, tmp_path):
    uri = make(tmp_path)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    q = to_parquet(stream(spark, uri), out, ck, processingTime="0 seconds")
    q.processAllAvailable()
    lance.dataset(uri).delete("id = 0")  # v2
    lance.dataset(uri).add_columns({"y": "id * 2"})  # v3
    with pytest.raises(Exception, match=r"changed at version 3: new column\(s\) \['y'\]"):
        q.processAllAvailable()
    q.stop()
    assert rows(spark.read.parquet(out).select(*COLUMNS)) == expected(uri, 2, 2)
    # a restart from the same checkpoint picks the new column up and goes on
    to_parquet(stream(spark, uri), out, ck).awaitTermination(120)
    got = spark.read.option("mergeSchema", "true").parquet(out)
    assert rows(got.select(*COLUMNS[:3], "y", *COLUMNS[3:])) == expected(uri, 2)
    # mergeSchema=true: a new column is left out (and logged) and the stream goes on
    q = stream(spark, uri, mergeSchema="true").writeStream.format("memory").queryName("merged")
    q = q.option("checkpointLocation", str(tmp_path / "ck2")).start()
    try:
        lance.dataset(uri).add_columns({"z": "id * 3"})  # v4
        lance.dataset(uri).delete("id = 5")  # v5
        q.processAllAvailable()
        got = spark.table("merged")
        assert "z" not in got.columns
        assert rows(got) == expected(uri, 4, drop=["z"])
        lance.dataset(uri).drop_columns(["s"])  # v6: a dropped column always stops
        with pytest.raises(Exception, match=r"changed at version 6: dropped \['s'\]"):
            q.processAllAvailable()
    finally:
        q.stop()


def test_schema_is_taken_at_load(spark, tmp_path):
    uri = make(tmp_path)
    changes = stream(spark, uri)  # schema and "latest" fixed here, at version 1
    lance.dataset(uri).add_columns({"y": "id * 2"})  # v2, before the query starts
    q = changes.writeStream.format("memory").queryName("at_load")
    q = q.option("checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(Exception, match=r"changed at version 2: new column\(s\) \['y'\]"):
        q.processAllAvailable()
    q.stop()


def test_clear_errors_at_load(spark, tmp_path):
    plain = str(tmp_path / "plain.lance")
    lance.write_dataset(pa.table({"id": [1]}), plain)
    with pytest.raises(Exception, match="without stable row IDs"):
        spark.readStream.format("lance-cdf").option("path", plain).load()
    with pytest.raises(Exception, match="no Lance table"):
        spark.read.format("lance-cdf").load(str(tmp_path / "missing.lance"))
    with pytest.raises(Exception, match='option "path" is required'):
        spark.read.format("lance-cdf").load()
    uri = make(tmp_path)
    with pytest.raises(Exception, match="maxRowsPerTrigger='many' is not a whole number"):
        spark.readStream.format("lance-cdf").option("maxRowsPerTrigger", "many").load(uri)
    with pytest.raises(Exception, match="unknown option"):
        spark.read.format("lance-cdf").option("startVersion", 1).load(uri)
    with pytest.raises(Exception, match="version 9 .* does not exist yet"):
        spark.read.format("lance-cdf").option("startingVersion", 9).load(uri)
    with pytest.raises(Exception, match=r"unknown column\(s\) \['nope'\]"):
        spark.read.format("lance-cdf").option("columns", "id,nope").load(uri)
    q = stream(spark, uri, endingVersion=1).writeStream.format("memory").queryName("e").start()
    with pytest.raises(Exception, match="endingVersion is for batch reads"):  # at query start
        q.awaitTermination(120)
