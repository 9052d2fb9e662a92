"""Vectorised Avro binary encoding of change events (no per-row Python).

`encode_changes` produces the same bytes as `fastavro.schemaless_writer` over the
dicts `schema.change_records` builds, but for a whole Arrow batch at once:

* every field of the record is encoded for all rows at once, as a *part*: either a
  padded byte matrix (``Padded``: one row of at most ``w`` bytes per record plus the
  per-record length; varints, floats, booleans, union indexes, constant strings) or
  a variable-length binary column (``Var``: strings, bytes, list items, taken from the
  Arrow buffers directly);
* adjacent padded parts are stacked side by side and compacted with one boolean mask
  (row-major order keeps each record's bytes together), and the resulting columns are
  concatenated row-wise by Arrow's ``binary_join_element_wise`` kernel.

Types the fast path does not handle (decimal, maps, dictionaries, nanosecond
times, ...) make `can_encode` false; values fastavro would reject (nulls in a
non-nullable field, uint64 above the long range, unknown change types) raise
`lance_cdf.errors.AvroEncodeDeclined`. In both cases the caller uses the fastavro path for
the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from lance_cdf.avro.names import TableName
from lance_cdf.avro.schema import OPS, SNAPSHOT_VALUES, TOTAL_ORDER
from lance_cdf.core.change_types import ChangeType
from lance_cdf.errors import AvroEncodeDeclined

_US = {"s": 1_000_000, "ms": 1_000, "us": 1}
_EMPTY = pa.scalar(b"", pa.large_binary())


# -- parts ------------------------------------------------------------------------------
@dataclass
class Padded:
    """Per record, the first ``lens[i]`` bytes of ``m[i]`` (``lens`` None: all ``w``)."""

    m: np.ndarray  # (n, w) uint8, possibly a broadcast view
    lens: np.ndarray | None = None

    @property
    def width(self) -> int:
        return cast(int, self.m.shape[1])

    def lengths(self) -> np.ndarray:
        if self.lens is None:
            return np.full(self.m.shape[0], self.width, np.int64)
        return self.lens


@dataclass
class Var:
    """Per record, ``data[offsets[i]:offsets[i + 1]]``, empty where ``valid`` is false."""

    offsets: np.ndarray  # (n + 1,) int64
    data: pa.Buffer
    valid: np.ndarray | None = None

    def array(self) -> pa.Array:
        bitmap = None
        if self.valid is not None:
            bitmap = pa.py_buffer(np.packbits(self.valid, bitorder="little"))
        n = len(self.offsets) - 1
        return pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), n, [bitmap, pa.py_buffer(self.offsets), self.data]
        )


# one piece of every record's encoding, in record order
Part = Padded | Var


def _var_of(arr: pa.Array) -> Var:
    """A binary/string Arrow array (any offset, either offset width) as a Var."""
    large = pat.is_large_binary(arr.type) or pat.is_large_string(arr.type)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], np.int64 if large else np.int32)
    offsets = offsets[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
    data = bufs[2] if bufs[2] is not None else pa.py_buffer(b"")
    return Var(offsets, data, _valid(arr))


def _mask(parts: list[Part], keep: np.ndarray) -> list[Part]:
    """The parts with every record where ``keep`` is false made empty."""
    out: list[Part] = []
    for p in parts:
        if isinstance(p, Padded):
            out.append(Padded(p.m, np.where(keep, p.lengths(), 0)))
        else:
            out.append(Var(p.offsets, p.data, keep if p.valid is None else p.valid & keep))
    return out


def _take(parts: list[Part], idx: np.ndarray) -> list[Part]:
    out: list[Part] = []
    for p in parts:
        if isinstance(p, Padded):
            out.append(Padded(p.m[idx], None if p.lens is None else p.lens[idx]))
        else:
            out.append(_var_of(pc.take(p.array(), pa.array(idx))))
    return out


def _voids(p: Padded, n: int) -> np.ndarray:
    """The part's rows as an (n,) array of w-byte void scalars (or one, broadcast)."""
    void = f"V{p.width}"
    if n and p.m.strides[0] == 0:  # a constant
        return np.frombuffer(p.m[0].tobytes(), void)
    return np.ascontiguousarray(p.m).view(void).reshape(n)


