"""The lance-cdf Spark source with the table on the local S3-compatible server: the
`storage.<key>` options reach the driver and the Python workers, and the stream equals
read_changes of the same table."""

import lance
import numpy as np
import pyarrow as pa

import lance_cdf


def write_table(uri, so, n=40):
    table = pa.table({"id": np.arange(n), "s": [f"s{i}" for i in range(n)]})
    lance.write_dataset(
        table, uri, enable_stable_row_ids=True, max_rows_per_file=8, storage_options=so
    )


def churn(uri, so, base=1000):
    """An append, an update, a delete and an upsert: four commits."""
    lance.write_dataset(
        pa.table({"id": np.arange(base, base + 5), "s": ["a"] * 5}),
        uri,
        mode="append",
        storage_options=so,
    )
    ds = lance.dataset(uri, storage_options=so)
    ds.update({"s": "'upd'"}, where="id % 5 = 1")
    ds = lance.dataset(uri, storage_options=so)
    ds.delete("id % 7 = 3")
    src = pa.table({"id": np.array([2, 4, base + 100]), "s": ["m"] * 3})
    ds = lance.dataset(uri, storage_options=so)
    ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)


def expected_rows(uri, so, start=1):
    t = lance_cdf.read_changes(uri, start, storage_options=so).read_all()
    t = t.drop_columns(["_commit_timestamp"])
    return sorted(
        (r["_commit_version"], r["_change_type"], r["_rowid"], r["id"], r["s"])
        for r in t.to_pylist()
    )


def spark_rows(collected):
    return sorted(
        (r["_commit_version"], r["_change_type"], r["_rowid"], r["id"], r["s"]) for r in collected
    )


def cdf_stream(spark, uri, so, **options):
    reader = spark.readStream.format("lance-cdf").option("path", uri)
    for k, v in {**{f"storage.{k}": v for k, v in so.items()}, **options}.items():
        reader = reader.option(k, v)
    return reader.load()


def test_stream_from_a_table_on_object_storage(spark, tmp_path, s3_server, s3_uri):
    so = s3_server.storage_options()
    write_table(s3_uri, so)
    df = cdf_stream(spark, s3_uri, so, startingVersion=1, rowsPerPartition=10)
    q = (
        df.writeStream.format("memory")
        .queryName("cdf_on_s3")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        q.processAllAvailable()
        assert spark.table("cdf_on_s3").count() == 40
        churn(s3_uri, so)
        q.processAllAvailable()
        got = spark_rows(spark.table("cdf_on_s3").collect())
    finally:
        q.stop()
    assert got == expected_rows(s3_uri, so)
    assert {v for v, *_ in got} == {1, 2, 3, 4, 5}
