"""Driver-side logic of the lance-cdf Spark source, without a Spark session:
option checks, offsets, admission control, data-loss handling, partition plans,
type mapping."""

import logging
import pickle
from datetime import datetime, timedelta

import lance
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows
from pyspark.sql.types import ArrayType, FloatType, IntegerType, LongType, ShortType

import lance_cdf
from lance_cdf.errors import LanceCdfError, VersionNotFoundError
from lance_cdf.spark.source.options import SourceOptions
from lance_cdf.spark.source.readers import ChangeSlices, LanceCdfStreamReader
from lance_cdf.spark.source.resolution import earliest_readable, resolve, spans, unreadable
from lance_cdf.spark.source.slicing import pack
from lance_cdf.spark.source.types import arrow_target, spark_schema, to_spark

KEY = ["_commit_version", "_change_type", "_rowid"]


def make(tmp_path, n=10):
    uri = str(tmp_path / "t.lance")
    table = pa.table({"id": np.arange(n), "s": [f"s{i}" for i in range(n)]})
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=4)
    return uri


def stream_reader(uri, **options):
    resolved = resolve({"path": uri, **{k: str(v) for k, v in options.items()}}, streaming=True)
    return LanceCdfStreamReader(resolved, spark_schema(resolved.user_schema))


def test_options_are_checked():
    ok = SourceOptions.parse({"path": "/t", "maxRowsPerTrigger": "10", "storage.Key": "v"}, True)
    assert ok.starting == "latest" and ok.max_rows_per_trigger == 10
    assert ok.storage_options == {"Key": "v"}
    assert SourceOptions.parse({"path": "/t"}, streaming=False).starting == "earliest"
    bad = [
        ({}, 'option "path" is required'),
        ({"path": "/t", "startingVersion": "first"}, "startingVersion='first' is not a whole"),
        ({"path": "/t", "startingVersion": "0"}, "must be at least 1"),
        ({"path": "/t", "maxVersionsPerTrigger": "-1"}, "must be at least 1"),
        ({"path": "/t", "failOnDataLoss": "maybe"}, "must be true or false"),
        ({"path": "/t", "startingTimestamp": "yesterday"}, "not an ISO-8601 time"),
        ({"path": "/t", "startingVersion": "1", "startingTimestamp": "2026-01-01"}, "not both"),
        ({"path": "/t", "endingVersion": "3"}, "endingVersion is for batch reads"),
        ({"path": "/t", "columns": "a,b,a"}, r"names \['a'\] more than once"),
        ({"path": "/t", "maxRowPerTrigger": "3"}, r"unknown option\(s\) \['maxrowpertrigger'\]"),
    ]
    for raw, message in bad:
        with pytest.raises(LanceCdfError, match=message):
            SourceOptions.parse(raw, streaming=True)


def test_version_helpers():
    assert spans([2, 3, 4, 7, 9, 10]) == "2..4, 7, 9..10"
    assert unreadable([1, 2, 3], 1, 3) == []
    assert unreadable([2, 5, 6], 1, 6) == [1, 2, 3, 4, 5]
    assert unreadable([1, 2, 7, 8], 2, 8) == [3, 4, 5, 6, 7]
    assert earliest_readable([1, 2]) == 1
    assert earliest_readable([4, 5]) == 5
    assert earliest_readable([2, 5, 6]) == 6
    assert earliest_readable([7]) == 8


def test_pack_groups_small_versions_and_splits_big_ones():
    parts = pack([(1, 3), (2, 0), (3, 4), (4, 25), (5, 2), (6, 9)], rows_per_partition=10)
    assert [p.segments for p in parts] == [
        ((1, 0, 1), (2, 0, 1), (3, 0, 1)),
        ((4, 0, 3),),
        ((4, 1, 3),),
        ((4, 2, 3),),
        ((5, 0, 1),),
        ((6, 0, 1),),
    ]
    assert pickle.loads(pickle.dumps(parts[0])) == parts[0]
    assert isinstance(parts[0], ChangeSlices)


