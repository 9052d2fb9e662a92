"""How a read's changes are cut into Spark partitions: small commits packed together, a large
one cut into row ranges, a snapshot into fragment ranges, net changes bucketed by row ID."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

from lance_cdf.core.plan import RowSet, VersionChanges
from lance_cdf.core.snapshot import SnapshotFragment
from lance_cdf.spark.source.partitions import (
    ChangeSlices,
    NetSlice,
    SnapshotSlice,
)

# Versions packed into one partition at most (each is re-planned by the executor).
MAX_SEGMENTS_PER_PARTITION = 1024


def pack(sizes: Iterable[tuple[int, int]], rows_per_partition: int) -> list[ChangeSlices]:
    """Partitions for `(version, changed rows)` in version order: consecutive
    small versions share a partition, a big one is split into row ranges."""
    out: list[ChangeSlices] = []
    current: list[tuple[int, int, int]] = []
    filled = 0
    for version, rows in sizes:
        if rows > rows_per_partition:
            if current:
                out.append(ChangeSlices(tuple(current)))
                current, filled = [], 0
            parts = math.ceil(rows / rows_per_partition)
            out.extend(ChangeSlices(((version, p, parts),)) for p in range(parts))
            continue
        if current and (
            filled + rows > rows_per_partition or len(current) >= MAX_SEGMENTS_PER_PARTITION
        ):
            out.append(ChangeSlices(tuple(current)))
            current, filled = [], 0
        current.append((version, 0, 1))
        filled += rows
    if current:
        out.append(ChangeSlices(tuple(current)))
    return out


def cut(vc: VersionChanges, part: int, parts: int) -> VersionChanges:
    """Part `part` of `parts` of one version's changes (an update's two images
    stay together: pre- and post-images are cut at the same positions)."""
    if parts == 1:
        return vc

    def share(rows: RowSet) -> RowSet:
        n = len(rows)
        return rows.take(slice(n * part // parts, n * (part + 1) // parts))

    return replace(
        vc,
        inserted=share(vc.inserted),
        deleted=share(vc.deleted),
        update_pre=share(vc.update_pre),
        update_post=share(vc.update_post),
    )


def snapshot_slices(
    version: int,
    fragments: Sequence[SnapshotFragment],
    start: tuple[int, int],
    end: tuple[int, int],
    rows_per_partition: int,
) -> list[SnapshotSlice]:
    """Partitions for the snapshot rows from position `start` up to (not
    including) `end`; a position is (fragment index, live-row offset)."""
    out = []
    for i in range(start[0], min(end[0] + 1, len(fragments))):
        lo = start[1] if i == start[0] else 0
        hi = end[1] if i == end[0] else fragments[i].rows
        for first in range(lo, hi, rows_per_partition):
            count = min(rows_per_partition, hi - first)
            out.append(SnapshotSlice(version, fragments[i].fragment_id, first, count))
    return out


def advance(
    fragments: Sequence[SnapshotFragment], position: tuple[int, int], rows: int | None
) -> tuple[int, int]:
    """The snapshot position `rows` live rows after `position` (None: the end),
    never resting on the end of a fragment: (len(fragments), 0) is the end."""
    i, k = position
    left = rows
    while i < len(fragments):
        available = fragments[i].rows - k
        if left is not None and available > left:
            return i, k + left
        if left is not None:
            left -= available
        i, k = i + 1, 0
        if left == 0:
            break
    while i < len(fragments) and fragments[i].rows == 0:
        i += 1
    return i, 0


def bucket(rows: RowSet, part: int, parts: int) -> RowSet:
    """The rows of `rows` whose row ID falls in bucket `part` of `parts`."""
    if parts == 1:
        return rows
    return rows.take((rows.rowids % parts) == part)


def net_slices(sizes: Sequence[tuple[int, int]], rows_per_partition: int) -> list[NetSlice]:
    """Partitions of a net-changes read of `(version, changed rows)`: every task
    sees all versions and one bucket of the row IDs."""
    if not sizes:
        return []
    total = sum(rows for _, rows in sizes)
    parts = max(1, math.ceil(total / rows_per_partition))
    versions = tuple(v for v, _ in sizes)
    return [NetSlice(versions, p, parts) for p in range(parts)]
