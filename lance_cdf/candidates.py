"""Decide the moved rows a plan could not classify from manifests alone.

pylance 0.33.0 to 0.38.2 kept stable row IDs but recorded no last-updated versions, so
a row that moved to another fragment may have been updated or only moved. The plan
lists such rows as candidates (`VersionChanges.candidate_pre` / `candidate_post`);
here both images are read with *every* user column the two versions share (an update
of a column outside `columns=` is still an update) and the pairs whose values differ
in any of them become updates. Equal pairs are no event. Bulk Arrow/numpy work.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from lance_cdf.columns import FIELD_ID, is_blob, union_schema
from lance_cdf.errors import UndecidableChangeError
from lance_cdf.modes import values_equal
from lance_cdf.plan import RowSet, VersionChanges
from lance_cdf.rows import RowReader


def _undecidable(reader: RowReader, vc: VersionChanges, why: str) -> UndecidableChangeError:
    table = reader.table
    manifest = table.manifest(vc.version, operation=False)
    frags = sorted({int(f) for f in vc.candidate_post.fragment_ids})
    return UndecidableChangeError(
        f"cannot tell whether {vc.num_candidates} row(s) in fragment(s) {frags} of version "
        f"{vc.version} of {table.uri} changed: the table was written by {manifest.writer}, "
        "which moves updated rows without recording their last-updated version, and "
        f"{why}. Migrate the table: rewrite it with a current pylance "
        "(lance.write_dataset(lance.dataset(old).to_table(), new_uri, "
        "enable_stable_row_ids=True)) and read changes from the new table."
    )


def resolve_candidates(reader: RowReader, vc: VersionChanges) -> VersionChanges:
    """`vc` with its candidates decided: those whose values differ in any user column
    that both versions have join the updates (kept ordered by row ID), the rest are
    dropped. A column one version lacks (added, dropped, restored away) is never by
    itself a change: add_columns by a writer without row versions, or a restore to
    before add_columns, gives no update for a row whose other columns are equal."""
    if vc.num_candidates == 0:
        return vc
    origin = vc.read_version  # >= 1: candidates are rows present before and after
    before, after = reader.tagged(vc.read_version, origin), reader.tagged(vc.version, origin)
    both = _tokens(before) & _tokens(after)
    # the columns (and struct subfields) both versions have, as the range's union shapes them
    shared = [_shared(f, both) for f in union_schema([before, after])]
    schema = pa.schema([f for f in shared if f is not None])
    common = schema.names
    blobs = [f.name for f in schema if is_blob(f)]
    if blobs:
        raise _undecidable(
            reader, vc, f"blob column(s) {blobs} are read as descriptors, not values"
        )
    pre = reader.read(vc.candidate_pre, vc.read_version, schema).combine_chunks()
    post = reader.read(vc.candidate_post, vc.version, schema).combine_chunks()
    same = np.ones(len(vc.candidate_pre), dtype=bool)
    for name in common:
        a, b = pre.column(name), post.column(name)
        same &= values_equal(_one_chunk(a), _one_chunk(b))
    changed = np.flatnonzero(~same)
    update_pre = RowSet.concat([vc.update_pre, vc.candidate_pre.take(changed)])
    update_post = RowSet.concat([vc.update_post, vc.candidate_post.take(changed)])
    order = np.argsort(update_post.rowids, kind="stable")
    return replace(
        vc,
        update_pre=update_pre.take(order),
        update_post=update_post.take(order),
        candidate_pre=RowSet.empty(),
        candidate_post=RowSet.empty(),
    )


def _field_ids(field: pa.Field) -> set[str]:
    raw = (field.metadata or {}).get(FIELD_ID)
    return set(raw.decode().split(",")) if raw else set()


def _children(t: pa.DataType) -> list[pa.Field]:
    return [t.field(i) for i in range(t.num_fields)] if pa.types.is_struct(t) else []


def _tokens(schema: pa.Schema) -> set[str]:
    """The column tokens of every field of a tagged schema, struct subfields included."""
    out: set[str] = set()
    stack = list(schema)
    while stack:
        field = stack.pop()
        out |= _field_ids(field)
        stack += _children(field.type)
    return out


def _shared(field: pa.Field, both: set[str]) -> pa.Field | None:
    """`field` cut to the struct subfields whose tokens are in `both`; None when the field
    itself (or, for a struct, every subfield) is not."""
    if not _field_ids(field) & both:
        return None
    kids = _children(field.type)
    if not kids:
        return field
    kept = [k for k in (_shared(c, both) for c in kids) if k is not None]
    return field.with_type(pa.struct(kept)) if kept else None


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.array([], column.type)
    return pa.concat_arrays(column.chunks)
