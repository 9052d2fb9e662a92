"""Read the rows a change plan names, and only those, into Arrow change events.

Rows are fetched per fragment with pylance's `LanceFragment.take`, which
addresses live rows by their index among live rows; the physical offsets of the
plan are mapped to that index with the fragment's deletion vector.
"""

from __future__ import annotations

from collections.abc import Iterator

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.errors import LanceCdfError
from lance_cdf.format.table import TableLog, _Lru
from lance_cdf.plan import RowSet, VersionChanges

ROWID = "_rowid"
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
META_FIELDS = [
    pa.field(ROWID, pa.uint64(), nullable=False),
    pa.field(CHANGE_TYPE, pa.string(), nullable=False),
    pa.field(COMMIT_VERSION, pa.int64(), nullable=False),
    pa.field(COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC"), nullable=False),
]
META_COLUMNS = [f.name for f in META_FIELDS]
INSERT, DELETE = "insert", "delete"
UPDATE_PRE, UPDATE_POST = "update_preimage", "update_postimage"
CHANGE_TYPES = (INSERT, UPDATE_PRE, UPDATE_POST, DELETE)


class RowReader:
    """Reads located rows of any table version through pylance."""

    def __init__(self, table: TableLog):
        self.table = table
        self._datasets: _Lru = _Lru(4)
        self._schemas: dict[bytes, pa.Schema] = {}

    def dataset(self, version: int) -> lance.LanceDataset:
        ds = self._datasets.get(version)
        if ds is None:
            try:
                ds = lance.dataset(
                    self.table.uri, version=version, storage_options=self.table.storage_options
                )
            except Exception as exc:
                if self.table.has_version(version):
                    raise
                raise self.table.missing_version_error(version) from exc
            self._datasets.put(version, ds)
        return ds

    def arrow_schema(self, version: int) -> pa.Schema:
        """The table's Arrow schema at a version (cached per distinct schema)."""
        key = self.table.manifest(version).schema_key()
        schema = self._schemas.get(key)
        if schema is None:
            schema = self._schemas[key] = self.dataset(version).schema
        return schema

    def read(self, rows: RowSet, version: int, schema: pa.Schema) -> pa.Table:
        """The user columns of `rows` at `version`, in `rows` order, shaped to `schema`."""
        present = set(self.arrow_schema(version).names)
        columns = [name for name in schema.names if name in present]
        n = len(rows)
        if n == 0:
            return schema.empty_table()
        frags = {f.id: f for f in self.table.manifest(version).fragments}
        order = np.lexsort((rows.offsets, rows.fragment_ids))
        fids = rows.fragment_ids[order]
        bounds = np.flatnonzero(np.diff(fids)) + 1
        pieces = []
        for chunk in np.split(order, bounds):
            fid = int(rows.fragment_ids[chunk[0]])
            frag = frags.get(fid)
            if frag is None:
                raise LanceCdfError(
                    f"internal error: fragment {fid} is not in version {version} of "
                    f"{self.table.uri}; please report this with the table's _versions/ listing."
                )
            logical = self.table.deletions(frag).logical_offsets(rows.offsets[chunk])
            if columns:
                pieces.append(
                    self.dataset(version).get_fragment(fid).take(logical, columns=columns)
                )
        if columns:
            got = pa.concat_tables(pieces).take(pa.array(np.argsort(order, kind="stable")))
        else:
            got = None
        return _conform(got, schema, n)


def _conform(table: pa.Table | None, schema: pa.Schema, n: int) -> pa.Table:
    """Shape `table` to `schema`: missing columns become nulls, types are cast."""
    arrays = []
    for field in schema:
        if table is not None and field.name in table.column_names:
            col = table.column(field.name)
            if col.type != field.type:
                try:
                    col = pc.cast(col, field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise LanceCdfError(
                        f"column {field.name!r} changed type to {field.type} within the "
                        f"requested range and older values ({col.type}) cannot be cast ({exc}); "
                        "read the range before and after the type change separately."
                    ) from None
            arrays.append(col)
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def union_schema(schemas: list[pa.Schema]) -> pa.Schema:
    """Columns of all `schemas` (oldest first): the newest type and position win,
    columns dropped along the way follow; a column missing anywhere is nullable."""
    fields: dict[str, pa.Field] = {}
    for schema in reversed(schemas):
        for field in schema:
            if field.name not in fields:
                fields[field.name] = field
    everywhere = set.intersection(*(set(s.names) for s in schemas)) if schemas else set()
    return pa.schema(
        [f if f.name in everywhere else f.with_nullable(True) for f in fields.values()]
    )


def event_schema(user_schema: pa.Schema) -> pa.Schema:
    return pa.schema(list(user_schema) + META_FIELDS)


def _with_meta(
    table: pa.Table, rowids: np.ndarray, change_types: pa.Array, vc: VersionChanges
) -> pa.Table:
    n = table.num_rows
    meta = [
        pa.array(rowids, pa.uint64()),
        change_types,
        pa.array(np.full(n, vc.version, dtype=np.int64)),
        pa.array(np.full(n, vc.timestamp_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
    ]
    return pa.Table.from_arrays(list(table.columns) + meta, schema=event_schema(table.schema))


def _constant(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), [value]).cast(pa.string())


def read_version_events(
    reader: RowReader, vc: VersionChanges, schema: pa.Schema, batch_size: int = 65536
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one commit's events: deletes, then update pre/post pairs
    (adjacent, pre first), then inserts, each group ordered by row ID."""
    step = max(1, batch_size)
    for start in range(0, len(vc.deleted), step):
        rows = vc.deleted.take(slice(start, start + step))
        got = reader.read(rows, vc.read_version, schema)
        yield from _with_meta(got, rows.rowids, _constant(DELETE, len(rows)), vc).to_batches()
    pair_step = max(1, step // 2)
    for start in range(0, len(vc.update_post), pair_step):
        pre_rows = vc.update_pre.take(slice(start, start + pair_step))
        post_rows = vc.update_post.take(slice(start, start + pair_step))
        pre = reader.read(pre_rows, vc.read_version, schema)
        post = reader.read(post_rows, vc.version, schema)
        n = len(pre_rows)
        interleave = np.empty(2 * n, dtype=np.int64)
        interleave[0::2] = np.arange(n)
        interleave[1::2] = np.arange(n) + n
        both = pa.concat_tables([pre, post]).take(pa.array(interleave))
        kinds = pa.array(np.tile(np.array([UPDATE_PRE, UPDATE_POST], dtype=object), n), pa.string())
        rowids = np.repeat(post_rows.rowids, 2)
        yield from _with_meta(both, rowids, kinds, vc).to_batches()
    for start in range(0, len(vc.inserted), step):
        rows = vc.inserted.take(slice(start, start + step))
        got = reader.read(rows, vc.version, schema)
        yield from _with_meta(got, rows.rowids, _constant(INSERT, len(rows)), vc).to_batches()