def _side_by_side(columns: list[np.ndarray], widths: list[int], n: int) -> np.ndarray:
    """(n, sum(widths)) uint8: the void columns next to each other in every row.

    A record dtype with one void field per column copies each column as whole
    elements, much faster than strided byte-slice assignments."""
    starts = np.cumsum([0, *widths[:-1]]).tolist()
    dtype = np.dtype(
        {
            "names": [f"p{k}" for k in range(len(widths))],
            "formats": [f"V{w}" for w in widths],
            "offsets": starts,
            "itemsize": sum(widths),
        }
    )
    out = np.empty(n, dtype)
    for k, col in enumerate(columns):
        out[f"p{k}"] = col
    return out.view(np.uint8).reshape(n, sum(widths))


def _prefix_mask(lens: np.ndarray, w: int) -> np.ndarray:
    """(n,) V{w} voids whose first lens[i] bytes are 1, the rest 0."""
    table = (np.arange(w)[None, :] < np.arange(w + 1)[:, None]).astype(np.uint8)
    return cast(np.ndarray, table.view(f"V{w}").reshape(w + 1)[lens])


def _side_by_side_parts(group: list[Padded], n: int) -> np.ndarray:
    if len(group) == 1 and group[0].m.flags.c_contiguous:
        return group[0].m
    return _side_by_side([_voids(p, n) for p in group], [p.width for p in group], n)


def _fixed_data(group: list[Padded], n: int) -> pa.Buffer:
    """The bytes of full-width padded parts, record after record."""
    if not group:
        return pa.py_buffer(b"")
    return pa.py_buffer(_side_by_side_parts(group, n).reshape(-1))


def _compact(group: list[Padded], n: int) -> Var:
    widths = [p.width for p in group]
    width = sum(widths)
    m = _side_by_side_parts(group, n)
    offsets = np.zeros(n + 1, np.int64)
    if all(p.lens is None for p in group):
        offsets[1:] = np.arange(1, n + 1, dtype=np.int64) * width
        data = m.reshape(-1)
    else:
        total = np.zeros(n, np.int64)
        for p in group:
            total += p.lengths()
        np.cumsum(total, out=offsets[1:])
        ones = np.frombuffer(b"\x01" * max(widths), np.uint8)
        keep = _side_by_side(
            [
                np.frombuffer(ones[:w].tobytes(), f"V{w}")
                if p.lens is None
                else _prefix_mask(p.lens, w)
                for p, w in zip(group, widths, strict=True)
            ],
            widths,
            n,
        ).view(bool)
        data = m[keep]
    return Var(offsets, pa.py_buffer(data))


def assemble(parts: list[Part], n: int) -> pa.LargeBinaryArray:
    """Concatenate the parts record by record into one binary column: adjacent padded
    parts compacted together, then Arrow's `binary_join_element_wise` over the pieces."""
    pieces: list[Var] = []
    group: list[Padded] = []
    for p in parts:
        if isinstance(p, Padded):
            if p.width:
                group.append(p)
            continue
        if group:
            pieces.append(_compact(group, n))
            group = []
        pieces.append(p)
    if group:
        pieces.append(_compact(group, n))
    if not pieces:
        return pa.array([b""] * n, pa.large_binary())
    arrays = [v.array() for v in pieces]
    if len(arrays) == 1 and arrays[0].null_count == 0:
        return arrays[0]
    return pc.binary_join_element_wise(
        *arrays, _EMPTY, null_handling="replace", null_replacement=""
    )


# -- primitive encodings ----------------------------------------------------------------
def _const(data: bytes, n: int) -> Padded:
    row = np.frombuffer(data, np.uint8)
    return Padded(np.broadcast_to(row, (n, len(row))))


def _zigzag_varint(v: np.ndarray) -> Padded:
    """Avro int/long: zigzag, then base-128 varint, one row per value."""
    v = v.astype(np.int64, copy=False)
    z = ((v << 1) ^ (v >> 63)).view(np.uint64)
    return _varint(z)