def test_start_positions(tmp_path):
    uri = make(tmp_path)
    lance.dataset(uri).delete("id = 1")  # v2
    lance.dataset(uri).delete("id = 2")  # v3
    assert stream_reader(uri).initialOffset()["version"] == 3  # latest: new commits only
    assert stream_reader(uri, startingVersion="earliest").initialOffset()["version"] == 0
    assert stream_reader(uri, startingVersion=2).initialOffset()["version"] == 1
    assert stream_reader(uri, startingVersion=4).initialOffset()["version"] == 3
    with pytest.raises(VersionNotFoundError, match="version 5 .* does not exist yet"):
        stream_reader(uri, startingVersion=5)
    ts = lance_cdf.ChangeFeed(uri).table.manifest(2).timestamp
    assert stream_reader(uri, startingTimestamp=ts.isoformat()).initialOffset()["version"] == 1
    later = (ts + timedelta(days=1)).isoformat()
    assert stream_reader(uri, startingTimestamp=later).initialOffset()["version"] == 3
    # a batch read of "latest" is the latest commit's changes
    assert resolve({"path": uri, "startingVersion": "latest"}, streaming=False).start == 3
    with pytest.raises(LanceCdfError, match="no version .* committed at or after"):
        resolve({"path": uri, "startingTimestamp": later}, streaming=False)


def test_admission_control_offsets(tmp_path):
    uri = make(tmp_path)  # v1: 10 inserts
    lance.dataset(uri).update({"s": "'u'"}, where="id < 3")  # v2: 6 events
    lance.dataset(uri).delete("id = 9")  # v3: 1
    reader = stream_reader(uri, startingVersion=1, maxRowsPerTrigger=7, maxVersionsPerTrigger=5)
    assert reader.getDefaultReadLimit() == ReadMaxRows(7)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadMaxRows(7))["version"] == 1  # 10 > 7: alone
    assert reader.latestOffset({"version": 1}, ReadMaxRows(7))["version"] == 3  # 6 + 1
    assert reader.latestOffset({"version": 1}, ReadMaxRows(6))["version"] == 2
    assert reader.latestOffset(start, ReadMaxFiles(2))["version"] == 2
    assert reader.latestOffset(start, ReadAllAvailable())["version"] == 3
    assert reader.latestOffset({"version": 3}, ReadAllAvailable())["version"] == 3
    # options combine: at most 2 versions and at most 100 rows
    both = stream_reader(uri, startingVersion=1, maxRowsPerTrigger=100, maxVersionsPerTrigger=2)
    assert both.latestOffset({"version": 0}, ReadMaxRows(100))["version"] == 2
    assert reader.reportLatestOffset()["version"] == 3
    # Trigger.AvailableNow: nothing after the version that was latest when it started
    reader.prepareForTriggerAvailableNow()
    lance.dataset(uri).delete("id = 8")  # v4
    assert reader.latestOffset({"version": 3}, ReadAllAvailable())["version"] == 3
    assert stream_reader(uri, startingVersion=1).getDefaultReadLimit() == ReadAllAvailable()


def test_partitions_split_a_big_commit_and_pack_small_ones(tmp_path):
    uri = make(tmp_path, n=25)
    for i in range(3):
        lance.dataset(uri).delete(f"id = {i}")
    reader = stream_reader(uri, startingVersion=1, rowsPerPartition=10)
    parts = reader.partitions({"version": 0}, {"version": 4})
    assert [p.segments for p in parts] == [
        ((1, 0, 3),),
        ((1, 1, 3),),
        ((1, 2, 3),),
        ((2, 0, 1), (3, 0, 1), (4, 0, 1)),
    ]
    assert reader.partitions({"version": 4}, {"version": 4}) == []
    # executors read only their slices; together they are the whole feed
    got = pa.Table.from_batches([b for p in parts for b in reader.read(p)])
    want = lance_cdf.read_changes(uri, 1, 4).read_all()

    def key(t):
        return sorted(zip(*(t[c].to_pylist() for c in KEY), strict=True))

    assert key(got) == key(want)
    assert reader.sizes  # cached on the driver, but not shipped to executors
    assert pickle.loads(pickle.dumps(reader)).sizes == {}
    reader.commit({"version": 4})
    assert reader.sizes == {}


