"""Decide the moved rows a plan could not classify from manifests alone.

pylance 0.33.0 to 0.38.2 kept stable row IDs but recorded no last-updated versions, so
a row that moved to another fragment may have been updated or only moved. The plan
lists such rows as candidates (`VersionChanges.candidate_pre` / `candidate_post`);
here both images are read with *every* user column of the two versions (an update
of a column outside `columns=` is still an update) and the pairs whose values differ
in any column become updates. Equal pairs are no event. Bulk Arrow/numpy work.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from lance_cdf.columns import union_schema
from lance_cdf.errors import UndecidableChangeError
from lance_cdf.modes import values_equal
from lance_cdf.plan import RowSet, VersionChanges
from lance_cdf.rows import RowReader

BLOB_KEY = b"lance-encoding:blob"


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
    join the updates (kept ordered by row ID), the rest are dropped."""
    if vc.num_candidates == 0:
        return vc
    schema = union_schema([reader.arrow_schema(vc.read_version), reader.arrow_schema(vc.version)])
    blobs = [f.name for f in schema if (f.metadata or {}).get(BLOB_KEY)]
    if blobs:
        raise _undecidable(
            reader, vc, f"blob column(s) {blobs} are read as descriptors, not values"
        )
    pre = reader.read(vc.candidate_pre, vc.read_version, schema).combine_chunks()
    post = reader.read(vc.candidate_post, vc.version, schema).combine_chunks()
    same = np.ones(pre.num_rows, dtype=bool)
    for name in schema.names:
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


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.array([], column.type)
    return pa.concat_arrays(column.chunks)
