"""Decide the moved rows a plan could not classify from manifests alone.

pylance 0.33.0 to 0.38.2 kept stable row IDs but recorded no last-updated versions, so
a row that moved to another fragment may have been updated or only moved. The plan
lists such rows as candidates (`VersionChanges.candidate_pre` / `candidate_post`);
here both images are read with *every* user column of the later version (an update
of a column outside `columns=` is still an update; a column the earlier version lacks
reads as null there) and the pairs whose values differ in any of them become updates.
Equal pairs are no event. Bulk Arrow/numpy work.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from lance_cdf.core.columns import FIELD_ID, is_blob, union_schema
from lance_cdf.core.modes import values_equal
from lance_cdf.core.plan import RowSet, VersionChanges
from lance_cdf.core.rows import RowReader
from lance_cdf.errors import UndecidableChangeError


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
    """`vc` with its candidates decided: those whose values differ in any user column of
    the later version join the updates (kept ordered by row ID), the rest are dropped.
    The row is compared as the later version presents it: a column the earlier version
    lacks reads as null there (add_columns without row versions: an update where the
    new column holds a value, none where it is null, as Lance's own all-null
    add_columns), and a column the later version lacks is no change at all (a restore
    to before add_columns gives none, as drop_columns) — so a column's presence alone
    is never a change, while the values a consumer has not seen always are."""
    if vc.num_candidates == 0:
        return vc
    origin = vc.read_version  # >= 1: candidates are rows present before and after
    before, after = reader.tagged(vc.read_version, origin), reader.tagged(vc.version, origin)
    later = _tokens(after)
    # the later version's columns (and struct subfields), as the range's union shapes them
    shared = [_shared(f, later) for f in union_schema([before, after])]
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


def _shared(field: pa.Field, kept_tokens: set[str]) -> pa.Field | None:
    """`field` cut to the struct subfields whose tokens are in `kept_tokens`; None when
    the field itself (or, for a struct, every subfield) is not."""
    if not _field_ids(field) & kept_tokens:
        return None
    kids = _children(field.type)
    if not kids:
        return field
    kept = [k for k in (_shared(c, kept_tokens) for c in kids) if k is not None]
    return field.with_type(pa.struct(kept)) if kept else None


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.array([], column.type)
    return pa.concat_arrays(column.chunks)
