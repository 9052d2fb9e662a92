"""The topic's schema carries the table's types, not Spark's: through `lance-cdf
publish` (Spark widens uint32 to long, fixed-size lists to lists, fixed_size_binary to
binary) and `lance-cdf replicate`, the replica keeps the source's exact types."""

import json
import uuid

import lance
import numpy as np
import pyarrow as pa
from confluent_kafka.schema_registry import SchemaRegistryClient

from lance_cdf.kafka import sink as spark_sink

DIM = 768


def test_publish_then_replicate_keeps_the_tables_types(tmp_path, kafka_broker, schema_registry):
    """Through `lance-cdf publish` (Spark widens uint32 to long, fixed-size lists to
    lists, fixed_size_binary to binary) and `lance-cdf replicate`, the replica's schema
    equals the source's type for type: the sink takes the types from the table."""
    from lance_cdf.cli import main

    n = 20
    rng = np.random.default_rng(3)
    ids = np.arange(n)
    table = pa.table(
        {
            "id": ids,
            "s": [f"s{i}" for i in range(n)],
            "i8": pa.array(ids - 10, pa.int8()),
            "i16": pa.array(ids * -300, pa.int16()),
            "u8": pa.array(ids + 200, pa.uint8()),
            "u16": pa.array(ids + 65_000, pa.uint16()),
            "u32": pa.array(ids + 2**32 - n, pa.uint32()),
            "u64": pa.array(ids + 2**62, pa.uint64()),
            "h": pa.array(ids.astype(np.float16) / 4, pa.float16()),
            "fx": pa.array([i.to_bytes(16, "big") for i in range(n)], pa.binary(16)),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(n * DIM, dtype=np.float32)), DIM
            ),
            "tags": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.uint16())),
        }
    )
    uri = str(tmp_path / "types.lance")
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=8)
    lance.dataset(uri).update({"u32": "u32 - 1", "s": "'u'"}, where="id < 4")
    lance.dataset(uri).delete("id IN (5, 6)")
    topic = f"types-{uuid.uuid4().hex[:8]}"
    endpoint = ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic,
                "--schema-registry", schema_registry.url]  # fmt: skip
    assert main(["publish", "--table", uri, *endpoint, "--checkpoint", str(tmp_path / "ck"),
                 "--snapshot", "--available-now", "--table-name", "shop.types"]) == 0  # fmt: skip
    # the registered value schema is the table's, named as Debezium names it
    client = SchemaRegistryClient({"url": schema_registry.url})
    value = json.loads(client.get_latest_version(f"{topic}-value").schema.schema_str)
    assert value["namespace"] == "shop.types" and value["name"] == "Envelope"
    replica = str(tmp_path / "replica.lance")
    assert main(["replicate", *endpoint, "--target", replica, "--idle-timeout", "3"]) == 0
    source = lance.dataset(uri).schema
    got = lance.dataset(replica).schema
    assert [(f.name, f.type) for f in got if f.name != "_source_rowid"] == [
        (f.name, f.type) for f in source
    ]
    from test_replicate import assert_replica_equals_source

    assert_replica_equals_source(uri, replica)


def test_the_sink_restores_the_types_spark_widened(tmp_path):
    """Unit check of the sink's type restoration: Spark's forms of the columns (as
    streaming/types makes them) go back to the table's own types, values intact."""
    from lance_cdf.feed import ChangeFeed
    from lance_cdf.streaming.types import sparkable

    table = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "u32": pa.array([2**32 - 1, 0], pa.uint32()),
            "fx": pa.array([b"a" * 16, b"b" * 16], pa.binary(16)),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8, dtype=np.float32)), 4),
            "tags": pa.array([[1], []], pa.list_(pa.uint16())),
            "ts": pa.array([0, 1000], pa.timestamp("ns")),  # Spark's form is kept
        }
    )
    uri = str(tmp_path / "w.lance")
    lance.write_dataset(table, uri, enable_stable_row_ids=True)
    widened = pa.schema([f.with_type(sparkable(f.type)) for f in table.schema])
    widened = widened.set(5, widened.field("ts").with_type(pa.timestamp("us")))
    assert [f.type for f in widened] != [f.type for f in table.schema]
    exact = spark_sink.table_types(widened, ChangeFeed(uri), 1)
    assert [f.type for f in exact] == [*table.schema.types[:5], pa.timestamp("us")]
    events = pa.Table.from_arrays(
        [table[c].cast(widened.field(c).type) for c in table.column_names], schema=widened
    )
    restored = spark_sink.restore_types(events, exact)
    assert restored.select(table.column_names[:5]) == table.select(table.column_names[:5])
