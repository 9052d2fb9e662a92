"""Read the rows a change plan names, and only those, into Arrow change events.

Rows are fetched per fragment with pylance's `LanceFragment.take`, which
addresses live rows by their index among live rows; the physical offsets of the
plan are mapped to that index with the fragment's deletion vector.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.cache import LruCache
from lance_cdf.errors import LanceCdfError

if TYPE_CHECKING:
    import lance
from lance_cdf.format.io import LocalFileSystem
from lance_cdf.format.table import TableLog
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
SNAPSHOT = "snapshot"  # a row of the table as it stood at the snapshot version
CHANGE_TYPES = (INSERT, UPDATE_PRE, UPDATE_POST, DELETE)
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lance-cdf-read")
# chunk-level lookahead; separate from _POOL so a chunk never waits on its own pool
_PREFETCH = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lance-cdf-prefetch")


class RowReader:
    """Reads located rows of any table version through pylance."""

    def __init__(self, table: TableLog):
        self.table = table
        self.remote = not isinstance(table.fs, LocalFileSystem)
        self._datasets: LruCache = LruCache(4)
        self._schemas: dict[bytes, pa.Schema] = {}

    def dataset(self, version: int) -> lance.LanceDataset:
        # imported here: pylance takes seconds to import, and the processes that only plan
        # (Spark's driver-side source worker) or publish (the Kafka sink) never read rows
        import lance

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
        key = self.table.manifest(version, operation=False).schema_key()
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
        frags = {f.id: f for f in self.table.manifest(version, operation=False).fragments}
        order = np.lexsort((rows.offsets, rows.fragment_ids))
        fids = rows.fragment_ids[order]
        bounds = np.flatnonzero(np.diff(fids)) + 1
        got = None
        if columns:
            gap = _window_gap(self.arrow_schema(version), columns, self.remote)
            ds = self.dataset(version)
            jobs = []
            for chunk in np.split(order, bounds):
                fid = int(rows.fragment_ids[chunk[0]])
                if fid not in frags:
                    raise LanceCdfError(
                        f"internal error: fragment {fid} is not in version {version} of "
                        f"{self.table.uri}; please report it with the table's _versions/ listing."
                    )
                logical = self.table.deletions(frags[fid]).logical_offsets(rows.offsets[chunk])
                jobs.append((ds.get_fragment(fid), logical))
            # pylance releases the GIL while reading: fragments are read concurrently
            pieces = list(_POOL.map(lambda job: _read_fragment(*job, columns, gap), jobs))
            got = _take(pa.concat_tables(pieces), np.argsort(order, kind="stable"))
        return conform(got, schema, n)


# Rows closer than this are read as one contiguous range rather than taken one by one.
_WINDOW_GAP = 64
# On object storage every take is a round trip per row and column: rows closer than this
# many bytes are read as one range (about what S3 streams in the latency of one request).
_REMOTE_GAP_BYTES = 1 << 20
# At most this many ranges per fragment; sparser selections use take().
_MAX_WINDOWS = 32


def _window_gap(schema: pa.Schema, columns: list[str], remote: bool) -> int:
    """Rows between two wanted rows that are cheaper to read than to skip."""
    if not remote:
        return _WINDOW_GAP
    row_bytes = sum(_value_bytes(schema.field(c).type) for c in columns)
    return max(_WINDOW_GAP, _REMOTE_GAP_BYTES // max(row_bytes, 1))


def _value_bytes(t: pa.DataType) -> int:
    """A rough size of one value (variable-width types: a guess)."""
    if pa.types.is_fixed_size_list(t):
        return t.list_size * _value_bytes(t.value_type)
    if pa.types.is_struct(t):
        return sum(_value_bytes(f.type) for f in t)
    try:
        return max(t.bit_width // 8, 1)
    except ValueError:
        return 64


def _read_fragment(fragment, logical: np.ndarray, columns: list[str], gap: int) -> pa.Table:
    """Rows at sorted live-row indices `logical` of one fragment.

    `LanceFragment.take` costs ~20 us per row on a fragment with a deletion
    file (it resolves every index through the deletion vector), while a range
    scan (`to_table(offset=, limit=)`) streams. Dense selections -- a new
    fragment of inserts, a block of updated rows -- are read as a few ranges
    and picked in Arrow; scattered ones fall back to take(). On object storage
    `gap` is wider: a round trip costs more than the bytes in between.
    """
    breaks = np.flatnonzero(np.diff(logical) > gap) + 1
    if breaks.size >= _MAX_WINDOWS:
        return fragment.take(logical, columns=columns)
    parts, picks, base = [], [], 0
    for window in np.split(logical, breaks):
        lo, hi = int(window[0]), int(window[-1])
        parts.append(fragment.to_table(columns=columns, offset=lo, limit=hi - lo + 1))
        picks.append(window - lo + base)
        base += hi - lo + 1
    return _take(pa.concat_tables(parts), np.concatenate(picks))


def _take(table: pa.Table, indices: np.ndarray) -> pa.Table:
    """`table.take(indices)`, skipping the identity and contiguous chunks first
    (Arrow's take over many chunks is several times slower than over one)."""
    if indices.size == table.num_rows and np.array_equal(indices, np.arange(indices.size)):
        return table
    return table.combine_chunks().take(pa.array(indices))


def conform(table: pa.Table | None, schema: pa.Schema, n: int) -> pa.Table:
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


def with_meta(
    table: pa.Table, rowids, change_types: pa.Array, version: int, timestamp_us: int
) -> pa.Table:
    """`table`'s user columns plus the four metadata columns."""
    n = table.num_rows
    meta = [
        pa.array(rowids, pa.uint64()),
        change_types,
        pa.array(np.full(n, version, dtype=np.int64)),
        pa.array(np.full(n, timestamp_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
    ]
    return pa.Table.from_arrays(list(table.columns) + meta, schema=event_schema(table.schema))


def _with_meta(
    table: pa.Table, rowids: np.ndarray, change_types: pa.Array, vc: VersionChanges
) -> pa.Table:
    return with_meta(table, rowids, change_types, vc.version, vc.timestamp_us)


def constant(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), [value]).cast(pa.string())


def _event_chunks(reader: RowReader, vc: VersionChanges, schema: pa.Schema, step: int):
    """(reads, assemble) per output chunk, in output order: `reads` are callables
    fetching row images, `assemble` turns their results into one event table."""

    def read(rows: RowSet, version: int):
        return lambda: reader.read(rows, version, schema)

    def single(rows: RowSet, kind: str):
        return lambda got: _with_meta(got, rows.rowids, constant(kind, len(rows)), vc)

    def pairs(post_rows: RowSet):
        def assemble(pre: pa.Table, post: pa.Table) -> pa.Table:
            n = pre.num_rows
            interleave = np.empty(2 * n, dtype=np.int64)
            interleave[0::2] = np.arange(n)
            interleave[1::2] = np.arange(n) + n
            # one chunk: a single pair's take is the identity and would keep pre and
            # post in two chunks, i.e. two batches
            both = _take(pa.concat_tables([pre, post]), interleave).combine_chunks()
            kinds = np.tile(np.array([UPDATE_PRE, UPDATE_POST], dtype=object), n)
            return _with_meta(
                both, np.repeat(post_rows.rowids, 2), pa.array(kinds, pa.string()), vc
            )

        return assemble

    for start in range(0, len(vc.deleted), step):
        rows = vc.deleted.take(slice(start, start + step))
        yield [read(rows, vc.read_version)], single(rows, DELETE)
    half = max(1, step // 2)
    for start in range(0, len(vc.update_post), half):
        pre, post = (
            vc.update_pre.take(slice(start, start + half)),
            vc.update_post.take(slice(start, start + half)),
        )
        yield [read(pre, vc.read_version), read(post, vc.version)], pairs(post)
    for start in range(0, len(vc.inserted), step):
        rows = vc.inserted.take(slice(start, start + step))
        yield [read(rows, vc.version)], single(rows, INSERT)


# Row reads in flight at once while events are consumed: bounds memory to a few batches.
_LOOKAHEAD = 4


def read_version_events(
    reader: RowReader, vc: VersionChanges, schema: pa.Schema, batch_size: int = 65536
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one commit's events: deletes, then update pre/post pairs
    (adjacent, pre first), then inserts, each group ordered by row ID.

    Up to `_LOOKAHEAD` row reads run ahead of the consumer, so the images of a
    commit (deletes, pre-images, post-images, inserts) are fetched concurrently.
    """
    window: deque = deque()
    in_flight = 0
    for reads, assemble in _event_chunks(reader, vc, schema, max(1, batch_size)):
        window.append(([_PREFETCH.submit(r) for r in reads], assemble))
        in_flight += len(reads)
        while in_flight >= _LOOKAHEAD:
            futures, done = window.popleft()
            in_flight -= len(futures)
            yield from done(*(f.result() for f in futures)).to_batches()
    while window:
        futures, done = window.popleft()
        yield from done(*(f.result() for f in futures)).to_batches()
