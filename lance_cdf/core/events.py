"""Change events: one commit's row images, read by `lance_cdf.core.rows`, as Arrow batches
with the four metadata columns (`_rowid`, `_change_type`, `_commit_version`,
`_commit_timestamp`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from lance_cdf.core.change_types import ChangeType
from lance_cdf.core.columns import strip
from lance_cdf.core.plan import RowSet, VersionChanges
from lance_cdf.core.rows import RowReader, take
from lance_cdf.format.pools import PREFETCH

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

# rows as `RowReader.read_unordered` returns them: in read order, and each one's index
_Image = tuple[pa.Table, np.ndarray]


class _Chunk(NamedTuple):
    """One output chunk of a commit's events: the row reads it needs, and how their
    results (in `reads` order) become its event table."""

    reads: list[Callable[[], _Image]]
    assemble: Callable[..., pa.Table]  # one _Image per read


def event_schema(user_schema: pa.Schema) -> pa.Schema:
    return pa.schema(list(strip(user_schema)) + META_FIELDS)


def with_meta(
    table: pa.Table,
    rowids: np.ndarray | pa.Array,
    change_types: pa.Array,
    version: int,
    timestamp_us: int,
) -> pa.Table:
    """`table`'s user columns plus the four metadata columns."""
    n = len(change_types)  # `table` may have no columns (columns=[]): no row count then
    meta = [
        pa.array(rowids, pa.uint64()),
        change_types,
        pa.array(np.full(n, version, dtype=np.int64)),
        _fixed(pa.timestamp("us", tz="UTC"), np.full(n, timestamp_us, dtype=np.int64)),
    ]
    return pa.Table.from_arrays(list(table.columns) + meta, schema=event_schema(table.schema))


def _with_meta(
    table: pa.Table, rowids: np.ndarray, change_types: pa.Array, vc: VersionChanges
) -> pa.Table:
    return with_meta(table, rowids, change_types, vc.version, vc.timestamp_us)


def _fixed(type_: pa.DataType, values: np.ndarray) -> pa.Array:
    """An Arrow array of `type_` over the int64 `values` as they are (no cast kernel)."""
    return pa.Array.from_buffers(type_, values.size, [None, pa.py_buffer(values)])


def constant(value: str, n: int) -> pa.Array:
    """`value` n times as a string array, built from its buffers (a dictionary cast costs
    more: docs/benchmarks.md, "Reading rows")."""
    data = value.encode()
    if n * len(data) >= 2**31:
        return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), [value]).cast(pa.string())
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(data))
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)]
    )


def _pair_kinds(n: int) -> pa.Array:
    """update_preimage, update_postimage, ... for n pairs (built in Arrow: a numpy array
    of Python strings is slow to convert; docs/benchmarks.md, "Reading rows")."""
    codes = np.tile(np.array([0, 1], dtype=np.int32), n)
    return pa.DictionaryArray.from_arrays(
        codes, [ChangeType.UPDATE_PRE, ChangeType.UPDATE_POST]
    ).cast(pa.string())


def _event_chunks(
    reader: RowReader, vc: VersionChanges, schema: pa.Schema, step: int
) -> Iterator[_Chunk]:
    """The output chunks in output order: `reads` are callables fetching row images,
    `assemble` turns their results into one event table."""

    def read(rows: RowSet, version: int) -> Callable[[], _Image]:
        return lambda: reader.read_unordered(rows, version, schema)

    def single(rows: RowSet, kind: str) -> Callable[[_Image], pa.Table]:
        def assemble(got: _Image) -> pa.Table:
            table, positions = got
            table = take(table, np.argsort(positions, kind="stable"))
            return _with_meta(table, rows.rowids, constant(kind, len(rows)), vc)

        return assemble

    def pairs(post_rows: RowSet) -> Callable[[_Image, _Image], pa.Table]:
        def assemble(pre: _Image, post: _Image) -> pa.Table:
            (pre_t, pre_at), (post_t, post_at) = pre, post
            n = pre_t.num_rows
            # row i of pre+post goes to 2 * (its index in the plan), + 1 for a post-image:
            # the read order and the interleaving in one take
            dest = np.concatenate([2 * pre_at, 2 * post_at + 1])
            interleave = np.empty(2 * n, dtype=np.int64)
            interleave[dest] = np.arange(2 * n)
            # one chunk: a single pair's take is the identity and would keep pre and
            # post in two chunks, i.e. two batches
            both = take(pa.concat_tables([pre_t, post_t]), interleave).combine_chunks()
            return _with_meta(both, np.repeat(post_rows.rowids, 2), _pair_kinds(n), vc)

        return assemble

    for start in range(0, len(vc.deleted), step):
        rows = vc.deleted.take(slice(start, start + step))
        yield _Chunk([read(rows, vc.read_version)], single(rows, ChangeType.DELETE))
    half = max(1, step // 2)
    for start in range(0, len(vc.update_post), half):
        pre, post = (
            vc.update_pre.take(slice(start, start + half)),
            vc.update_post.take(slice(start, start + half)),
        )
        yield _Chunk([read(pre, vc.read_version), read(post, vc.version)], pairs(post))
    for start in range(0, len(vc.inserted), step):
        rows = vc.inserted.take(slice(start, start + step))
        yield _Chunk([read(rows, vc.version)], single(rows, ChangeType.INSERT))


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
    window: deque[tuple[list[Future[_Image]], Callable[..., pa.Table]]] = deque()
    in_flight = 0
    for reads, assemble in _event_chunks(reader, vc, schema, max(1, batch_size)):
        window.append(([PREFETCH.submit(r) for r in reads], assemble))
        in_flight += len(reads)
        while in_flight >= _LOOKAHEAD:
            futures, done = window.popleft()
            in_flight -= len(futures)
            yield from done(*(f.result() for f in futures)).to_batches()
    while window:
        futures, done = window.popleft()
        yield from done(*(f.result() for f in futures)).to_batches()
