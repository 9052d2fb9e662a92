"""The table as it stood at one version, as `snapshot` events: the bootstrap a
replica starts from before it follows the changes of the next versions.

A snapshot needs only the manifest and data of its own version, so it works
when the table's first versions were removed by `cleanup_old_versions`. It is
addressed by fragment (in manifest order) and live-row offset within the
fragment, so it can be read in slices (Spark partitions, micro-batches) that
together are exactly the table, in a deterministic order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from lance_cdf.core.change_types import ChangeType
from lance_cdf.core.columns import column_sources, conform, is_blob
from lance_cdf.core.events import ROWID, constant, with_meta
from lance_cdf.core.rows import RowReader, with_blobs
from lance_cdf.errors import LanceCdfError

ROWADDR = "_rowaddr"


@dataclass(frozen=True)
class SnapshotFragment:
    """One fragment of a snapshot version: its ID and its live (undeleted) rows."""

    fragment_id: int
    rows: int


def snapshot_fragments(reader: RowReader, version: int) -> list[SnapshotFragment]:
    """The fragments of `version` in manifest order, with their live row counts
    (from the manifest and deletion files; no data is read)."""
    table = reader.table
    return [
        SnapshotFragment(f.id, f.physical_rows - len(table.deletions(f)))
        for f in table.manifest(version).fragments
    ]


def read_snapshot(
    reader: RowReader,
    version: int,
    schema: pa.Schema,
    fragment_id: int | None = None,
    offset: int = 0,
    limit: int | None = None,
    batch_size: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """Snapshot events of `version`: every live row (or, with `fragment_id`,
    rows `offset`..`offset + limit` of that fragment's live rows) with the user
    columns of `schema`, `_change_type="snapshot"` and `_commit_version=version`."""
    manifest = reader.table.manifest(version)
    sources = column_sources(schema, reader.annotated_for(schema, version))
    columns = [f.name for f in sources if f is not None and not is_blob(f)]
    blobs = [f for f in sources if f is not None and is_blob(f)]
    ds = reader.dataset(version)
    slices: list[tuple[int, int, int | None]]  # (fragment id, first live row, rows: None all)
    if fragment_id is None:
        slices = [(f.id, 0, None) for f in manifest.fragments]
    else:
        slices = [(fragment_id, offset, limit)]
    for fid, start, count in slices:
        if count == 0:
            continue
        fragment = ds.get_fragment(fid)
        if fragment is None:
            raise LanceCdfError(
                f"version {version} of {reader.table.uri} has no fragment {fid}; "
                "take fragment ids from snapshot_fragments() of the same version."
            )
        scanner = fragment.scanner(
            columns=columns,
            with_row_id=True,
            with_row_address=bool(blobs),
            offset=start or None,
            limit=count,
            batch_size=max(1, batch_size),
        )
        for batch in scanner.to_batches():
            if batch.num_rows == 0:
                continue
            rows = pa.Table.from_batches([batch])
            user = rows.drop_columns([ROWID])
            if blobs:
                addresses = rows.column(ROWADDR).to_numpy()
                user = with_blobs(user.drop_columns([ROWADDR]), ds, blobs, addresses)
            user = conform(user, schema, rows.num_rows, sources)
            rowids = rows.column(ROWID).combine_chunks()
            kinds = constant(ChangeType.SNAPSHOT, rows.num_rows)
            yield from with_meta(user, rowids, kinds, version, manifest.timestamp_us).to_batches()