def test_data_loss_fails_or_is_skipped_with_a_warning(tmp_path, caplog):
    uri = make(tmp_path)
    for i in range(7):
        lance.dataset(uri).delete(f"id = {i}")  # v2..v8
    ds = lance.dataset(uri)
    ds.tags.create("one", 1)
    ds.tags.create("two", 2)
    ds.cleanup_old_versions(
        older_than=timedelta(0), retain_versions=2, error_if_tagged_old_versions=False
    )
    assert [v["version"] for v in lance.dataset(uri).versions()] == [1, 2, 7, 8]
    strict = stream_reader(uri, startingVersion=1)
    assert strict.latestOffset({"version": 0}, ReadMaxFiles(2))["version"] == 2
    with pytest.raises(VersionNotFoundError, match=r"version\(s\) 3..7 of .* can no longer be"):
        strict.latestOffset({"version": 2}, ReadAllAvailable())
    with pytest.raises(VersionNotFoundError, match="failOnDataLoss=false"):
        strict.partitions({"version": 0}, {"version": 8})
    lenient = stream_reader(uri, startingVersion=1, failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="lance_cdf.spark.source"):
        assert lenient.latestOffset({"version": 2}, ReadMaxFiles(1))["version"] == 8
    assert "version(s) 3..7" in caplog.text and "Skipping them" in caplog.text
    parts = lenient.partitions({"version": 0}, {"version": 8})
    assert [s[0] for p in parts for s in p.segments] == [1, 2, 8]


def test_schema_changes_are_caught_before_they_are_read(tmp_path):
    uri = make(tmp_path)
    reader = stream_reader(uri)  # schema taken at version 1
    lance.dataset(uri).delete("id = 0")  # v2
    lance.dataset(uri).add_columns({"y": "id * 2"})  # v3
    # v2 is delivered first; the query stops at v3
    assert reader.latestOffset({"version": 1}, ReadAllAvailable())["version"] == 2
    with pytest.raises(LanceCdfError, match=r"changed at version 3: new column\(s\) \['y'\]"):
        reader.latestOffset({"version": 2}, ReadAllAvailable())
    merging = stream_reader(uri, startingVersion=2, mergeSchema="true")
    assert "y" in merging.reading.read_schema.names  # a restart picks the new column up
    lance.dataset(uri).add_columns({"z": "id * 3"})  # v4
    assert merging.latestOffset({"version": 3}, ReadAllAvailable())["version"] == 4
    assert "z" not in merging.reading.read_schema.names
    only_id = stream_reader(uri, columns="id")  # new columns do not matter to it
    lance.dataset(uri).add_columns({"w": "id * 4"})  # v5
    assert only_id.latestOffset({"version": 4}, ReadAllAvailable())["version"] == 5
    lance.dataset(uri).drop_columns(["s"])  # v6
    with pytest.raises(LanceCdfError, match=r"changed at version 6: dropped \['s'\]"):
        merging.latestOffset({"version": 5}, ReadAllAvailable())
    assert only_id.latestOffset({"version": 5}, ReadAllAvailable())["version"] == 6
    typed = stream_reader(uri)
    lance.dataset(uri).alter_columns({"path": "y", "data_type": pa.int32()})  # v7
    with pytest.raises(LanceCdfError, match=r"retyped \['y int64 -> int32'\]"):
        typed.latestOffset({"version": 6}, ReadAllAvailable())


