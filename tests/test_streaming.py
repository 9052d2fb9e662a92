"""The lance-cdf Spark source on a real local Spark (local[2])."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf

KEY = ["_commit_version", "_change_type", "_rowid"]


def make(tmp_path, n=20, name="t.lance"):
    uri = str(tmp_path / name)
    table = pa.table(
        {"id": np.arange(n), "s": [f"s{i}" for i in range(n)], "x": np.arange(n) * 0.5}
    )
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=8)
    return uri


def expected(uri, start, end=None):
    t = lance_cdf.read_changes(uri, start, end).read_all()
    t = t.set_column(t.schema.get_field_index("_rowid"), "_rowid", t["_rowid"].cast(pa.int64()))
    # Spark hands timestamps back as naive datetimes in the session zone (UTC here)
    ts = t.schema.get_field_index("_commit_timestamp")
    t = t.set_column(ts, "_commit_timestamp", t["_commit_timestamp"].cast(pa.timestamp("us")))
    return sorted(tuple(r.values()) for r in t.to_pylist())


def rows(df):
    return sorted(tuple(r) for r in df.collect())


def churn(uri, rng_seed=0):
    """Commits of every kind: append, update, delete, merge_insert, compaction."""
    ds = lance.dataset(uri)
    base = int(ds.count_rows()) + 1000 * (rng_seed + 1)
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
    assert rows(df) == expected(uri, 2, 5)
    assert df.schema.names == [
        "id",
        "s",
        "x",
        "_rowid",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    ]
    one = spark.read.format("lance-cdf").option("columns", "s").load(uri)  # earliest by default
    assert one.schema.names[0] == "s" and one.count() == len(expected(uri, 1))
    ts = lance_cdf.ChangeFeed(uri).table.manifest(3).timestamp.isoformat()
    since = spark.read.format("lance-cdf").option("startingTimestamp", ts).load(uri)
    assert rows(since) == expected(uri, 3)


def test_large_commit_is_split_into_several_partitions(spark, tmp_path):
    uri = make(tmp_path, n=300)
    df = (
        spark.read.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 1)
        .option("endingVersion", 1)
        .option("rowsPerPartition", 50)
        .load()
    )
    assert df.rdd.getNumPartitions() == 6
    assert rows(df) == expected(uri, 1, 1)


def test_stream_sees_commits_made_while_running(spark, tmp_path):
    uri = make(tmp_path)
    ck = str(tmp_path / "ck")
    q = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .load()  # default: latest
        .writeStream.format("memory")
        .queryName("live")
        .option("checkpointLocation", ck)
        .start()
    )
    try:
        q.processAllAvailable()
        assert spark.table("live").count() == 0  # only new commits
        churn(uri)
        q.processAllAvailable()
        churn(uri, 1)
        q.processAllAvailable()
        assert rows(spark.table("live")) == expected(uri, 2)
    finally:
        q.stop()


def test_restart_from_checkpoint_exactly_once(spark, tmp_path):
    uri = make(tmp_path)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    drain_to_parquet(spark, uri, out, ck, maxVersionsPerTrigger=2)
    churn(uri)
    drain_to_parquet(spark, uri, out, ck, maxVersionsPerTrigger=2)
    churn(uri, 1)
    drain_to_parquet(spark, uri, out, ck, maxVersionsPerTrigger=2)
    got = rows(spark.read.parquet(out).select(*expected_columns()))
    assert got == expected(uri, 1)


def drain_to_parquet(spark, uri, out, ck, **options):
    """Run the stream from version 1 with Trigger.AvailableNow into a parquet sink."""
    reader = spark.readStream.format("lance-cdf").option("path", uri).option("startingVersion", 1)
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (
        reader.load().writeStream.format("parquet").option("path", out)
        .option("checkpointLocation", ck).trigger(availableNow=True).start()
    )  # fmt: skip
    q.awaitTermination(120)
    return q


def expected_columns():
    return ["id", "s", "x", "_rowid", "_change_type", "_commit_version", "_commit_timestamp"]


def test_killed_driver_restarts_without_loss_or_duplicates(spark, tmp_path):
    uri = make(tmp_path)
    for seed in range(3):
        churn(uri, seed)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    script = textwrap.dedent(f"""
        import os, sys
        from pyspark.sql import SparkSession
        import lance_cdf.streaming
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.sql.session.timeZone", "UTC").getOrCreate())
        lance_cdf.streaming.register(spark)
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
    commits = os.path.join(ck, "commits")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if os.path.isdir(commits) and len([n for n in os.listdir(commits) if n.isdigit()]) >= 3:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # driver and its Python workers, mid-stream
    proc.wait()
    done = len([n for n in os.listdir(commits) if n.isdigit()])
    assert 3 <= done < lance.dataset(uri).version  # it really was stopped part-way
    drain_to_parquet(spark, uri, out, ck)
    assert rows(spark.read.parquet(out).select(*expected_columns())) == expected(uri, 1)


