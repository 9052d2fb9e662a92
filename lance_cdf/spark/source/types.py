"""Arrow types of a Lance table -> Spark types, and event batches -> what Spark accepts.

Spark has no unsigned integers and no half floats, so those widen: uint8 ->
short, uint16 -> int, uint32 -> long, uint64 -> long (a value >= 2^63 stops the
read with an error naming the column), float16 -> float. `_rowid` (uint64) is a
long: row IDs are allocated from 0 upwards and stay far below 2^63. Timestamps
finer than microseconds are truncated to microseconds (Spark's resolution);
fixed-size and large lists become arrays, dictionary columns their value type.

Spark compares the Arrow schema of every batch a Python source yields with the
one it derives from the declared Spark schema, so batches are cast to exactly
`to_arrow_schema(declared, timezone="UTC")`.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from lance_cdf.core.events import META_FIELDS, ROWID
from lance_cdf.errors import LanceCdfError

META_NAMES = frozenset(f.name for f in META_FIELDS)

_WIDER = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.int64(),
    pa.float16(): pa.float32(),
}


def sparkable(t: pa.DataType) -> pa.DataType:
    """`t` with the types Spark cannot hold replaced by the nearest ones it can."""
    if isinstance(t, pa.ExtensionType):
        return sparkable(t.storage_type)
    if t in _WIDER:
        return _WIDER[t]
    if pa.types.is_dictionary(t):
        return sparkable(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(sparkable(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct(
            [t.field(i).with_type(sparkable(t.field(i).type)) for i in range(t.num_fields)]
        )
    if pa.types.is_map(t):
        return pa.map_(
            sparkable(t.key_type), t.item_field.with_type(sparkable(t.item_type)), t.keys_sorted
        )
    return t


def spark_schema(user_schema: pa.Schema) -> StructType:
    """The Spark schema of the events of `user_schema`'s columns."""
    fields = []
    for field in user_schema:
        try:
            arrow = pa.schema([field.with_type(sparkable(field.type)).remove_metadata()])
            fields.append(from_arrow_schema(arrow)[0])
        except Exception as exc:  # pyspark raises PySparkTypeError for unsupported types
            raise LanceCdfError(
                f"column {field.name!r} has type {field.type}, which Spark cannot represent "
                f"({exc}); leave it out with .option('columns', 'col1,col2,...')."
            ) from None
    meta = [f.with_type(pa.int64()) if f.name == ROWID else f for f in META_FIELDS]
    return StructType(fields + list(from_arrow_schema(pa.schema(meta))))


def arrow_target(declared: StructType) -> pa.Schema:
    """The Arrow schema Spark requires of the batches for `declared`."""
    return to_arrow_schema(declared, timezone="UTC")


def _has_temporal(t: pa.DataType) -> bool:
    if pa.types.is_temporal(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_temporal(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_temporal(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _has_temporal(t.key_type) or _has_temporal(t.item_type)
    return False


def _cast(column: pa.Array, field: pa.Field) -> pa.Array:
    try:
        return pc.cast(column, field.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        if field.name == ROWID:
            raise LanceCdfError(
                f"a row ID does not fit Spark's signed long _rowid ({exc}); "
                "row IDs >= 2^63 cannot be streamed to Spark."
            ) from None
        if _has_temporal(field.type):
            try:  # nanosecond timestamps: truncate to Spark's microseconds
                return pc.cast(column, field.type, safe=False)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        raise LanceCdfError(
            f"column {field.name!r}: {column.type} values cannot be converted to the Spark "
            f"type's Arrow form {field.type} ({exc}); leave the column out with "
            ".option('columns', ...)."
        ) from None


def to_spark(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """`batch` (event columns by name) as `target`: picked, ordered and cast."""
    arrays = []
    for field in target:
        column = batch.column(field.name)
        arrays.append(column if column.type == field.type else _cast(column, field))
    return pa.RecordBatch.from_arrays(arrays, schema=target)
