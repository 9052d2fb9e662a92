"""Arrow → Avro mapping and change records, checked with fastavro round trips."""

import datetime as dt
import decimal
import io

import fastavro
import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.avro.schema import (
    TableName,
    arrow_type,
    change_records,
    envelope_schema,
    key_schema,
    row_arrow_schema,
    row_schema,
)
from lance_cdf.errors import LanceCdfError

ALL_TYPES = pa.table(
    {
        "i8": pa.array([1, None], pa.int8()),
        "i64": pa.array([2**40, -1], pa.int64()),
        "u32": pa.array([2**31 + 5, 0], pa.uint32()),
        "f32": pa.array([1.5, None], pa.float32()),
        "f64": pa.array([2.25, 0.0], pa.float64()),
        "b": pa.array([True, False]),
        "s": pa.array(["x", None]),
        "bin": pa.array([b"\x00\x01", b""], pa.binary()),
        "fixed": pa.array([b"ab", b"cd"], pa.binary(2)),
        "dec": pa.array([decimal.Decimal("1.23"), None], pa.decimal128(5, 2)),
        "d": pa.array([dt.date(2026, 1, 2), None], pa.date32()),
        "ts": pa.array(
            [dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC), None], pa.timestamp("us", tz="UTC")
        ),
        "lts": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5), None], pa.timestamp("ms")),
        "lst": pa.array([[1, 2], None], pa.list_(pa.int32())),
        "vec": pa.FixedSizeListArray.from_arrays(
            pa.array(np.arange(1536, dtype=np.float32) / 7), 768
        ),
        "st": pa.array(
            [{"a": 1, "b": "q"}, None], pa.struct([("a", pa.int64()), ("b", pa.string())])
        ),
        "m": pa.array([[("k", 1.0)], None], pa.map_(pa.string(), pa.float64())),
        "mi": pa.array([[(7, "v")], []], pa.map_(pa.int32(), pa.string())),
    }
)


def roundtrip(schema, record):
    parsed = fastavro.parse_schema(schema)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    buf.seek(0)
    return fastavro.schemaless_reader(buf, parsed)


def test_every_type_maps_and_round_trips():
    schema = row_schema(ALL_TYPES.schema, "t")
    by_name = {f["name"]: f["type"] for f in schema["fields"]}
    assert by_name["vec"] == [
        "null",
        {"type": "array", "items": ["null", "float"], "arrow.fixedSize": 768},
    ]
    assert by_name["dec"][1] == {
        "type": "bytes",
        "logicalType": "decimal",
        "precision": 5,
        "scale": 2,
    }
    assert by_name["ts"][1]["logicalType"] == "timestamp-micros"
    assert by_name["lts"][1]["logicalType"] == "local-timestamp-micros"
    assert by_name["m"][1]["type"] == "map" and by_name["mi"][1]["type"] == "array"
    events = ALL_TYPES.append_column("_rowid", pa.array([0, 1], pa.uint64()))
    events = events.append_column("_change_type", pa.array(["insert", "insert"]))
    events = events.append_column("_commit_version", pa.array([1, 1], pa.int64()))
    events = events.append_column(
        "_commit_timestamp", pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * 2)
    )
    records = change_records(events, ALL_TYPES.schema.names, {1: "Append"}, "t", None, "0.1", 5)
    value_schema = envelope_schema(ALL_TYPES.schema, "t")
    for (key, value, _), original in zip(records, ALL_TYPES.to_pylist(), strict=True):
        back = roundtrip(value_schema, value)
        assert back["op"] == "c" and back["before"] is None
        assert back["after"]["vec"] == pytest.approx(original["vec"])
        assert back["after"]["dec"] == original["dec"] and back["after"]["ts"] == original["ts"]
        assert back["after"]["st"] == original["st"] and back["after"]["lst"] == original["lst"]
        assert roundtrip(key_schema(ALL_TYPES.schema, None, "t"), key) == key
    # 768-d float32 vectors survive exactly (float32 values are exact in Avro float)
    assert roundtrip(value_schema, records[0][1])["after"]["vec"] == ALL_TYPES["vec"][0].as_py()