def _batches(spark, uri, tmp_path, **options):
    seen = []

    def collect(df, batch_id):
        seen.append(sorted({r[0] for r in df.select("_commit_version").collect()}))

    reader = spark.readStream.format("lance-cdf").option("path", uri).option("startingVersion", 1)
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / f"ck-{len(options)}-{sorted(options)}"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    return [b for b in seen if b]


def test_admission_control(spark, tmp_path):
    uri = make(tmp_path, n=10)  # v1: 10 inserts
    lance.dataset(uri).update({"s": "'u'"}, where="id < 3")  # v2: 6 events
    lance.dataset(uri).delete("id = 9")  # v3: 1
    lance.write_dataset(pa.table({"id": [50], "s": ["n"], "x": [1.0]}), uri, mode="append")  # v4: 1
    lance.write_dataset(pa.table({"id": [51], "s": ["n"], "x": [1.0]}), uri, mode="append")  # v5: 1
    assert _batches(spark, uri, tmp_path, maxVersionsPerTrigger=2) == [[1, 2], [3, 4], [5]]
    # a version is never split; one larger than the limit is a batch of its own
    assert _batches(spark, uri, tmp_path, maxRowsPerTrigger=7) == [[1], [2, 3], [4, 5]]
    # AvailableNow drained everything above and stopped (awaitTermination returned)


def test_clear_errors_at_load(spark, tmp_path):
    plain = str(tmp_path / "plain.lance")
    lance.write_dataset(pa.table({"id": [1]}), plain)
    with pytest.raises(Exception, match="without stable row IDs"):
        spark.readStream.format("lance-cdf").option("path", plain).load()
    with pytest.raises(Exception, match="no Lance table"):
        spark.read.format("lance-cdf").load(str(tmp_path / "missing.lance"))
    uri = make(tmp_path)
    with pytest.raises(Exception, match="maxRowsPerTrigger='many' is not a whole number"):
        spark.readStream.format("lance-cdf").option("maxRowsPerTrigger", "many").load(uri)
    with pytest.raises(Exception, match="unknown option"):
        spark.read.format("lance-cdf").option("startVersion", 1).load(uri)
    with pytest.raises(Exception, match="does not exist yet"):
        spark.read.format("lance-cdf").option("startingVersion", 9).load(uri)


def test_fail_on_data_loss(spark, tmp_path):
    uri = make(tmp_path)
    for i in range(4):
        lance.dataset(uri).delete(f"id = {i}")
    lance.dataset(uri).cleanup_old_versions(
        older_than=timedelta(0), retain_versions=2
    )  # keeps 4, 5
    stream = spark.readStream.format("lance-cdf").option("path", uri).option("startingVersion", 2)
    q = (
        stream.load()
        .writeStream.format("memory")
        .queryName("lossy")
        .option("checkpointLocation", str(tmp_path / "ck1"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"versions 2..4 of .* were cleaned up"):
        q.awaitTermination(120)
    q = (
        stream.option("failOnDataLoss", "false")
        .load()
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
    ck = str(tmp_path / "ck")
    q = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .load()
        .writeStream.format("memory")
        .queryName("evolving")
        .option("checkpointLocation", ck)
        .start()
    )
    q.processAllAvailable()
    lance.dataset(uri).add_columns({"y": "id * 2"})
    with pytest.raises(Exception, match=r"new column\(s\) \['y'\]"):
        q.processAllAvailable()
    q.stop()
    merged = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 2)
        .option("mergeSchema", "true")
        .load()
    )
    assert "y" in merged.schema.names  # a restart picks up the new column
    shutil.rmtree(ck)
