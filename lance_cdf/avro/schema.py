"""Arrow schemas and change events → Avro schemas and Debezium-style records.

Records are named as Debezium names them, so Debezium's tooling (the JDBC sink,
`ExtractNewRecordState`) recognises them as change events: for the logical table
name `<prefix>.<table>` (`TableName`; default `lancecdf.<directory name>`) the
value is `<prefix>.<table>.Envelope`, its `before`/`after` row `<prefix>.<table>.Value`
and a key `<prefix>.<table>.Key`. `source` carries Debezium's common fields
(`version`, `connector`, `name`, `ts_ms`, `snapshot`, `db`, `table`) and lance-cdf's
own (`commit_version`, `commit_timestamp`, `operation`, `rowid`).

Type mapping (nullable Arrow fields become a union with null):

| Arrow | Avro |
|---|---|
| int8, int16, int32, uint8, uint16 | int |
| int64, uint32, uint64 | long |
| float16, float32 | float |
| float64 | double |
| bool | boolean |
| string, large_string | string |
| binary, large_binary | bytes |
| fixed_size_binary[n] | fixed (size n) |
| decimal128(p, s) | bytes, logicalType decimal (precision p, scale s) |
| date32, date64 | int, logicalType date |
| timestamp(unit, tz) | long, timestamp-micros (with a zone) / local-timestamp-micros (without) |
| time32, time64 | long, time-micros |
| list, large_list | array of the item type |
| fixed_size_list[n] (embedding vectors) | array of the item type, with `"arrow.fixedSize": n` |
| struct | record |
| map<string, v> | map of v; map<other, v> | array of {key, value} records |

int8, int16, the unsigned integers and float16 carry their Arrow type in an extra
attribute, e.g. `{"type": "long", "arrow.type": "uint32"}` (Avro readers ignore it; the
replicator and `arrow_type` restore the exact type from it, as from `arrow.fixedSize`).
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pyarrow as pa
import pyarrow.types as pat

from lance_cdf.avro.avsc import load_avsc
from lance_cdf.avro.names import Namer, TableName, avro_name
from lance_cdf.core.change_types import ChangeType
from lance_cdf.errors import LanceCdfError

# Avro schemas and records are JSON-like documents handed to and taken from fastavro and
# json, whose values are of any JSON / Avro type: Any there, as in fastavro's own types
# (fastavro.types.DictSchema, Schema, AvroMessage)
AvroSchema = dict[str, Any]  # a named type, a field, an envelope
AvroType = str | list[Any] | AvroSchema  # a field's type: a name, a union or a schema
AvroRecord = dict[str, Any]  # a record's values by field name

# Extra attribute on an Avro array that came from fixed_size_list<T>[n] (Avro ignores it).
FIXED_SIZE = "arrow.fixedSize"
# Extra attribute on an int/long/float that came from a narrower or unsigned Arrow type.
ARROW_TYPE = "arrow.type"
_TAGGED = {
    str(t): t
    for t in (
        pa.int8(),
        pa.int16(),
        pa.uint8(),
        pa.uint16(),
        pa.uint32(),
        pa.uint64(),
        pa.float16(),
    )
}
OPS = {
    ChangeType.INSERT: "c",
    ChangeType.UPDATE_POST: "u",
    ChangeType.DELETE: "d",
    ChangeType.SNAPSHOT: "r",
}
# Debezium's source.snapshot values used here ("true" for a snapshot read, "false" for a
# change; "last" is not written: a snapshot spans micro-batches that do not know its end).
SNAPSHOT_VALUES = {True: "true", False: "false"}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# The event column with each record's 1-based place among its commit version's records
# in commit order (the hand-off writer task numbers them: `SlotWork.events`): the envelope's
# `transaction` block (`total_order`, `data_collection_order`); without it the block is null.
TOTAL_ORDER = "_total_order"


def avro_type(t: pa.DataType, path: str, names: Namer) -> AvroType:
    """The Avro type of an Arrow type (not nullable; see avro_field)."""
    if pat.is_boolean(t):
        return "boolean"
    if str(t) in _TAGGED:  # the Avro type with the exact Arrow type beside it
        base = "float" if pat.is_float16(t) else ("long" if t.bit_width >= 32 else "int")
        return {"type": base, ARROW_TYPE: str(t)}
    if pat.is_int8(t) or pat.is_int16(t) or pat.is_int32(t) or pat.is_uint8(t) or pat.is_uint16(t):
        return "int"
    if pat.is_integer(t):
        return "long"
    if pat.is_float16(t) or pat.is_float32(t):
        return "float"
    if pat.is_float64(t):
        return "double"
    if pat.is_string(t) or pat.is_large_string(t):
        return "string"
    if pat.is_fixed_size_binary(t):
        return {"type": "fixed", "name": names(f"{path}_fixed"), "size": t.byte_width}
    if pat.is_binary(t) or pat.is_large_binary(t):
        return "bytes"
    if pat.is_decimal(t):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": t.precision,
            "scale": t.scale,
        }
    if pat.is_date(t):
        return {"type": "int", "logicalType": "date"}
    if pat.is_timestamp(t):
        logical = "timestamp-micros" if t.tz else "local-timestamp-micros"
        return {"type": "long", "logicalType": logical}
    if pat.is_time(t):
        return {"type": "long", "logicalType": "time-micros"}
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        array = {"type": "array", "items": avro_field_type(t.value_field, f"{path}_item", names)}
        if pat.is_fixed_size_list(t):  # metadata only: lets a replica keep the vector type
            array[FIXED_SIZE] = t.list_size
        return array
    if pat.is_struct(t):
        return {
            "type": "record",
            "name": names(path),
            "fields": [
                avro_field(t.field(i), f"{path}_{t.field(i).name}", names)
                for i in range(t.num_fields)
            ],
        }
    if pat.is_map(t):
        value = avro_field_type(t.item_field, f"{path}_value", names)
        if pat.is_string(t.key_type) or pat.is_large_string(t.key_type):
            return {"type": "map", "values": value}
        entry = {
            "type": "record",
            "name": names(f"{path}_entry"),
            "fields": [
                {"name": "key", "type": avro_type(t.key_type, f"{path}_key", names)},
                {"name": "value", "type": value},
            ],
        }
        return {"type": "array", "items": entry}
    raise LanceCdfError(
        f"column {path!r} has Arrow type {t}, which lance-cdf cannot map to Avro; exclude it "
        "with --columns / the columns option."
    )


def avro_field_type(field: pa.Field, path: str, names: Namer) -> AvroType:
    inner = avro_type(field.type, path, names)
    return ["null", inner] if field.nullable else inner


def avro_field(field: pa.Field, path: str, names: Namer) -> AvroSchema:
    out: AvroSchema = {"name": avro_name(field.name), "type": avro_field_type(field, path, names)}
    if field.nullable:
        out["default"] = None
    return out


def row_schema(schema: pa.Schema, table_name: str | TableName) -> AvroSchema:
    """Avro record `<prefix>.<table>.Value`: the table's rows (`before`/`after`)."""
    names = Namer()
    return {
        "type": "record",
        "name": "Value",
        "namespace": TableName.of(table_name).namespace,
        "fields": [avro_field(f, f.name, names) for f in schema],
    }


