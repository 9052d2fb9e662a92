"""A stable 63-bit hash of the record key of each change event, vectorised.

It routes a change to its Kafka partition (`hash % partitions`), so it must be the same in
every process and release: integers, dates and timestamps hash their int64 value, floats
their float64 bits, strings and binaries their bytes (FNV-1a), nulls a constant; columns
combine through splitmix64. An update's preimage takes its postimage's hash (the record
they make is keyed by the postimage), so the two images travel together.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.core.change_types import ChangeType
from lance_cdf.errors import LanceCdfError

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_NULL = np.uint64(0x9E3779B97F4A7C15)
_MASK63 = np.uint64((1 << 63) - 1)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h: np.ndarray = x ^ (x >> np.uint64(31))
        return h


def _bytes_hash(arr: pa.Array) -> np.ndarray:
    """FNV-1a of each value's bytes: one numpy pass per byte position, over all rows."""
    arr = arr.cast(pa.large_binary())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int64, n + 1, arr.offset * 8)
    data = arr.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    h = np.full(n, _FNV_OFFSET, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(lengths.max()) if n else 0):
            live = np.flatnonzero(lengths > j)
            h[live] = (h[live] ^ data[starts[live] + j].astype(np.uint64)) * _FNV_PRIME
    return h


def _column_hash(arr: pa.Array) -> np.ndarray:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr, t = arr.cast(t.value_type), t.value_type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        values: np.ndarray = pc.cast(arr, pa.int64()).fill_null(0).to_numpy().view(np.uint64)
    elif pa.types.is_temporal(t):
        width = pa.int32() if t.bit_width == 32 else pa.int64()
        values = pc.cast(arr.cast(width), pa.int64()).fill_null(0).to_numpy().view(np.uint64)
    elif pa.types.is_floating(t):
        values = pc.cast(arr, pa.float64()).fill_null(0).to_numpy().view(np.uint64)
    elif (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or (pa.types.is_large_binary(t))
    ):
        values = _bytes_hash(arr)
    else:
        raise LanceCdfError(
            f"a key column of type {t} cannot be hashed to a Kafka partition; key by columns "
            "of integer, floating, string, binary or date/time type (or by _rowid)."
        )
    if arr.null_count:
        values = np.where(arr.is_null().to_numpy(zero_copy_only=False), _NULL, values)
    return values


def key_hash(events: pa.Table | pa.RecordBatch, key_columns: list[str]) -> np.ndarray:
    """int64 (non-negative) per event; a preimage gets the hash of the row after it (its
    postimage). The caller keeps a trailing preimage back until its postimage arrives."""
    n = events.num_rows
    h = np.zeros(n, np.uint64)
    for name in key_columns:
        col = events.column(name)
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        h = _splitmix(h ^ _column_hash(col))
    kinds = events.column("_change_type")
    pre = np.flatnonzero(
        pc.equal(kinds, ChangeType.UPDATE_PRE).fill_null(False).to_numpy(zero_copy_only=False)
    )
    pre = pre[pre + 1 < n]
    h[pre] = h[pre + 1]
    return (h & _MASK63).view(np.int64)
