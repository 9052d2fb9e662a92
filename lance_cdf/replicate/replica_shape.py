"""The replica's shape kept near what a source its owner optimizes has: few segments per
index, few fragments beyond what compaction would leave, few deleted rows kept.

A query reads every segment of an index it uses and opens every fragment it takes rows
from, so each delta segment and each small fragment costs every query a little; a source
whose owner runs LanceDB's `optimize()` has one segment per index and few fragments. The
replicator's batches add a fragment each and its index upkeep a delta segment at a time
(`IndexKeeper`, `KeyLookup`), so without a bound a replica answers slower than its
source until the next compaction. Here:

- `INDEX_SEGMENTS_MAX`: an index's segments (its base and the deltas since) stay at most
  this many: a delta that would pass it is merged instead (`merge_count`);
- `compaction_due`: the fragments are compacted once the replica holds more than
  `EXCESS_FRAGMENTS_MAX` fragments beyond what compaction would leave, or deleted rows
  above `DELETED_ROWS_SHARE_MAX` of its rows: what the replica looks like decides, not
  how many batches went by. Before it compacts, the upkeep merges every index into one
  segment covering every fragment: pylance's compaction merges only fragments that every
  index covers alike, so segments ending at different fragments would leave small
  fragments apart.

Both are read from the manifest the upkeep opens anyway (fragments, their deletion
counts, the index segments): no request to storage of their own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import lance
from lance.dataset import IndexInformation
from lance.fragment import FragmentMetadata

# An index keeps at most this many segments: one base and one delta over the rows added
# since. A query searches each segment (a vector query probes each segment's partitions),
# so every segment past the first costs every query; two let the upkeep add new rows
# without rewriting the whole index each time.
INDEX_SEGMENTS_MAX = 2
# The deltas are merged with the new rows (the base kept) while they cover at most this
# share of the base's rows, and everything into one segment past it: each optimize then
# rewrites a bounded delta, and the whole index is rewritten once per this much growth
# (with an optimize per 1% of growth, an eighth about minimizes the two together).
DELTA_SHARE_MAX = 0.125
# Compaction once the replica holds more than this many fragments beyond what compaction
# would leave: a query opens each fragment it takes rows from, and a batch adds one.
EXCESS_FRAGMENTS_MAX = 4
# Compaction once this share of the replica's rows are deleted (replaced or deleted by the
# source): deleted rows are still read and then dropped by scans and index searches.
DELETED_ROWS_SHARE_MAX = 0.1
# The per-fragment share of deleted rows from which compaction rewrites a fragment.
MATERIALIZE_DELETIONS_THRESHOLD = 0.1
# Lance's default target rows per fragment (`lance.compaction.target_rows_per_fragment`
# in the table's config overrides it)
TARGET_ROWS_PER_FRAGMENT = 1024 * 1024


def fragment_rows(ds: lance.LanceDataset) -> dict[int, int]:
    """Live rows per fragment id, from the manifest (deletion counts included)."""
    return {f.fragment_id: _live(f.metadata) for f in ds.get_fragments()}


def segment_rows(segments: Iterable[IndexInformation], rows: Mapping[int, int]) -> list[int]:
    """The live rows each of `segments` covers (in the order given)."""
    return [sum(rows.get(fid, 0) for fid in s["fragment_ids"]) for s in segments]


def merge_count(covered: list[int], new_rows: int) -> int:
    """`num_indices_to_merge` for an index whose segments (oldest first) cover `covered`
    rows each, when it takes in `new_rows` more: 0 (a new delta segment) while it has
    fewer than INDEX_SEGMENTS_MAX segments; else its deltas merged with the new rows
    (pylance merges the newest segments), or every segment into one once the deltas
    would pass DELTA_SHARE_MAX of the base."""
    if len(covered) < INDEX_SEGMENTS_MAX:
        return 0
    deltas = covered[1:]
    if sum(deltas) + new_rows <= covered[0] * DELTA_SHARE_MAX:
        return len(deltas)
    return len(covered)


def compaction_due(ds: lance.LanceDataset) -> str | None:
    """Why the replica's fragments are due for compaction (None: not due): more than
    EXCESS_FRAGMENTS_MAX fragments beyond what compaction would leave, or deleted rows
    above DELETED_ROWS_SHARE_MAX of its rows."""
    metas = [f.metadata for f in ds.get_fragments()]
    physical = sum(m.physical_rows for m in metas)
    deleted = physical - sum(_live(m) for m in metas)
    leaves = fragments_left(metas, target_rows(ds))
    if len(metas) - leaves > EXCESS_FRAGMENTS_MAX:
        return f"{len(metas)} fragments where compaction leaves {leaves}"
    if physical and deleted > physical * DELETED_ROWS_SHARE_MAX:
        return f"{deleted} of {physical} rows deleted"
    return None


def fragments_left(metas: list[FragmentMetadata], target: int) -> int:
    """The fragments compaction leaves of `metas` (in table order) with every index
    covering all of them, as the upkeep makes it before compacting: each run of adjacent
    candidates (fewer live rows than `target`, or MATERIALIZE_DELETIONS_THRESHOLD of its
    rows deleted) rewritten into ceil(live rows / target) fragments, the others kept."""
    left, run = 0, -1  # run: live rows of the current run of candidates (-1: none)
    for m in metas:
        live = _live(m)
        if (
            live < target
            or m.physical_rows - live > m.physical_rows * MATERIALIZE_DELETIONS_THRESHOLD
        ):
            run = max(run, 0) + live
            continue
        left += 1 + (max(1, math.ceil(run / target)) if run >= 0 else 0)
        run = -1
    return left + (max(1, math.ceil(run / target)) if run >= 0 else 0)


def target_rows(ds: lance.LanceDataset) -> int:
    value = ds.config().get("lance.compaction.target_rows_per_fragment")
    return int(value) if value else TARGET_ROWS_PER_FRAGMENT


def _live(meta: FragmentMetadata) -> int:
    gone = meta.deletion_file.num_deleted_rows if meta.deletion_file is not None else 0
    return int(meta.physical_rows) - int(gone or 0)