def envelope_schema(schema: pa.Schema, table_name: str | TableName) -> AvroSchema:
    """The full value schema `<prefix>.<table>.Envelope`: envelope + source + row."""
    name = TableName.of(table_name)
    envelope = copy.deepcopy(load_avsc("envelope"))
    envelope["name"], envelope["namespace"] = "Envelope", name.namespace
    row = row_schema(schema, name)
    fields = {f["name"]: f for f in envelope["fields"]}
    fields["before"]["type"] = ["null", row]
    fields["after"]["type"] = ["null", f"{name.namespace}.Value"]
    fields["source"]["type"] = load_avsc("source")
    return envelope


def key_schema(
    schema: pa.Schema, key_columns: list[str] | None, table_name: str | TableName
) -> AvroSchema:
    """The key schema `<prefix>.<table>.Key`: `_rowid`, or the key columns."""
    key = load_avsc("key")
    key["namespace"] = TableName.of(table_name).namespace
    if not key_columns:
        return key
    names = Namer()
    missing = [c for c in key_columns if c not in schema.names]
    if missing:
        raise LanceCdfError(f"key column(s) {missing} are not columns of the table: {schema.names}")
    key["fields"] = [avro_field(schema.field(c), c, names) for c in key_columns]
    key["doc"] = "Record key: the key columns."
    return key


def _python_rows(table: pa.Table) -> list[AvroRecord]:
    """Arrow rows as Python values fastavro accepts (maps as dicts)."""
    maps = [f.name for f in table.schema if pat.is_map(f.type)]
    rows: list[AvroRecord] = table.to_pylist()
    if maps:
        string_keyed = {
            f.name for f in table.schema if pat.is_map(f.type) and pat.is_string(f.type.key_type)
        }
        for row in rows:
            for m in maps:
                if row[m] is not None:
                    row[m] = (
                        dict(row[m])
                        if m in string_keyed
                        else [{"key": k, "value": v} for k, v in row[m]]
                    )
    return rows


def _millis(ts: int | dt.datetime) -> int:
    """Milliseconds since the epoch of a commit timestamp (as fastavro writes
    timestamp-millis: floored)."""
    if isinstance(ts, int):
        return ts
    delta = ts - _EPOCH if ts.tzinfo else ts - _EPOCH.replace(tzinfo=None)
    return (delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds) // 1000


# (key, value, meta) of one record, the dicts fastavro writes; meta: {"tombstone": bool}.
# A plain tuple: built per row on the library (fastavro) path
ChangeRecord = tuple[AvroRecord, AvroRecord, dict[str, bool]]


def _block(namespace: str, version: int, total: int | None) -> AvroRecord | None:
    """The `transaction` block of a record (None without its total order)."""
    if total is None:
        return None
    if total < 1:
        raise LanceCdfError(f"version {version}: a record without its total order ({total})")
    return {"id": f"{namespace}:{version}", "total_order": total, "data_collection_order": total}