def test_types_spark_cannot_hold_are_widened():
    schema = pa.schema(
        [
            ("u8", pa.uint8()),
            ("u32", pa.uint32()),
            ("u64", pa.uint64()),
            ("f16", pa.float16()),
            ("vec", pa.list_(pa.float16(), 4)),
            ("st", pa.struct([("a", pa.uint16())])),
            ("tsn", pa.timestamp("ns")),
            ("tsz", pa.timestamp("ms", tz="Europe/Paris")),
        ]
    )
    spark = spark_schema(schema)
    assert [f.dataType for f in spark.fields[:4]] == [
        ShortType(),
        LongType(),
        LongType(),
        FloatType(),
    ]
    assert spark["vec"].dataType == ArrayType(FloatType(), True)
    assert spark["st"].dataType.fields[0].dataType == IntegerType()
    assert spark["_rowid"].dataType == LongType() and not spark["_rowid"].nullable
    events = pa.schema(list(schema) + list(lance_cdf.core.events.META_FIELDS))
    row = {
        "u8": 200,
        "u32": 2**32 - 1,
        "u64": 2**63 - 1,
        "f16": 1.5,
        "vec": [1, 2, 3, 4],
        "st": {"a": 65535},
        "tsn": 1_000_000_001,  # sub-microsecond: truncated
        "tsz": 1_500,
        "_rowid": 7,
        "_change_type": "insert",
        "_commit_version": 1,
        "_commit_timestamp": 0,
    }
    batch = pa.RecordBatch.from_pylist([row], schema=events)
    out = to_spark(batch, arrow_target(spark))
    assert out.schema.equals(arrow_target(spark))
    got = out.to_pylist()[0]
    assert got["u64"] == 2**63 - 1 and got["vec"] == [1.0, 2.0, 3.0, 4.0]
    assert got["tsn"] == datetime(1970, 1, 1, 0, 0, 1)  # naive, microseconds
    assert got["tsz"].timestamp() == 1.5 and str(got["tsz"].tzinfo) == "UTC"
    too_big = pa.RecordBatch.from_pylist([dict(row, u64=2**63)], schema=events)
    with pytest.raises(LanceCdfError, match="column 'u64'"):
        to_spark(too_big, arrow_target(spark))
    with pytest.raises(LanceCdfError, match="column 'd' has type .* Spark cannot represent"):
        spark_schema(pa.schema([("d", pa.month_day_nano_interval())]))


# what Spark's driver-side source runner does with the instance load() pickled:
# streamReader() there, then the offsets of a new version; prints what it imported
_RUNNER = """
import sys
from pyspark import cloudpickle
from pyspark.sql.streaming.datasource import ReadAllAvailable
with open(sys.argv[1], "rb") as f:
    source, struct = cloudpickle.load(f)
reader = source.streamReader(struct)
latest = reader.latestOffset({"version": 1}, ReadAllAvailable())["version"]
print(latest, "lance" in sys.modules, "pandas" in sys.modules)
print(reader.reading.read_schema.to_string(show_schema_metadata=True))
"""


def test_the_source_runner_takes_the_schema_from_load_not_from_pylance(tmp_path):
    import subprocess
    import sys

    from pyspark import cloudpickle

    from lance_cdf.spark.source.data_source import LanceCdfDataSource

    def run(uri: str) -> tuple[list[str], str]:
        source = LanceCdfDataSource({"path": uri, "startingVersion": "1"})
        struct = source.schema()  # load(): in one of Spark's planner workers
        lance.dataset(uri).delete("id = 0")  # a new version, same schema
        blob = tmp_path / f"{uri.rsplit('/', 1)[-1]}.pickle"
        blob.write_bytes(cloudpickle.dumps((source, struct)))  # as Spark hands it on
        out = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(blob)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n", 1)
        return out[0].split(), out[1].strip()

    uri = make(tmp_path)
    # this process has pylance: its own reading of the schema
    oracle = stream_reader(uri, startingVersion=1).reading.read_schema
    (latest, lance_imported, pandas_imported), schema = run(uri)
    assert (latest, lance_imported, pandas_imported) == ("2", "False", "False")
    assert schema == oracle.to_string(show_schema_metadata=True)
    # an extension type (pylance's bfloat16) is only rebuilt where pylance is imported:
    # that schema is not handed on, the runner reads it with pylance
    from lance.arrow import bfloat16_array

    other = str(tmp_path / "bf16.lance")
    t = pa.table({"id": np.arange(4), "h": bfloat16_array([1.0, 2.0, 3.0, 4.0])})
    lance.write_dataset(t, other, enable_stable_row_ids=True)
    (latest, lance_imported, _), schema = run(other)
    assert (latest, lance_imported) == ("2", "True")
    assert "lance.bfloat16" in schema
