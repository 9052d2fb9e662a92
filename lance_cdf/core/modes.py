"""Feed modes applied to the events of a version range: net changes (one event,
or one update pair, per row ID) and carry-over filtering (updates that changed
no value). Both are bulk numpy / Arrow work over the `_rowid` and
`_change_type` columns; the user columns are only taken, never looped over.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.core.change_types import ChangeType
from lance_cdf.core.events import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, META_COLUMNS, ROWID
from lance_cdf.errors import LanceCdfError

# insert, update pre- and postimage, delete, snapshot (ChangeType's order): _INS.._SNAP
_KINDS = tuple(kind.value for kind in ChangeType)
_CODE = {kind: i for i, kind in enumerate(_KINDS)}
_INS, _PRE, _POST, _DEL, _SNAP = range(len(_KINDS))


def _column(table: pa.Table, name: str) -> np.ndarray:
    return cast(np.ndarray, table.column(name).combine_chunks().to_numpy(zero_copy_only=False))


def kind_codes(change_types: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """`_change_type` strings as small integer codes (an index into `_KINDS`)."""
    if isinstance(change_types, pa.ChunkedArray):
        change_types = change_types.combine_chunks()
    encoded = pc.dictionary_encode(change_types)
    names = encoded.dictionary.to_pylist()  # at most five distinct values
    unknown = [n for n in names if n not in _CODE]
    if unknown:
        raise LanceCdfError(f"unknown _change_type value(s) {unknown}; expected one of {_KINDS}")
    lookup = np.array([_CODE[n] for n in names], dtype=np.int8)
    return cast(np.ndarray, lookup[encoded.indices.to_numpy(zero_copy_only=False)])


def _kind_array(codes: np.ndarray) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int8()), list(_KINDS)).cast(
        pa.string()
    )


def net_changes(events: pa.Table) -> pa.Table:
    """Collapse the events of a range into at most one per row ID (an update:
    one preimage/postimage pair), as Iceberg's changelog view with net_changes.

    `events` must be in the feed's order (commit version ascending). Per row ID,
    the first event says whether the row existed before the range (a preimage or
    a delete) and the last whether it exists after it (anything but a delete):

    - existed and exists: an update pair, the first event's values as the
      preimage and the last one's as the postimage;
    - existed, gone: a delete with the values the row had before the range;
    - new and exists: an insert (a snapshot row stays a snapshot row) with the
      last values;
    - new and gone (inserted, then deleted): nothing.

    Every output event carries the `_commit_version` / `_commit_timestamp` of the
    row's last event in the range. Output order: snapshot rows, then by commit
    version, then deletes, update pairs (preimage first), inserts, by row ID.
    """
    n = events.num_rows
    if n == 0:
        return events
    rowids = _column(events, ROWID)
    kinds = kind_codes(events.column(CHANGE_TYPE))
    # stable by position within a row ID: the feed's order is chronological
    order = np.lexsort((np.arange(n), rowids))
    grouped = rowids[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    ends = np.r_[starts[1:], n] - 1
    first, last = order[starts], order[ends]
    first_kind, last_kind = kinds[first], kinds[last]
    existed = (first_kind == _PRE) | (first_kind == _DEL)
    exists = last_kind != _DEL
    pair, gone, new = existed & exists, existed & ~exists, ~existed & exists

    def full(mask: np.ndarray, value: int) -> np.ndarray:
        return np.full(int(mask.sum()), value, dtype=np.int8)

    new_kind = np.where(first_kind[new] == _SNAP, _SNAP, _INS).astype(np.int8)
    source = np.concatenate([first[pair], last[pair], first[gone], last[new]])
    meta = np.concatenate([last[pair], last[pair], last[gone], last[new]])
    kind = np.concatenate([full(pair, _PRE), full(pair, _POST), full(gone, _DEL), new_kind])
    group = np.concatenate([full(pair, 1), full(pair, 1), full(gone, 0), full(new, 2)])
    image = np.concatenate([full(pair, 0), full(pair, 1), full(gone, 0), full(new, 0)])
    versions = _column(events, COMMIT_VERSION)[meta]
    later = (kind != _SNAP).astype(np.int8)
    sort = np.lexsort((image, rowids[source], group, versions, later))
    source, meta, kind = source[sort], meta[sort], kind[sort]

    out = events.take(pa.array(source))
    picked = events.select([COMMIT_VERSION, COMMIT_TIMESTAMP]).take(pa.array(meta))
    out = out.set_column(
        out.schema.get_field_index(CHANGE_TYPE), out.schema.field(CHANGE_TYPE), _kind_array(kind)
    )
    for name in (COMMIT_VERSION, COMMIT_TIMESTAMP):
        out = out.set_column(out.schema.get_field_index(name), out.schema.field(name), picked[name])
    return out


# -- carry-over filtering ----------------------------------------------------------


def _valid(array: pa.Array) -> np.ndarray:
    return cast(np.ndarray, array.is_valid().to_numpy(zero_copy_only=False))


def _all_per_row(child_equal: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per list row: are all of its `lengths[i]` child comparisons true?"""
    rows = np.repeat(np.arange(lengths.size), lengths)
    mismatches = np.bincount(rows[~child_equal], minlength=lengths.size)
    return cast(np.ndarray, mismatches == 0)