def change_records(
    events: pa.Table,
    user_columns: list[str],
    operations: dict[int, str],
    table_name: str | TableName,
    key_columns: list[str] | None,
    version: str,
    now_ms: int,
) -> list[ChangeRecord]:
    """(key, value, meta) per change: an update's pre- and post-image become one
    record, a delete is followed by a tombstone marker in meta["tombstone"]."""
    table = TableName.of(table_name)
    rows = _python_rows(events)
    names = [(avro_name(c), c) for c in user_columns]  # Avro field name, column
    key_names = [avro_name(c) for c in key_columns or []]
    out: list[ChangeRecord] = []
    pending_pre: AvroRecord | None = None
    for row in rows:
        kind = row["_change_type"]
        image = {avro: row[col] for avro, col in names}
        if kind == ChangeType.UPDATE_PRE:
            pending_pre = image
            continue
        before = (
            pending_pre
            if kind == ChangeType.UPDATE_POST
            else (image if kind == ChangeType.DELETE else None)
        )
        after = None if kind == ChangeType.DELETE else image
        pending_pre = None
        commit_version = row["_commit_version"]
        commit_ts = row["_commit_timestamp"]
        source = {
            "version": version,
            "connector": "lance-cdf",
            "name": table.prefix,
            "ts_ms": _millis(commit_ts),
            "snapshot": SNAPSHOT_VALUES[kind == ChangeType.SNAPSHOT],
            "db": table.uri,
            "table": table.table,
            "commit_version": commit_version,
            "commit_timestamp": commit_ts,
            "operation": operations.get(commit_version, "Unknown"),
            "rowid": row["_rowid"],
        }
        key = (
            {"_rowid": row["_rowid"]}
            if not key_names
            else {k: image[k] for k in key_names}  # (after or before: this row's image)
        )
        value = {
            "before": before,
            "after": after,
            "op": OPS[kind],
            "source": source,
            "ts_ms": now_ms,
            "transaction": _block(table.namespace, commit_version, row.get(TOTAL_ORDER)),
        }
        out.append((key, value, {"tombstone": kind == ChangeType.DELETE}))
    return out


# -- the way back: Avro schemas of published records -> Arrow (the replicator) ----------
_AVRO_PRIMITIVES = {
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.binary(),
}


def arrow_type(t: AvroType) -> tuple[pa.DataType, bool]:
    """(Arrow type, nullable) of an Avro type written by `avro_type`."""
    if isinstance(t, list):
        inner = [x for x in t if x != "null"]
        if len(inner) != 1:
            raise LanceCdfError(f"Avro union {t!r} has no Arrow mapping")
        arrow, _ = arrow_type(inner[0])
        return arrow, "null" in t
    if isinstance(t, dict):
        logical, base = t.get("logicalType"), t["type"]
        if logical == "decimal":
            return pa.decimal128(t["precision"], t.get("scale", 0)), False
        if logical == "date":
            return pa.date32(), False
        if logical in ("timestamp-micros", "timestamp-millis"):
            return pa.timestamp("us", tz="UTC"), False
        if logical == "local-timestamp-micros":
            return pa.timestamp("us"), False
        if logical == "time-micros":
            return pa.time64("us"), False
        if base == "array":
            item, nullable = arrow_type(t["items"])
            if (
                isinstance(t["items"], dict)
                and t["items"].get("type") == "record"
                and [f["name"] for f in t["items"]["fields"]] == ["key", "value"]
            ):
                k, _ = arrow_type(t["items"]["fields"][0]["type"])
                v, vn = arrow_type(t["items"]["fields"][1]["type"])
                return pa.map_(k, pa.field("value", v, vn)), False
            field = pa.field("item", item, nullable)
            size = t.get(FIXED_SIZE)
            return (pa.list_(field, size) if size else pa.list_(field)), False
        if base == "map":
            value, nullable = arrow_type(t["values"])
            return pa.map_(pa.string(), pa.field("value", value, nullable)), False
        if base == "record":
            return pa.struct([arrow_field(f) for f in t["fields"]]), False
        if base == "fixed":
            return pa.binary(t["size"]), False
        if t.get(ARROW_TYPE) in _TAGGED and base in ("int", "long", "float"):
            return _TAGGED[t[ARROW_TYPE]], False
        return arrow_type(base)
    if t in _AVRO_PRIMITIVES:
        return _AVRO_PRIMITIVES[t], False
    raise LanceCdfError(f"Avro type {t!r} has no Arrow mapping")


def arrow_field(f: AvroSchema) -> pa.Field:
    arrow, nullable = arrow_type(f["type"])
    return pa.field(f["name"], arrow, nullable)


def row_arrow_schema(envelope: AvroSchema) -> pa.Schema:
    """Arrow schema of the row record (`before` / `after`) of an envelope schema."""
    before = next(f for f in envelope["fields"] if f["name"] == "before")["type"]
    row = next(x for x in before if isinstance(x, dict))
    return pa.schema([arrow_field(f) for f in row["fields"]])