def test_records_from_a_real_change_feed(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2], "s": ["a", "b"]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).update({"s": "'z'"}, where="id = 1")
    lance.dataset(uri).delete("id = 2")
    events = lance_cdf.read_changes(uri, 1).read_all()
    ops = {1: "Overwrite", 2: "Update", 3: "Delete"}
    records = change_records(events, ["id", "s"], ops, "t", ["id"], "0.1", 9)
    assert [(v["op"], v["source"]["commit_version"]) for _, v, _ in records] == [
        ("c", 1),
        ("c", 1),
        ("u", 2),
        ("d", 3),
    ]
    _, update, _ = records[2]
    assert update["before"] == {"id": 1, "s": "a"} and update["after"] == {"id": 1, "s": "z"}
    key, delete, meta = records[3]
    assert key == {"id": 2} and delete["before"] == {"id": 2, "s": "b"} and meta["tombstone"]
    assert update["source"]["operation"] == "Update"
    schema = envelope_schema(events.select(["id", "s"]).schema, "t")
    for _, value, _ in records:
        assert roundtrip(schema, value)["op"] == value["op"]


def test_unmappable_type_and_bad_key_are_clear_errors():
    with pytest.raises(LanceCdfError, match="cannot map to Avro"):
        row_schema(pa.schema([("u", pa.dense_union([]))]), "t")
    with pytest.raises(LanceCdfError, match="key column"):
        key_schema(pa.schema([("a", pa.int64())]), ["b"], "t")


def test_records_are_named_as_debezium_names_them():
    """Debezium recognises a change event by a value schema named `*.Envelope`
    (io.debezium.data.Envelope.isEnvelopeSchema); rows are `*.Value`, keys `*.Key`."""
    schema = pa.schema([("id", pa.int64()), ("Value", pa.struct([("Key", pa.int32())]))])
    for name, uri, full, table in [
        (None, "/data/my-items.lance", "lancecdf.my_items", "my_items"),
        (None, "s3://bucket/x/9lives.lance/", "lancecdf._9lives", "_9lives"),
        ("shop.items", "/d/t.lance", "shop.items", "items"),
        ("a.b.c", "/d/t.lance", "a.b.c", "c"),
        ("orders", "", "lancecdf.orders", "orders"),
        ("/old/callers/pass/the/uri.lance", "", "lancecdf.uri", "uri"),
    ]:
        t = TableName.of(name, uri)
        assert (t.namespace, t.table) == (full, table)
        env = envelope_schema(schema, t)
        parsed = fastavro.parse_schema(env)  # a valid Avro schema (names, namespaces)
        assert parsed["name"] == f"{full}.Envelope"
        before = next(f for f in env["fields"] if f["name"] == "before")["type"][1]
        assert f"{before['namespace']}.{before['name']}" == f"{full}.Value"
        # a struct column called Value does not take the row's name
        struct = next(f for f in before["fields"] if f["name"] == "Value")["type"][1]
        assert struct["name"] not in ("Value", "Key", "Envelope")
        for key_cols in (None, ["id"]):
            key = fastavro.parse_schema(key_schema(schema, key_cols, t))
            assert key["name"] == f"{full}.Key"
    with pytest.raises(LanceCdfError, match="--table-name"):
        TableName.of("shop.9items")
    with pytest.raises(LanceCdfError, match="dotted Avro name"):
        TableName.of("shop..items")


