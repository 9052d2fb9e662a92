"""Work items (option writerSlots) are data: no option of the source, no secret, in the
rows; the lance-cdf-kafka sink takes the table's location and storage options from its
own options, and refuses any `_work` value that is not exactly a lance-cdf work item
without running anything in it."""

import contextlib
import os
import pickle
import re
import uuid
from collections import Counter
from dataclasses import replace

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql.streaming.datasource import ReadAllAvailable

import lance_cdf
import lance_cdf.spark
from lance_cdf.errors import WorkItemError
from lance_cdf.spark.sink import kafka_sink as spark_sink
from lance_cdf.spark.source.data_source import LanceCdfDataSource
from lance_cdf.spark.source.handoff import WorkItem, work_struct
from lance_cdf.spark.source.partitions import ChangeSlices, NetSlice, SnapshotSlice
from tests.kafka.test_kafka_order import consume_by_key

FIX = 'write only the stream of readStream.format("lance-cdf") with option writerSlots'


class Touch:
    """A pickle that creates `path` when it is unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def churn(uri, so=None):
    """Version 1: 60 rows; 2: an update of 10; 3: a delete of 5."""
    lance.write_dataset(
        pa.table({"id": np.arange(60), "s": [f"a{i}" for i in range(60)]}),
        uri,
        enable_stable_row_ids=True,
        max_rows_per_file=17,
        storage_options=so,
    )
    lance.dataset(uri, storage_options=so).update({"s": "'u'"}, where="id < 10")
    lance.dataset(uri, storage_options=so).delete("id >= 55")


def work_rows(uri, **options) -> list[pa.RecordBatch]:
    """The work-item rows of one micro-batch of everything from version 1, as the source's
    reader writes them (the driver's and the executors' steps, in this process)."""
    source = LanceCdfDataSource(
        {
            "path": uri,
            "startingVersion": "1",
            "keyHash": "id",
            "writerSlots": "2",
            "kafkaPartitions": "4",
            "rowsPerPartition": "7",
            **options,
        }
    )
    reader = source.streamReader(source.schema())
    start = reader.initialOffset()
    shares = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    return [batch for share in shares for batch in reader.read(share)]


def test_a_work_item_reads_back_as_written_and_nothing_else(tmp_path):
    uri = str(tmp_path / "t.lance")
    churn(uri)
    (row, *_) = work_rows(uri)
    item = WorkItem.of(*(row.column(i)[0].as_py() for i in range(4)))
    assert item.to_batch().equals(row)
    assert (item.slot, item.slots, item.kafka_partitions, item.key_hash) == (0, 2, 4, ("id",))
    assert item.planned == 60 + 2 * 10 + 5 and len(item.parts) > 4
    assert item.read_schema.names == ["id", "s"]
    every = (
        ChangeSlices(((3, 0, 1), (4, 1, 2))),
        SnapshotSlice(5, 2, 10, 7),
        NetSlice((2, 3), 1, 3),
    )
    again = replace(item, parts=every).to_batch()
    assert WorkItem.of(*(again.column(i)[0].as_py() for i in range(4))).parts == every

    good, schema = row.column("_work")[0].as_py(), row.column("_read_schema")[0].as_py()
    bad_documents = [
        pickle.dumps(Touch(str(tmp_path / "touched")), protocol=0).decode(),  # text pickle
        "",
        "null",
        "[]",
        "{}",
        '"work"',
        good.replace('"slots":2', '"slots":0'),
        good.replace('"slots":2', '"slots":2.0'),
        good.replace('"format":1', '"format":true'),
        good.replace('"keyHash":["id"]', '"keyHash":["nope"]'),
        good.replace('"keyHash":["id"]', '"keyHash":[]'),
        good.replace('"failOnDataLoss":true', '"failOnDataLoss":"true"'),
        good.replace('"kind":"changes"', '"kind":"code"', 1),
        good.replace('"segments":[[1,0,', '"segments":[[1,9,', 1),
        good.replace('"segments":[[1,0,', '"segments":[[1,0,1,', 1),
        good[:-1] + ',"path":"/elsewhere"}',
    ]
    for document in bad_documents:
        with pytest.raises(WorkItemError, match="no lance-cdf work item") as refused:
            WorkItem.of(0, 80, document, schema)
        assert FIX in str(refused.value) and "\n" not in str(refused.value)
    for slot, planned, s in [(2, 0, schema), (-1, 0, schema), (0, 0, b"\x00" * 16), (0, 0, None)]:
        with pytest.raises(WorkItemError, match=re.escape(FIX)):
            WorkItem.of(slot, planned, good, s)
    with pytest.raises(WorkItemError, match="format 2; this lance-cdf reads format 1"):
        WorkItem.of(0, 0, good.replace('"format":1', '"format":2'), schema)
    assert not (tmp_path / "touched").exists()


def test_work_items_of_another_table_are_refused(tmp_path):
    """The sink reads events from its own `table` option: work items whose stream read
    another table are refused (a digest of the path, not the path, is in the row)."""
    from lance_cdf.spark.source.readers import work_reading

    uri = str(tmp_path / "t.lance")
    churn(uri)
    (row, *_) = work_rows(uri)
    item = WorkItem.of(*(row.column(i)[0].as_py() for i in range(4)))
    assert uri not in row.column("_work")[0].as_py()
    assert work_reading(item, uri + "/", {}).read_schema == item.read_schema
    with pytest.raises(WorkItemError, match="another table's stream"):
        work_reading(item, str(tmp_path / "other.lance"), {})


def test_the_sink_writer_refuses_foreign_work_values_and_runs_none(tmp_path):
    """Straight to the sink's writer (as a Spark task calls it): a text pickle in a string
    `_work` column, a binary one; neither is run (no file appears), nothing is read."""
    touched = tmp_path / "touched"
    options = {
        "kafka.bootstrap.servers": "127.0.0.1:1",
        "topic": "t",
        "schema.registry.url": "http://127.0.0.1:1",
        "table": str(tmp_path / "none"),
    }
    sink = spark_sink.LanceCdfKafkaSink(options)
    text = pickle.dumps(Touch(str(touched)), protocol=0).decode()
    row = pa.RecordBatch.from_pylist(
        [{"_writer_slot": 0, "_events": 1, "_work": text, "_read_schema": b"x"}],
        schema=pa.schema(
            [
                ("_writer_slot", pa.int32()),
                ("_events", pa.int64()),
                ("_work", pa.string()),
                ("_read_schema", pa.binary()),
            ]
        ),
    )
    writer = sink.streamWriter(work_struct(), False)
    with pytest.raises(WorkItemError, match=re.escape(FIX)):
        writer.write(iter([row]))
    binary = pa.RecordBatch.from_pylist(
        [{"_writer_slot": 0, "_events": 1, "_work": pickle.dumps(Touch(str(touched)))}]
    )
    with pytest.raises(WorkItemError, match=re.escape(FIX)):
        writer.write(iter([binary]))
    assert not touched.exists()


def test_work_rows_hold_no_storage_option_and_the_sink_reads_with_its_own(
    spark, tmp_path, s3_server, s3_uri, kafka_broker, schema_registry
):
    """A table on S3 whose storage options carry a planted secret: no cell of the work
    rows (collected through a memory sink) holds it or any other storage option value;
    the sink, given the storage options as its own options, publishes every event."""
    secret = f"planted-{uuid.uuid4().hex}"
    so = {**s3_server.storage_options(), "aws_secret_access_key": secret}
    churn(s3_uri, so)
    storage = {f"storage.{k}": v for k, v in so.items()}

    def stream():
        reader = spark.readStream.format("lance-cdf").option("path", s3_uri)
        options = {
            "startingVersion": 1,
            "keyHash": "id",
            "writerSlots": 2,
            "kafkaPartitions": 4,
            "rowsPerPartition": 7,
            **storage,
        }
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    q = (
        stream()
        .writeStream.format("memory")
        .queryName("work_on_s3")
        .option("checkpointLocation", str(tmp_path / "ck-memory"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None
    rows = spark.sql("SELECT * FROM work_on_s3").collect()
    assert sorted(r["_writer_slot"] for r in rows) == [0, 1]
    cells = [bytes(v) if isinstance(v, bytearray) else str(v).encode() for r in rows for v in r]
    values = {v for k, v in so.items() if k != "allow_http"}  # ("true" is in the JSON)
    assert secret in values
    for value in values:
        assert not any(value.encode() in cell for cell in cells), value

    topic = f"work-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    lance_cdf.spark.register(spark)
    writer = stream().writeStream.format("lance-cdf-kafka")
    sink = {
        "kafka.bootstrap.servers": kafka_broker.bootstrap_servers,
        "topic": topic,
        "schema.registry.url": schema_registry.url,
        "table": s3_uri,
        "key": "id",
        "checkpointLocation": str(tmp_path / "ck-kafka"),
        **storage,
    }
    q = writer.options(**sink).trigger(availableNow=True).start()
    q.awaitTermination(300)
    assert q.exception() is None
    events = lance_cdf.read_changes(s3_uri, 1, storage_options=so).read_all().to_pylist()
    want = Counter(
        (
            e["id"],
            {"insert": "c", "update_postimage": "u", "delete": "d"}[e["_change_type"]],
            e["_commit_version"],
        )
        for e in events
        if e["_change_type"] != "update_preimage"
    )
    count = sum(want.values()) + sum(n for (_, op, _), n in want.items() if op == "d")
    got, _ = consume_by_key(kafka_broker.bootstrap_servers, topic, schema_registry.url, count)
    published = Counter(
        (key, op, version)
        for key, records in got.items()
        for op, version, _ in records
        if op is not None
    )
    assert published == want


def test_a_foreign_work_column_fails_the_query_before_anything_runs(
    spark, tmp_path, kafka_broker, schema_registry
):
    """A stream of someone else's `_work` column (here a pickle that would create a file)
    written to the sink: the query fails with WorkItemError, the file never appears."""
    touched = tmp_path / "touched"
    lance_cdf.spark.register(spark)
    sink = {
        "kafka.bootstrap.servers": kafka_broker.bootstrap_servers,
        "topic": "unused",
        "schema.registry.url": schema_registry.url,
        "table": str(tmp_path / "none"),
    }
    binary = pa.table(
        {
            "_writer_slot": pa.array([0], pa.int32()),
            "_events": [1],
            "_work": [pickle.dumps(Touch(str(touched)))],
        }
    )
    schema = pa.schema([("id", pa.int64())]).serialize().to_pybytes()
    text = pa.table(
        {
            "_writer_slot": pa.array([0], pa.int32()),
            "_events": [1],
            "_work": [pickle.dumps(Touch(str(touched)), protocol=0).decode()],
            "_read_schema": [schema],
        }
    )
    for name, table in {"binary": binary, "text": text}.items():
        folder = tmp_path / name
        os.makedirs(folder)
        pq.write_table(table, folder / "part-0.parquet")
        columns = spark.read.parquet(str(folder)).schema
        stream = spark.readStream.schema(columns).parquet(str(folder))
        q = (
            stream.writeStream.format("lance-cdf-kafka")
            .options(**sink)
            .option("checkpointLocation", str(tmp_path / f"ck-{name}"))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(Exception):  # Spark's StreamingQueryException
            q.awaitTermination(300)
        error = str(q.exception())
        assert "WorkItemError" in error and FIX in error, (name, error)
    assert not touched.exists()
