"""Rows of a table version read by physical position: only the rows a change plan names.

The plan knows each image's (fragment, physical offset). Rows are read by that
physical position straight from the fragment's data files
(`lance.file.LanceFileReader.take_rows`, one call per data file, readers kept
open across versions: data files never change), so no deletion vector is
consulted and the cost is the rows returned. Fragments whose layout this path
does not handle (legacy files, other bases, fields it cannot map, blob columns,
newer manifest features) are read through pylance's `LanceFragment.take`, which
addresses live rows; the physical offsets are mapped to that index with the
fragment's deletion vector. Which columns a version has, and which column of one version
is which of another, is `lance_cdf.core.table_schemas`'s; columns are shaped by
`lance_cdf.core.columns`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np
import pyarrow as pa
from google.protobuf import unknown_fields

from lance_cdf.core.columns import ColumnHistory, column_sources, conform, is_blob, strip
from lance_cdf.core.plan import RowSet
from lance_cdf.core.table_schemas import KnownSchema, TableSchemas
from lance_cdf.errors import LanceCdfError, in_words
from lance_cdf.format.cache import LruCache
from lance_cdf.format.io import LocalFileSystem
from lance_cdf.format.manifest import LINEAGE_COLUMNS, FragmentInfo, Manifest
from lance_cdf.format.pools import READS
from lance_cdf.format.table import TableLog
from lance_cdf.ops import internals
from lance_cdf.ops.malloc import keep_freed_memory_if_asked

if TYPE_CHECKING:
    import lance
    import lance.file

# Open data file readers, shared by every RowReader of the process: a data file never
# changes once written (its name is unique), so a reader serves every version of a range,
# every call of a ChangeFeed and every read_changes call.
_FILES: LruCache[tuple[object, ...], FileColumns | None] = LruCache(256)
_FILES_LOCK = threading.Lock()


class _Readers:
    """Open readers of one data file, projecting the same columns, lent one per call.

    A pylance file reader serves one call at a time ("Already borrowed"); a second reader
    of the same file lets two reads of it decode at once: the chunks of a large commit's
    rows (a 100,000-row insert is two 65,536-event chunks of one file) read concurrently
    instead of one after the other (docs/benchmarks.md, "Reading rows"). A reader is
    opened only when every open one is busy, so at most as many as reads run at once (the
    read pools' threads)."""

    def __init__(
        self,
        first: lance.file.LanceFileReader,
        open_another: Callable[[], lance.file.LanceFileReader],
    ):
        self._free = [first]
        self._open = open_another
        self._lock = threading.Lock()

    @contextmanager
    def borrow(self) -> Iterator[lance.file.LanceFileReader]:
        with self._lock:
            reader = self._free.pop() if self._free else None
        if reader is None:
            reader = self._open()
        try:
            yield reader
        finally:
            with self._lock:
                self._free.append(reader)


@dataclass(frozen=True)
class FileColumns:
    """Columns read from one data file: its open readers, the names the file stores the
    columns under, and the names they have at the version read (a rename since the file
    was written changes only the latter)."""

    readers: _Readers
    stored: list[str]
    wanted: list[str]


class _Merged(NamedTuple):
    """Rows `merge_reads` read from some data files: sorted physical offsets, their rows."""

    union: np.ndarray
    table: pa.Table
    layout: list[FileColumns]  # keeps its readers open (their ids are the key)


class _ReadJob(NamedTuple):
    """One fragment's part of a read: the fragment (named in errors), and the read."""

    fragment: FragmentInfo
    read: Callable[[], pa.Table]


class RowReader:
    """Reads located rows of any table version through pylance, against the columns
    `TableSchemas` says each version has."""

    def __init__(self, table: TableLog):
        self.table = table
        self.remote = not isinstance(table.fs, LocalFileSystem)
        keep_freed_memory_if_asked()  # an opt-in (lance_cdf.ops.malloc), never a default
        self.schemas = TableSchemas(table)
        self._layouts: LruCache[tuple[object, ...], list[FileColumns] | None] = LruCache(1024)
        self._lock = threading.Lock()  # reads of one commit's images run in several threads
        # rows of several requests read together (merge_reads): per data-file reader group
        # and columns, (sorted physical offsets, their rows)
        self._merged: dict[tuple[object, ...], _Merged] = {}

    # The columns of a version (`lance_cdf.core.table_schemas`), as the reader's callers
    # (events, snapshot, candidates, feed, the Spark source) have always asked it for them
    def dataset(self, version: int) -> lance.LanceDataset:
        return self.schemas.dataset(version)

    def arrow_schema(self, version: int) -> pa.Schema:
        return self.schemas.arrow_schema(version)

    def known_schemas(self) -> list[KnownSchema]:
        return self.schemas.known_schemas()

    def learn_schemas(self, known: list[KnownSchema]) -> None:
        self.schemas.learn_schemas(known)

    def annotated(self, version: int) -> pa.Schema:
        return self.schemas.annotated(version)

    def history(self, origin: int) -> ColumnHistory:
        return self.schemas.history(origin)

    def tokens(self, version: int, origin: int) -> dict[int, str]:
        return self.schemas.tokens(version, origin)

    def tagged(self, version: int, origin: int) -> pa.Schema:
        return self.schemas.tagged(version, origin)

    def annotated_for(self, schema: pa.Schema, version: int) -> pa.Schema:
        return self.schemas.annotated_for(schema, version)

    def _columns(self, schema: pa.Schema, version: int) -> tuple[list[pa.Field | None], list[str]]:
        """Where each column of `schema` comes from at `version`, and the names of those
        read from data files (blob columns are fetched apart)."""
        sources = column_sources(schema, self.schemas.annotated_for(schema, version))
        return sources, [s.name for s in sources if s is not None and not is_blob(s)]

    def read(self, rows: RowSet, version: int, schema: pa.Schema) -> pa.Table:
        """The user columns of `rows` at `version`, in `rows` order, shaped to `schema`."""
        table, positions = self.read_unordered(rows, version, schema)
        return take(table, np.argsort(positions, kind="stable"))

    def read_unordered(
        self, rows: RowSet, version: int, schema: pa.Schema
    ) -> tuple[pa.Table, np.ndarray]:
        """The user columns of `rows` at `version` in the order they were read, and for
        each row read its index in `rows`: a caller that reorders anyway (update pairs
        are interleaved) folds both permutations into one take instead of copying twice."""
        n = len(rows)
        if n == 0:  # (may name a version that does not exist: 0)
            return strip(schema).empty_table(), np.zeros(0, dtype=np.int64)
        sources, columns = self._columns(schema, version)
        frags = self.table.manifest(version, operation=False).fragment_map
        order, chunks = _by_fragment(rows)
        got = None
        if columns:
            arrow = self.schemas.arrow_schema(version)
            manifest = self.table.manifest(version, operation=False)
            fields = [arrow.field(c) for c in columns]
            jobs: list[_ReadJob] = []
            for chunk in chunks:
                fid = int(rows.fragment_ids[chunk[0]])
                if fid not in frags:
                    raise LanceCdfError(
                        f"internal error: fragment {fid} is not in version {version} of "
                        f"{self.table.uri}; please report it with the table's _versions/ listing."
                    )
                offsets = rows.offsets[chunk]
                layout = self._layout(manifest, arrow, frags[fid], columns)
                if layout is not None:
                    read = functools.partial(self._take_merged, layout, offsets, fields)
                    jobs.append(_ReadJob(frags[fid], read))
                else:
                    logical = self.table.deletions(frags[fid]).logical_offsets(offsets)
                    gap = _window_gap(arrow, columns, self.remote)
                    fragment = self.schemas.dataset(version).get_fragment(fid)
                    if fragment is None:
                        raise LanceCdfError(
                            f"internal error: pylance has no fragment {fid} in version {version} "
                            f"of {self.table.uri} though its manifest lists it; please report it."
                        )
                    read = functools.partial(_read_fragment, fragment, logical, columns, gap)
                    jobs.append(_ReadJob(frags[fid], read))

            def read_job(job: _ReadJob) -> pa.Table:
                try:
                    return job.read()
                except (OSError, ValueError, RuntimeError, pa.ArrowException) as exc:
                    raise self.unreadable(job.fragment, version, exc) from exc

            # pylance releases the GIL while reading: fragments are read concurrently
            pieces = list(READS.map(read_job, jobs))
            got = pa.concat_tables(pieces)
        blobs = [src for src in sources if src is not None and is_blob(src)]
        if blobs:
            addresses = (
                rows.fragment_ids[order].astype(np.uint64) << np.uint64(32)
            ) | rows.offsets[order].astype(np.uint64)
            got = with_blobs(got, self.schemas.dataset(version), blobs, addresses)
        return conform(got, schema, n, sources), order

    def _take_merged(
        self, layout: list[FileColumns], offsets: np.ndarray, fields: list[pa.Field]
    ) -> pa.Table:
        """`_take_physical`, answered from rows `merge_reads` read if they hold `offsets`."""
        hit = self._merged.get(_merge_key(layout, fields)) if self._merged else None
        if hit is not None:
            at = np.searchsorted(hit.union, offsets)
            if (
                at.size
                and int(at.max()) < hit.union.size
                and np.array_equal(hit.union[at], offsets)
            ):
                return take(hit.table, at)
        return _take_physical(layout, offsets, fields)

    def merge_reads(self, requests: list[tuple[RowSet, int]], schema: pa.Schema) -> None:
        """Read the rows of several `read` requests (rows, version) that lie in the same
        data files with one take per file, kept until `drop_merged`: the reads of the
        requests are then answered from them.

        pylance reads a data file with one I/O request per chunk of a column a row needs
        unless the next chunk is adjacent; two takes of scattered rows from one large file
        (one version's pre-images, the next version's deleted rows) cost more than one
        take of both (docs/benchmarks.md, "Reading rows"). Only rows read through data
        files (not the fragment API) are merged, and only where two requests share a file.
        """
        # per data-file reader group and columns: its layout, fields, and offsets wanted
        groups: dict[
            tuple[object, ...], tuple[list[FileColumns], list[pa.Field], list[np.ndarray]]
        ] = {}
        for rows, version in requests:
            if not len(rows):
                continue  # (an empty read may name a version that does not exist: 0)
            _, columns = self._columns(schema, version)
            if not columns:
                continue
            manifest = self.table.manifest(version, operation=False)
            frags = manifest.fragment_map
            arrow = self.schemas.arrow_schema(version)
            fields = [arrow.field(c) for c in columns]
            for chunk in _by_fragment(rows)[1]:
                frag = frags.get(int(rows.fragment_ids[chunk[0]]))
                if frag is None:
                    continue  # read_unordered reports it
                layout = self._layout(manifest, arrow, frag, columns)
                if layout is not None:
                    key = _merge_key(layout, fields)
                    groups.setdefault(key, (layout, fields, []))[2].append(rows.offsets[chunk])
        jobs = [
            (key, layout, np.unique(np.concatenate(parts)), fields)
            for key, (layout, fields, parts) in groups.items()
            # dense runs are read as ranges either way: merging them only adds a copy
            if sum(_has_scattered(p) for p in parts) > 1
        ]

        def read_job(
            job: tuple[tuple[object, ...], list[FileColumns], np.ndarray, list[pa.Field]],
        ) -> pa.Table | None:
            _, layout, union, fields = job
            try:
                return _take_physical(layout, union, fields)
            except (OSError, ValueError, RuntimeError, pa.ArrowException):
                return None  # read again on its own, where the error is reported

        merged: dict[tuple[object, ...], _Merged] = {}
        for (key, layout, union, _), table in zip(jobs, READS.map(read_job, jobs), strict=True):
            if table is not None:
                merged[key] = _Merged(union, table, layout)
        self._merged = merged

    def drop_merged(self) -> None:
        self._merged = {}

    def unreadable(self, frag: FragmentInfo, version: int, exc: Exception) -> LanceCdfError:
        """A data file pylance cannot read, as an error naming it and its writer."""
        files = ", ".join(
            f"{self.table.uri}/data/{f.path} (format {f.file_major_version}.{f.file_minor_version})"
            for f in frag.proto.files
        )
        writer = self.table.manifest(version, operation=False).writer
        return LanceCdfError(
            f"pylance cannot read fragment {frag.id} of version {version} of {self.table.uri}: "
            f"data file(s) {files}; the version was written by {writer}. "
            f"({in_words(exc)[:300]}) If the file is damaged, restore it; if "
            "an old writer made it, rewrite the table with a current pylance."
        )

    def _layout(
        self, manifest: Manifest, arrow: pa.Schema, frag: FragmentInfo, columns: list[str]
    ) -> list[FileColumns] | None:
        """Per data file of `frag`, an open reader and the `columns` it holds, or
        None when the fragment must be read through pylance's fragment API."""
        key = (frag.key(), manifest.schema_key(), tuple(columns))
        with self._lock:
            if key in self._layouts:
                return self._layouts[key]
        layout: list[FileColumns] | None = None
        plan = _file_columns(manifest, frag, columns)
        if plan is not None:
            layout = []
            for path, wanted, leaf_ids in plan:
                file_columns = self._file_reader(path, wanted, arrow, manifest, leaf_ids)
                if file_columns is None:
                    layout = None
                    break
                layout.append(file_columns)
        with self._lock:
            return self._layouts.put(key, layout)

    def _file_reader(
        self,
        path: str,
        columns: list[str],
        arrow: pa.Schema,
        manifest: Manifest,
        leaf_ids: list[int],
    ) -> FileColumns | None:
        """Open readers of data file `path` projecting `columns` (names at the version
        read), with the names the file stores them under, or None when that cannot be
        told for certain or a type differs (then the fragment API reads the fragment).

        A file keeps the names its writer saw; a rename since then only changes the
        manifest. The file's columns are tied to Lance field ids through the data file's
        leaf field ids (`leaf_ids`, in column order), never through names: after two
        columns swap names, the name alone would read the other column."""
        root = self.table.fs.root if not self.remote else self.table.uri.rstrip("/")
        options = tuple(sorted(self.table.storage_options.items()))
        types = tuple(str(arrow.field(c).type) for c in columns)
        key = (root, path, tuple(columns), types, options, manifest.schema_key())
        with _FILES_LOCK:
            if key in _FILES:
                return _FILES[key]
        import lance.file  # lazily, as in dataset()

        url = f"{root}/data/{path}"
        opts = self.table.storage_options or None
        reader = None
        try:
            stored = lance.file.LanceFileReader(url, storage_options=opts).metadata().schema
            names = _stored_names(stored, leaf_ids, manifest, columns)
            if names is not None and all(
                stored.field(s).type == arrow.field(c).type
                for s, c in zip(names, columns, strict=True)
            ):

                def projected() -> lance.file.LanceFileReader:
                    return lance.file.LanceFileReader(url, storage_options=opts, columns=names)

                reader = FileColumns(_Readers(projected(), projected), names, list(columns))
        except (OSError, ValueError, KeyError):
            # a file that cannot be opened at all fails in the fragment API with its error
            reader = None
        with _FILES_LOCK:
            return _FILES.put(key, reader)


def _by_fragment(rows: RowSet) -> tuple[np.ndarray, list[np.ndarray]]:
    """The order that sorts `rows` by fragment, then physical offset, and that order cut
    into one run of positions per fragment."""
    order = np.lexsort((rows.offsets, rows.fragment_ids))
    bounds = np.flatnonzero(np.diff(rows.fragment_ids[order])) + 1
    return order, np.split(order, bounds)


def _has_scattered(offsets: np.ndarray) -> bool:
    """Whether sorted `offsets` hold rows `_take_physical` takes one by one (outside
    the dense runs it reads as ranges)."""
    if offsets.size < _MIN_RUN:
        return offsets.size > 0
    breaks = np.flatnonzero(np.diff(offsets) > _DENSE_GAP) + 1
    lengths = np.diff(np.concatenate([[0], breaks, [offsets.size]]))
    return bool((lengths < _MIN_RUN).any())


def _merge_key(layout: list[FileColumns], fields: list[pa.Field]) -> tuple[object, ...]:
    """The data files (their open readers, shared by every version) and columns a
    physical read covers: reads with equal keys return rows of the same files alike."""
    return (
        tuple(id(fc.readers) for fc in layout),
        tuple((f.name, str(f.type)) for f in fields),
    )


def _leaves(t: pa.DataType) -> int:
    """How many leaf columns Lance stores for a field of type `t`."""
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _leaves(t.value_type)
    return 1


def _stored_names(
    stored: pa.Schema, leaf_ids: list[int], manifest: Manifest, columns: list[str]
) -> list[str] | None:
    """For each of `columns` (top-level names at the version read), the top-level name
    the data file stores it under, matched by field id; None when the file's columns
    and its leaf field ids do not line up (then nothing is assumed)."""
    parent = {f.id: f.parent_id for f in manifest.fields}
    top = {f.name: f.id for f in manifest.fields if f.parent_id == -1}

    def root(fid: int) -> int | None:
        if fid in LINEAGE_IDS:  # a hidden row-lineage column (spilled): its own root
            return fid
        seen = 0
        while fid in parent and parent[fid] != -1 and seen < 64:
            fid, seen = parent[fid], seen + 1
        return fid if fid in parent else None

    by_id: dict[int, str] = {}
    at = 0
    for field in stored:
        n = _leaves(field.type)
        roots = {root(i) for i in leaf_ids[at : at + n]}
        if n == 0 or len(roots) != 1:
            return None
        (only,) = roots
        if only is None:
            return None
        by_id[only] = field.name
        at += n
    if at != len(leaf_ids):
        return None
    names: list[str] = []
    for c in columns:
        name = by_id.get(top.get(c, -1))
        if name is None:
            return None
        names.append(name)
    return names


def _file_columns(
    manifest: Manifest, frag: FragmentInfo, columns: list[str]
) -> list[tuple[str, list[str], list[int]]] | None:
    """(data file path, the `columns` it stores, its leaf field ids) for every data file of `frag`
    holding some, or None when the fragment's layout is not a plain split of
    the schema's top-level fields over Lance v2 files in the table's own base."""
    if unknown_fields.UnknownFieldSet(frag.proto):
        return None  # a manifest feature newer than this reader (e.g. overlays)
    ids = {f.id for f in manifest.fields}
    top = {f.name: f.id for f in manifest.fields if f.parent_id == -1}
    holder: dict[int, str] = {}
    leaves: dict[str, list[int]] = {}
    for df in frag.proto.files:
        leaves[df.path] = list(df.fields)
        if df.file_major_version < 2 or df.HasField("base_id"):
            return None
        stored = [f for f in df.fields if f not in LINEAGE_IDS]  # not the hidden lineage
        if not ids.issuperset(stored):
            return None  # dropped or replaced fields still stored in the file
        for field_id in stored:
            if field_id in holder:
                return None
            holder[field_id] = df.path
    plan: dict[str, list[str]] = {}
    for name in columns:
        path = holder.get(top[name]) if name in top else None
        if path is None:
            return None
        plan.setdefault(path, []).append(name)
    return [(path, names, leaves[path]) for path, names in plan.items()]


# the reserved field ids of spilled row-lineage columns in a data file's `fields`
LINEAGE_IDS = frozenset(fid for fid, _ in LINEAGE_COLUMNS.values())


# Physical reads: rows at most this far apart form a run; a run of at least _MIN_RUN rows is
# read as one range and picked in Arrow: a range costs a fraction of a take per row it
# spans, so it wins down to a density of about 1 row in 8 (docs/benchmarks.md,
# "Reading rows").
_DENSE_GAP = 8
_MIN_RUN = 64
# Rows per decoded batch: one batch of the whole selection decodes on one thread, slower
# than pylance's own batch sizes (docs/benchmarks.md, "Reading rows")
_TAKE_BATCH = 1024
_RANGE_BATCH = 8192


def _take_physical(
    layout: list[FileColumns],
    offsets: np.ndarray,
    fields: list[pa.Field],
) -> pa.Table:
    """Rows at sorted physical `offsets` of one fragment, as the columns `fields`
    in that order: one take per data file for scattered rows, ranges for dense runs."""
    offsets = offsets.astype(np.uint64)
    n = int(offsets.size)
    breaks = np.flatnonzero(np.diff(offsets) > _DENSE_GAP) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [n]])
    runs = [(int(s), int(e)) for s, e in zip(starts, ends, strict=True) if e - s >= _MIN_RUN]
    if runs:
        in_run = np.zeros(n, dtype=bool)
        for s, e in runs:
            in_run[s:e] = True
        scattered = np.flatnonzero(~in_run)
        order = np.concatenate([np.arange(s, e) for s, e in runs] + [scattered])
    got_columns: dict[str, pa.ChunkedArray] = {}
    by_name = {f.name: f for f in fields}
    for fc in layout:
        as_read = dict(zip(fc.stored, fc.wanted, strict=True))
        max_rows = _max_rows([by_name[w] for w in fc.wanted])
        with fc.readers.borrow() as reader:  # one call at a time (pylance: "Already borrowed")
            inner = internals.raw_file_reader(reader)
            if not runs:
                got = _file_take(reader, inner, offsets, max_rows)
            else:
                parts = []
                for s, e in runs:
                    lo, hi = int(offsets[s]), int(offsets[e - 1])
                    rng = _file_range(reader, inner, lo, hi - lo + 1, max_rows)
                    if hi - lo + 1 != e - s:  # a contiguous run is the range itself
                        rng = rng.take(pa.array(offsets[s:e] - np.uint64(lo)))
                    parts.append(rng)
                if scattered.size:
                    parts.append(_file_take(reader, inner, offsets[scattered], max_rows))
                got = take(pa.concat_tables(parts), np.argsort(order, kind="stable"))
        got_columns.update(
            (as_read[name], col) for name, col in zip(got.column_names, got.columns, strict=True)
        )
    return pa.Table.from_arrays([got_columns[f.name] for f in fields], schema=pa.schema(fields))