def test_source_carries_debeziums_common_fields(tmp_path):
    uri = str(tmp_path / "items.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).delete("id = 2")
    events = lance_cdf.read_changes(uri, 1).read_all()
    snap = lance_cdf.read_changes(uri, 2, snapshot=True).read_all()
    name = TableName.of("shop.items", uri)
    schema = envelope_schema(pa.schema([("id", pa.int64())]), name)
    ops = {1: "Overwrite", 2: "Delete"}
    for table, want in ((events, ["false", "false", "false"]), (snap, ["true"])):
        records = change_records(table, ["id"], ops, name, None, "0.9", 7)
        sources = [roundtrip(schema, v)["source"] for _, v, _ in records]
        assert [s["snapshot"] for s in sources] == want
        for s in sources:
            ts = s["commit_timestamp"]
            assert (s["version"], s["connector"], s["name"], s["db"], s["table"]) == (
                "0.9",
                "lance-cdf",
                "shop",
                uri,
                "items",
            )
            # ts_ms: the commit time in ms, as Debezium's source.ts_ms (when the change was made)
            assert s["ts_ms"] == round(ts.timestamp() * 1000)
            expect = lance.dataset(uri).versions()[s["commit_version"] - 1]["timestamp"]
            assert abs(s["ts_ms"] - expect.timestamp() * 1000) < 1000


@pytest.mark.parametrize(
    "t",
    [
        pa.int8(),
        pa.int16(),
        pa.uint8(),
        pa.uint16(),
        pa.uint32(),
        pa.uint64(),
        pa.float16(),
        pa.binary(16),
        pa.list_(pa.float32(), 768),
        pa.list_(pa.uint16()),
        pa.struct([("u", pa.uint32()), ("v", pa.list_(pa.int8(), 3))]),
    ],
)
def test_exact_arrow_types_survive_the_avro_schema(t):
    """The Avro schema carries the table's own type: back through `arrow_type` (what
    the replicator builds its replica from) comes the same Arrow type."""
    schema = pa.schema([pa.field("c", t, nullable=False)])
    assert row_arrow_schema(envelope_schema(schema, "t")) == schema
    assert arrow_type(row_schema(schema, "t")["fields"][0]["type"]) == (t, False)


def test_writer_schemas_load_each_id_once_and_read_the_wire_format():
    """avro/wire.py's WriterSchemas (the replicator's and the transaction topic's
    decoders): a schema id's writer schema loaded and parsed once, records read with it."""
    from lance_cdf.avro.wire import WriterSchemas, header

    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    loads: list[int] = []

    def load(schema_id: int) -> dict:
        loads.append(schema_id)
        return schema

    schemas = WriterSchemas(load)
    parsed = fastavro.parse_schema(schema)
    for value in (1, 2):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, {"a": value})
        assert schemas.read(header(7) + body.getvalue()) == (7, {"a": value})
    assert loads == [7]
    with pytest.raises(ValueError, match="wire format"):
        schemas.read(b"\x01junk")


def test_the_transaction_schemas_are_the_files_and_register_as_before():
    """schemas/transaction_key.avsc and transaction.avsc, loaded in their keys' order: the
    text WireWriter registers (json.dumps) is the one earlier builds registered, so the
    registry keeps the subject's schema and id (a reordered key would register a new one)."""
    import hashlib
    import json

    from lance_cdf.avro.avsc import load_avsc
    from lance_cdf.kafka.transactions import KEY_SCHEMA, VALUE_SCHEMA

    assert KEY_SCHEMA == load_avsc("transaction_key")
    assert VALUE_SCHEMA == load_avsc("transaction")
    registered = {
        "eaef26eaa0fda404921cad84fc947704c91bbd0a45c1bd994e8796ea893fb64c": KEY_SCHEMA,
        "6fec0ffaf07cf5988b701ed44e6cfa118cba5b67e2ecef38c4392be6fd90eef5": VALUE_SCHEMA,
    }
    for digest, schema in registered.items():
        assert hashlib.sha256(json.dumps(schema).encode()).hexdigest() == digest
    fastavro.parse_schema(VALUE_SCHEMA)  # a valid schema