def values_equal(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Row-wise equality of two arrays of one type, nulls equal to nulls and
    NaN to NaN (a rewritten row holds the same bits), nested types included."""
    if a.type != b.type:
        raise LanceCdfError(f"internal error: comparing {a.type} with {b.type}")
    t = a.type
    if isinstance(t, pa.ExtensionType):
        return values_equal(a.storage, b.storage)
    if pa.types.is_dictionary(t):
        return values_equal(a.dictionary_decode(), b.dictionary_decode())
    valid_a, valid_b = _valid(a), _valid(b)
    both = valid_a & valid_b
    if pa.types.is_struct(t):
        same = np.ones(len(a), dtype=bool)
        for child_a, child_b in zip(a.flatten(), b.flatten(), strict=True):
            same &= values_equal(child_a, child_b)
    elif pa.types.is_map(t):
        entries = pa.list_(pa.field("entries", pa.struct([t.key_field, t.item_field]), False))
        return values_equal(a.view(entries), b.view(entries))
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        len_a = pc.list_value_length(a).fill_null(0).to_numpy(zero_copy_only=False)
        len_b = pc.list_value_length(b).fill_null(0).to_numpy(zero_copy_only=False)
        comparable = both & (len_a == len_b)
        same = np.zeros(len(a), dtype=bool)
        if comparable.any():
            mask = pa.array(comparable)
            picked_a, picked_b = a.filter(mask), b.filter(mask)
            child = values_equal(picked_a.flatten(), picked_b.flatten())
            same[comparable] = _all_per_row(child, len_a[comparable].astype(np.int64))
    else:
        if pa.types.is_float16(t):
            a, b = a.cast(pa.float32()), b.cast(pa.float32())
        try:
            same = pc.equal(a, b).fill_null(False).to_numpy(zero_copy_only=False)
        except pa.ArrowNotImplementedError:  # rare types without a kernel
            same = np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)])
        if pa.types.is_floating(a.type):
            nan = pc.and_(pc.is_nan(a), pc.is_nan(b)).fill_null(False)
            same |= nan.to_numpy(zero_copy_only=False)
    return cast(np.ndarray, (~valid_a & ~valid_b) | (both & same))


def drop_unchanged_updates(events: pa.Table) -> pa.Table:
    """`events` without the update pairs whose preimage and postimage are equal
    on every user column of `events` (carry-over rows: Lance rewrites a row on
    merge_insert even when its values match). Pairs must be adjacent, preimage
    first, as the feed and `net_changes` emit them."""
    kinds = kind_codes(events.column(CHANGE_TYPE))
    pre = np.flatnonzero(kinds == _PRE)
    if pre.size == 0:
        return events
    post = pre + 1
    rowids = _column(events, ROWID)
    if post[-1] >= events.num_rows or not (
        np.all(kinds[post] == _POST) and np.array_equal(rowids[pre], rowids[post])
    ):
        raise LanceCdfError(
            "internal error: update preimages are not each followed by their postimage; "
            "please report it with the version range read."
        )
    user = [name for name in events.column_names if name not in META_COLUMNS]
    before = events.select(user).take(pa.array(pre)).combine_chunks()
    after = events.select(user).take(pa.array(post)).combine_chunks()
    unchanged = np.ones(pre.size, dtype=bool)
    for name in user:
        unchanged &= values_equal(before.column(name).chunk(0), after.column(name).chunk(0))
    if not unchanged.any():
        return events
    keep = np.ones(events.num_rows, dtype=bool)
    keep[pre[unchanged]] = False
    keep[post[unchanged]] = False
    return events.filter(pa.array(keep))


def drop_unchanged_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`drop_unchanged_updates` batch by batch; a preimage that ends a batch
    waits for its postimage in the next one."""
    carry: pa.Table | None = None
    for batch in batches:
        table = pa.Table.from_batches([batch])
        if carry is not None:
            table, carry = pa.concat_tables([carry, table]), None
        n = table.num_rows
        if n and table.column(CHANGE_TYPE)[n - 1].as_py() == ChangeType.UPDATE_PRE:
            table, carry = table.slice(0, n - 1), table.slice(n - 1)
        kept = drop_unchanged_updates(table)
        if kept.num_rows:
            yield from kept.combine_chunks().to_batches()
    if carry is not None:
        yield from drop_unchanged_updates(carry).to_batches()


def pair_safe_batches(table: pa.Table, batch_size: int) -> Iterator[pa.RecordBatch]:
    """`table` in batches of about `batch_size` rows, never between an update's
    preimage and its postimage."""
    kinds = kind_codes(table.column(CHANGE_TYPE)) if table.num_rows else np.zeros(0)
    start, n, step = 0, table.num_rows, max(1, batch_size)
    while start < n:
        stop = min(start + step, n)
        if kinds[stop - 1] == _PRE:
            stop = stop - 1 if stop - 1 > start else stop + 1
        yield from table.slice(start, stop - start).combine_chunks().to_batches()
        start = stop