def _varint(z: np.ndarray) -> Padded:
    n = len(z)
    nb = np.ones(n, np.int64)
    for k in range(1, 10):
        nb += z >= np.uint64(1 << (7 * k))
    w = int(nb.max()) if n else 1
    m = np.empty((n, w), np.uint8)
    for j in range(w):
        byte = ((z >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        if j < w - 1:
            byte |= (nb > j + 1).astype(np.uint8) << 7
        m[:, j] = byte
    return Padded(m, None if (n == 0 or (nb == w).all()) else nb)


def varint_bytes(value: int) -> bytes:
    return cast(bytes, _zigzag_varint(np.array([value], np.int64)).m[0].tobytes())


def _string_bytes(text: str) -> bytes:
    data = text.encode()
    return varint_bytes(len(data)) + data


def _valid(arr: pa.Array) -> np.ndarray | None:
    if arr.null_count == 0:
        return None
    valid: np.ndarray = arr.is_valid().to_numpy(zero_copy_only=False)
    return valid


def _numbers(arr: pa.Array, dtype: npt.DTypeLike) -> np.ndarray:
    if arr.null_count:
        arr = arr.fill_null(pa.scalar(False if pat.is_boolean(arr.type) else 0, arr.type))
    values: np.ndarray = arr.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values


def _bytes_view(values: np.ndarray) -> Padded:
    values = np.ascontiguousarray(values)
    return Padded(values.view(np.uint8).reshape(len(values), values.dtype.itemsize))


def _float32(values: np.ndarray) -> np.ndarray:
    """As fastavro writes float32 data read back through Python floats: a signalling
    NaN comes back quiet (its quiet bit set), every other value unchanged."""
    values = values.astype(np.float32, copy=False)
    if not np.isnan(values).any():
        return values
    bits = values.view(np.uint32)
    signalling = ((bits & 0x7FC00000) == 0x7F800000) & ((bits & 0x003FFFFF) != 0)
    return cast(np.ndarray, (bits | (signalling.astype(np.uint32) << 22)).view(np.float32))


def _long_values(arr: pa.Array) -> np.ndarray:
    """Values of an integer / temporal array as the int64 Avro writes (nulls → 0)."""
    t = arr.type
    if pat.is_uint64(t):
        v = _numbers(arr, np.uint64)
        if (v > np.uint64(2**63 - 1)).any():
            raise AvroEncodeDeclined("uint64 value beyond the Avro long range")
        return v.astype(np.int64)
    if pat.is_integer(t):
        return _numbers(arr, np.int64)
    if pat.is_date32(t):
        return _numbers(arr.cast(pa.int32()), np.int64)
    if pat.is_date64(t):
        return _numbers(arr.cast(pa.int64()), np.int64) // 86_400_000
    if pat.is_timestamp(t) or pat.is_time(t):
        raw = _numbers(arr.cast(pa.int64() if t.bit_width == 64 else pa.int32()), np.int64)
        return raw * _US[t.unit]
    raise AvroEncodeDeclined(f"{t}")


def _supported(t: pa.DataType) -> bool:
    if (
        pat.is_boolean(t)
        or pat.is_integer(t)
        or pat.is_floating(t)
        or pat.is_string(t)
        or pat.is_large_string(t)
        or pat.is_binary(t)
        or pat.is_large_binary(t)
        or pat.is_fixed_size_binary(t)
        or pat.is_date(t)
    ):
        return True
    if pat.is_timestamp(t) or pat.is_time(t):
        return cast(str, t.unit) != "ns"
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        return _supported(t.value_type)
    if pat.is_struct(t):
        return all(_supported(t.field(i).type) for i in range(t.num_fields))
    return False


def can_encode(schema: pa.Schema) -> bool:
    """Whether every column of ``schema`` (the user columns) has a vectorised encoder."""
    return all(_supported(f.type) for f in schema)


def _value_parts(arr: pa.Array, nullable: bool, present: np.ndarray | None = None) -> list[Part]:
    """Parts encoding ``arr`` as an Avro field (a ["null", T] union when nullable).

    ``present``: the records where the value is written at all (not under a null
    struct); the caller empties the others.
    """
    n = len(arr)
    valid = _valid(arr)
    if not nullable:
        if valid is not None and (present is None or (present & ~valid).any()):
            raise AvroEncodeDeclined("null in a non-nullable field")  # fastavro raises on it
        return _type_parts(arr, present)
    if valid is None:
        return [_const(b"\x02", n), *_type_parts(arr, present)]
    inner = valid if present is None else valid & present
    index = Padded((valid.astype(np.uint8) << 1)[:, None])
    return [index, *_mask(_type_parts(arr, inner), valid)]


def _type_parts(arr: pa.Array, present: np.ndarray | None) -> list[Part]:
    t, n = arr.type, len(arr)
    if pat.is_boolean(t):
        return [Padded(_numbers(arr, np.uint8)[:, None])]
    if pat.is_float16(t) or pat.is_float32(t):
        return [_bytes_view(_float32(_numbers(arr, np.float32)).astype("<f4"))]
    if pat.is_float64(t):
        return [_bytes_view(_numbers(arr, np.float64).astype("<f8"))]
    if pat.is_integer(t) or pat.is_date(t) or pat.is_timestamp(t) or pat.is_time(t):
        return [_zigzag_varint(_long_values(arr))]
    if pat.is_string(t) or pat.is_large_string(t) or pat.is_binary(t) or pat.is_large_binary(t):
        var = _var_of(arr)
        lens = np.diff(var.offsets)
        return [_zigzag_varint(lens), Var(var.offsets, var.data)]
    if pat.is_fixed_size_binary(t):
        w = t.byte_width
        data = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * w : (arr.offset + n) * w]
        return [Padded(data.reshape(n, w))]
    if pat.is_struct(t):
        children = arr.flatten()  # honours the array's offset
        parts: list[Part] = []
        for i in range(t.num_fields):
            parts += _value_parts(children[i], t.field(i).nullable, present)
        return parts
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        return _list_parts(arr)
    raise AvroEncodeDeclined(f"{t}")


def _list_parts(arr: pa.Array) -> list[Part]:
    """Avro array: item count (omitted when empty), the items, a 0 block count."""
    t, n = arr.type, len(arr)
    if pat.is_fixed_size_list(t):
        size = t.list_size
        item_offsets = (np.arange(n + 1, dtype=np.int64) + arr.offset) * size
    else:
        item_offsets = arr.offsets.to_numpy().astype(np.int64)
    start, stop = int(item_offsets[0]), int(item_offsets[-1])
    items = arr.values.slice(start, stop - start)
    item_offsets -= start
    counts = np.diff(item_offsets)
    valid = _valid(arr) if pat.is_fixed_size_list(t) else None  # (None: no nulls)
    if valid is not None:
        counts = np.where(valid, counts, 0)
    item_parts = _value_parts(items, t.value_field.nullable)
    fixed = [p for p in item_parts if isinstance(p, Padded) and p.lens is None]
    if len(fixed) == len(item_parts):
        # fixed-width items (e.g. float32 vector elements): no per-item offsets needed
        width = sum(p.width for p in fixed)
        encoded = Var(item_offsets * width, _fixed_data(fixed, len(items)))
    else:
        encoded = _var_of(assemble(item_parts, len(items)))
        encoded.offsets = encoded.offsets[item_offsets]
    byte_offsets = encoded.offsets
    count = _zigzag_varint(counts)
    count.lens = np.where(counts > 0, count.lengths(), 0)
    return [count, Var(byte_offsets, encoded.data), _const(b"\x00", n)]


def record_parts(columns: list[pa.Array], fields: list[pa.Field]) -> list[Part]:
    """Parts of an Avro record whose fields are ``fields`` (Arrow), values ``columns``."""
    parts: list[Part] = []
    for arr, field in zip(columns, fields, strict=True):
        if arr.type != field.type:
            raise AvroEncodeDeclined(f"column {field.name} is {arr.type}, schema says {field.type}")
        parts += _value_parts(arr, field.nullable)
    return parts


# -- change records ---------------------------------------------------------------------
@dataclass
class EncodedChanges:
    keys: pa.LargeBinaryArray
    values: pa.LargeBinaryArray
    tombstone: np.ndarray  # bool, per record: a delete (a tombstone may follow it)

    def __len__(self) -> int:
        return len(self.values)


def _column(events: pa.Table, name: str) -> pa.Array:
    col = events.column(name)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _commit_millis(arr: pa.Array) -> np.ndarray:
    if arr.null_count:
        raise AvroEncodeDeclined("null commit timestamp")
    t = arr.type
    if pat.is_integer(t):
        return _long_values(arr)
    if pat.is_timestamp(t) and t.tz is not None:  # fastavro: floor to the millisecond
        if t.unit == "ns":
            raise AvroEncodeDeclined("nanosecond commit timestamp")
        millis: np.ndarray = (arr.cast(pa.int64()).to_numpy() * _US[t.unit]) // 1000
        return millis
    raise AvroEncodeDeclined(f"commit timestamp of type {t}")


def _padded_strings(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Avro strings (length + UTF-8) side by side, zero-padded, and their lengths."""
    encoded = [_string_bytes(t) for t in texts]
    out = np.zeros((len(encoded), max((len(b) for b in encoded), default=1)), np.uint8)
    for i, b in enumerate(encoded):
        out[i, : len(b)] = np.frombuffer(b, np.uint8)
    return out, np.array([len(b) for b in encoded], np.int64)


def _transaction_parts(
    events: pa.Table, rows: np.ndarray, versions: np.ndarray, inverse: np.ndarray, namespace: str
) -> list[Part]:
    """The envelope's `transaction` block: null, or (with `_total_order`, `SlotWork.events`)
    id `<namespace>:<version>` (the BEGIN/END id), `total_order` and
    `data_collection_order` (the same: one table per topic)."""
    if TOTAL_ORDER not in events.column_names:
        return [_const(b"\x00", len(rows))]
    total = _long_values(_column(events, TOTAL_ORDER))[rows]
    if len(total) and total.min() < 1:
        raise AvroEncodeDeclined("a record without its total order")  # fastavro path refuses
    ids, id_lens = _padded_strings([f"{namespace}:{v}" for v in versions.tolist()])
    order = _zigzag_varint(total)
    return [_const(b"\x02", len(rows)), Padded(ids[inverse], id_lens[inverse]), order, order]


def _change_kinds(events: pa.Table) -> dict[ChangeType, np.ndarray]:
    """Per change type (update_preimage and every one of `OPS`), which events have it."""
    kind_arr = _column(events, "_change_type")
    if pat.is_dictionary(kind_arr.type):
        kind_arr = kind_arr.cast(pa.string())
    kinds = {
        k: pc.equal(kind_arr, k).fill_null(False).to_numpy(zero_copy_only=False)
        for k in (ChangeType.UPDATE_PRE, *OPS)
    }
    if not np.logical_or.reduce(list(kinds.values())).all():
        raise AvroEncodeDeclined("unknown change type")  # fastavro path refuses it
    return kinds


def _image_parts(
    events: pa.Table, user_schema: pa.Schema, kinds: dict[ChangeType, np.ndarray], rows: np.ndarray
) -> list[Part]:
    """The envelope's `before` and `after` unions of the records at event `rows`: an
    update's postimage carries the preimage before it, a delete only `before`."""
    pre, post = kinds[ChangeType.UPDATE_PRE], kinds[ChangeType.UPDATE_POST]
    delete = kinds[ChangeType.DELETE]
    after_pre = np.zeros(events.num_rows, bool)
    after_pre[1:] = pre[:-1]
    has_before = (post & after_pre)[rows] | delete[rows]
    has_after = ~delete[rows]
    before_rows = np.where(post[rows], rows - 1, rows)
    columns = [_column(events, c) for c in user_schema.names]
    row = record_parts(columns, list(user_schema))
    if len(rows) == events.num_rows:  # no update pairs: records are the event rows
        before, after = row, row
    else:
        before, after = _take(row, np.maximum(before_rows, 0)), _take(row, rows)
    return [
        Padded(has_before.astype(np.uint8)[:, None] << 1),
        *_mask(before, has_before),
        Padded(has_after.astype(np.uint8)[:, None] << 1),
        *_mask(after, has_after),
    ]


def _op_part(kinds: dict[ChangeType, np.ndarray], rows: np.ndarray) -> Padded:
    """The envelope's `op` (a one-letter string) of the records at event `rows`."""
    kind_code = np.zeros(len(kinds[ChangeType.DELETE]), np.uint8)
    for kind, letter in OPS.items():
        kind_code[kinds[kind]] = ord(letter)
    op = np.empty((len(rows), 2), np.uint8)
    op[:, 0], op[:, 1] = 2, kind_code[rows]
    return Padded(op)


def _operation_part(unique: np.ndarray, inverse: np.ndarray, operations: dict[int, str]) -> Padded:
    """`source.operation` per record: the operation of its commit version (`unique`
    versions, `inverse` each record's index in them)."""
    names = [_string_bytes(operations.get(int(v), "Unknown")) for v in unique.tolist()]
    width = max((len(b) for b in names), default=1)
    name_bytes = np.zeros((len(names), width), np.uint8)
    for i, b in enumerate(names):  # one per commit version, not per row
        name_bytes[i, : len(b)] = np.frombuffer(b, np.uint8)
    name_lens = np.array([len(b) for b in names], np.int64)
    return Padded(name_bytes[inverse], name_lens[inverse])


def _snapshot_part(is_snap: np.ndarray) -> Padded:
    """`source.snapshot` per record: whether its event is a snapshot row."""
    true, false = (_string_bytes(SNAPSHOT_VALUES[b]) for b in (True, False))
    snapshot = np.zeros((len(is_snap), max(len(true), len(false))), np.uint8)
    snapshot[is_snap, : len(true)] = np.frombuffer(true, np.uint8)
    snapshot[~is_snap, : len(false)] = np.frombuffer(false, np.uint8)
    return Padded(snapshot, np.where(is_snap, len(true), len(false)).astype(np.int64))


def _key_parts(
    events: pa.Table,
    user_schema: pa.Schema,
    key_columns: list[str] | None,
    rows: np.ndarray,
    rowid: np.ndarray,
) -> list[Part]:
    """The key record of each record at event `rows`: its key columns, or its row ID."""
    if not key_columns:
        return [_zigzag_varint(rowid)]
    key_fields = [user_schema.field(c) for c in key_columns]
    key_parts = record_parts([_column(events, c) for c in key_columns], key_fields)
    return key_parts if len(rows) == events.num_rows else _take(key_parts, rows)


@dataclass(frozen=True)
class RecordShape:
    """What every record of one publisher's batches shares: the table's columns and name,
    the key, the connector version written in `source.version`, and the Confluent wire
    headers (magic byte and schema id) of the key and value schemas."""

    user_schema: pa.Schema
    table_name: str | TableName
    key_columns: list[str] | None
    version: str
    key_prefix: bytes = b""
    value_prefix: bytes = b""


def encode_changes(
    events: pa.Table, shape: RecordShape, operations: dict[int, str], now_ms: int
) -> EncodedChanges:
    """The key and value bodies `change_records` + fastavro would write, in its order.

    Raises `AvroEncodeDeclined` when the batch needs the fastavro path.
    """
    user_schema, key_columns, version = shape.user_schema, shape.key_columns, shape.version
    key_prefix, value_prefix = shape.key_prefix, shape.value_prefix
    if not can_encode(user_schema):
        raise AvroEncodeDeclined("a column type has no vectorised encoder")
    kinds = _change_kinds(events)
    rows = np.flatnonzero(~kinds[ChangeType.UPDATE_PRE])  # one record per non-preimage row
    n = len(rows)
    versions = _long_values(_column(events, "_commit_version"))[rows]
    unique, inverse = np.unique(versions, return_inverse=True)
    table = TableName.of(shape.table_name)
    rowid = _long_values(_column(events, "_rowid"))[rows]
    commit_ms = _commit_millis(_column(events, "_commit_timestamp"))[rows]
    value_parts = [
        _const(value_prefix, n),
        *_image_parts(events, user_schema, kinds, rows),
        _op_part(kinds, rows),
        _const(
            _string_bytes(version) + _string_bytes("lance-cdf") + _string_bytes(table.prefix), n
        ),
        _zigzag_varint(commit_ms),  # source.ts_ms
        _snapshot_part(kinds[ChangeType.SNAPSHOT][rows]),
        _const(_string_bytes(table.uri) + _string_bytes(table.table), n),
        _zigzag_varint(versions),
        _zigzag_varint(commit_ms),  # source.commit_timestamp
        _operation_part(unique, inverse, operations),
        _zigzag_varint(rowid),
        _const(varint_bytes(now_ms), n),
        *_transaction_parts(events, rows, unique, inverse, table.namespace),
    ]
    key_parts = _key_parts(events, user_schema, key_columns, rows, rowid)
    return EncodedChanges(
        keys=assemble([_const(key_prefix, n), *key_parts], n),
        values=assemble(value_parts, n),
        tombstone=kinds[ChangeType.DELETE][rows],
    )