# At most about this many bytes of one column per read call. pylance decodes a call's
# rows into one buffer per column sized for all of them; past glibc's largest mmap
# threshold (32 MiB) such a buffer is fresh memory from the kernel every time, and its
# page faults cost more than the decode (docs/benchmarks.md, "Reading rows"). Smaller
# calls (8 MiB) decode faster still, once glibc keeps their buffers (`lance_cdf.ops.malloc`).
_MAX_READ_BYTES = 8 << 20


def _max_rows(fields: list[pa.Field]) -> int:
    """Rows per read call for columns `fields` (see _MAX_READ_BYTES)."""
    widest = max((_value_bytes(f.type) for f in fields), default=1)
    return max(_TAKE_BATCH, _MAX_READ_BYTES // max(widest, 1))


def _file_take(
    reader: lance.file.LanceFileReader,
    inner: internals.RawFileReader | None,
    offsets: np.ndarray,
    max_rows: int,
) -> pa.Table:
    if offsets.size > max_rows:
        return pa.concat_tables(
            [
                _file_take(reader, inner, offsets[at : at + max_rows], max_rows)
                for at in range(0, offsets.size, max_rows)
            ]
        )
    if inner is not None:  # the public take_rows checks the order row by row in Python
        return inner.take_rows(offsets, _TAKE_BATCH, 16).read_all()
    return reader.take_rows(offsets.tolist()).to_table()


def _file_range(
    reader: lance.file.LanceFileReader,
    inner: internals.RawFileReader | None,
    start: int,
    count: int,
    max_rows: int,
) -> pa.Table:
    if count > max_rows:
        return pa.concat_tables(
            [
                _file_range(reader, inner, at, min(max_rows, start + count - at), max_rows)
                for at in range(start, start + count, max_rows)
            ]
        )
    if inner is not None:
        return inner.read_range(start, count, _RANGE_BATCH, 16).read_all()
    return reader.read_range(start, count).to_table()


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
        return cast(int, t.list_size) * _value_bytes(t.value_type)
    if pa.types.is_struct(t):
        return sum(_value_bytes(f.type) for f in t)
    try:
        return max(cast(int, t.bit_width) // 8, 1)
    except ValueError:
        return 64


def _read_fragment(
    fragment: lance.LanceFragment, logical: np.ndarray, columns: list[str], gap: int
) -> pa.Table:
    """Rows at sorted live-row indices `logical` of one fragment.

    `LanceFragment.take` is slow per row on a fragment with a deletion
    file (it resolves every index through the deletion vector), while a range
    scan (`to_table(offset=, limit=)`) streams. Dense selections -- a new
    fragment of inserts, a block of updated rows -- are read as a few ranges
    and picked in Arrow; scattered ones fall back to take(). On object storage
    `gap` is wider: a round trip costs more than the bytes in between
    (docs/benchmarks.md, "Reading rows").
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
    return take(pa.concat_tables(parts), np.concatenate(picks))


def take(table: pa.Table, indices: np.ndarray) -> pa.Table:
    """`table.take(indices)`, skipping the identity and contiguous chunks first
    (Arrow's take over many chunks is slower than over one)."""
    if indices.size == table.num_rows and np.array_equal(indices, np.arange(indices.size)):
        return table
    return table.combine_chunks().take(pa.array(indices))


def with_blobs(
    table: pa.Table | None, ds: lance.LanceDataset, blobs: list[pa.Field], addresses: np.ndarray
) -> pa.Table:
    """`table` plus the bytes of blob columns `blobs` at row `addresses` (fragment id
    << 32 | physical offset), read with pylance's take_blobs; a null blob stays null."""
    n = int(addresses.size)
    base = table if table is not None else pa.table({"_": pa.nulls(n)}).drop_columns(["_"])
    for field in blobs:
        files = ds.take_blobs(field.name, addresses=pa.array(addresses, pa.uint64()))
        values = pa.array(
            [None if f is None else f.readall() for f in files], pa.large_binary()
        )  # one object per blob: pylance hands blobs out one file at a time
        base = base.append_column(field.name, values)
    return base
