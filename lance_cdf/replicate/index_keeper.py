"""The replica's secondary indexes and table settings in the replicator's upkeep: the
source's definition (`TableDefinition`, received on the END of a version) made the
replica's once that version is applied (`replica_definition.reconcile`), definitions that
could not be built tried again at later upkeeps, and every index kept current:
`optimize_indices` once the rows outside an index exceed max(1% of the replica's rows, the
last batch's rows), its segments kept to at most `INDEX_SEGMENTS_MAX`.

What could not be built is recorded in the replica's config (`lance-cdf.unbuilt-indexes`,
one line each) for `lance-cdf status`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import lance
from lance.dataset import IndexInformation

from lance_cdf.format.definition_capture import build_type
from lance_cdf.format.definitions import IndexDefinition, TableDefinition
from lance_cdf.format.operations import Operation
from lance_cdf.replicate.replica_definition import Unbuilt, reconcile
from lance_cdf.replicate.replica_shape import (
    INDEX_SEGMENTS_MAX,
    fragment_rows,
    merge_count,
    segment_rows,
)
from lance_cdf.replicate.served_btree import build_btree

log = logging.getLogger("lance_cdf.replicate")

UNBUILT_CONFIG = "lance-cdf.unbuilt-indexes"
# the operations of commits that move no row (index builds and drops, config, metadata)
ROWLESS_OPERATIONS = frozenset(
    {Operation.CREATE_INDEX, Operation.UPDATE_CONFIG, Operation.PROJECT, Operation.DATA_REPLACEMENT}
)


@dataclass
class IndexWork:
    """What the index upkeep did since start (for the counters and `status`)."""

    builds: int = 0  # indexes built or rebuilt from a definition
    drops: int = 0
    optimizes: int = 0  # optimize_indices runs
    build_s: float = 0.0
    unbuilt: dict[str, Unbuilt] = field(default_factory=dict)


class IndexKeeper:
    """The wanted definition of one replica and the upkeep that makes and keeps it so.

    `source_indexes`: build and drop the source's indexes (False: `--no-indexes`; the
    settings and `extra` still reach the replica); `extra`: the replica-only indexes
    (`--index`), built once and kept current, never dropped by a definition."""

    def __init__(self, source_indexes: bool = True, extra: tuple[IndexDefinition, ...] = ()):
        self.source_indexes, self.extra = source_indexes, extra
        self.wanted: TableDefinition | None = None
        self.due = True  # reconcile at the next upkeep (start, a new definition)
        self.work = IndexWork()

    def want(self, definition: TableDefinition | None) -> None:
        """The source's definition as of the version the replica now holds (None: none
        known; replica-only indexes are still built)."""
        if definition is not None and definition != self.wanted:
            self.wanted, self.due = definition, True

    def upkeep(
        self, ds: lance.LanceDataset, protected: set[str], compact: bool, batch_rows: int
    ) -> dict[str, int]:
        """Reconcile when due (or, before a compaction, when a definition is left
        unbuilt), then optimize the indexes: before a compaction (`compact`) every index
        merged into one segment covering every fragment (pylance's compaction merges only
        fragments every index covers alike); else all of them once one has too many
        unindexed rows or more than `INDEX_SEGMENTS_MAX` segments.
        Returns what was done; `ds` is moved to the commits made."""
        done: dict[str, int] = {}
        if self.due or (compact and self.work.unbuilt):
            done.update(self._reconcile(ds, protected))
        rows = fragment_rows(ds)
        loose = unindexed_rows(ds, skip=protected, rows=rows)
        bound = max(sum(rows.values()) // 100, batch_rows) if loose else 0
        segments: dict[str, list[IndexInformation]] = {}
        for s in ds.list_indices():
            if s["name"] in loose:
                segments.setdefault(s["name"], []).append(s)
        due = compact or any(
            r > bound or len(segments[n]) > INDEX_SEGMENTS_MAX for n, r in loose.items()
        )
        # all at once: segments that end at the same fragments keep compaction's groups few
        most = 1 if compact else INDEX_SEGMENTS_MAX
        stale = [n for n, r in loose.items() if r or len(segments[n]) > most] if due else []
        rebuilt = _rebuild_btrees(ds, stale)
        # an inverted index always merged into one segment: BM25 scores with each
        # segment's statistics, so a full-text query answers as the source's (one segment
        # after its optimize) only then; the others a delta segment over the new rows, or
        # merged as replica_shape.merge_count says
        inverted = _inverted(ds, stale)
        merges: dict[int, list[str]] = {}
        for n in stale:
            if n not in rebuilt:
                covered = segment_rows(segments[n], rows)
                whole = compact or n in inverted
                merge = len(covered) if whole else merge_count(covered, loose[n])
                merges.setdefault(merge, []).append(n)
        for merge, names in sorted(merges.items()):
            ds.optimize.optimize_indices(index_names=names, num_indices_to_merge=merge)
        if stale:
            self.work.optimizes += 1
            done["indexes_optimized"] = len(stale)
        return done

    def _reconcile(self, ds: lance.LanceDataset, protected: set[str]) -> dict[str, int]:
        t0 = time.perf_counter()
        r = reconcile(ds, self.wanted, protected, self.extra, self.source_indexes)
        self.due = False
        self.work.build_s += time.perf_counter() - t0
        self.work.builds += len(r.created) + len(r.replaced)
        self.work.drops += len(r.dropped)
        unbuilt = {u.name: u for u in r.unbuilt}
        record = json.dumps([u.line() for u in unbuilt.values()]) if unbuilt else None
        if ds.config().get(UNBUILT_CONFIG) != record:  # (None: the key removed)
            ds.update_config({UNBUILT_CONFIG: record})
        self.work.unbuilt = unbuilt
        if r.changed():
            log.info(
                "replica definition: %d indexes built, %d rebuilt, %d dropped, %d settings "
                "commits, %d not built (%.1f s)",
                len(r.created),
                len(r.replaced),
                len(r.dropped),
                r.settings_changed,
                len(r.unbuilt),
                time.perf_counter() - t0,
            )
        return {
            "indexes_built": len(r.created) + len(r.replaced),
            "indexes_dropped": len(r.dropped),
            "indexes_unbuilt": len(r.unbuilt),
        }


def _inverted(ds: lance.LanceDataset, names: list[str]) -> set[str]:
    return {
        i.name
        for i in ds.describe_indices()
        if i.name in names and i.type_url.endswith("InvertedIndexDetails")
    }


def _rebuild_btrees(ds: lance.LanceDataset, names: list[str]) -> list[str]:
    """The BTREE indexes among `names` built again through LanceDB (`served_btree.build_btree`: so
    they stay in the format LanceDB reads; pylance's optimize would rewrite them in its
    own); those it built."""
    btrees = {
        i.name: i.field_names[0]
        for i in ds.describe_indices()
        if i.name in names and i.type_url.endswith("BTreeIndexDetails")
    }
    return [n for n, column in btrees.items() if build_btree(ds, column, n)]


def unindexed_rows(
    ds: lance.LanceDataset, skip: set[str] | None = None, rows: dict[int, int] | None = None
) -> dict[str, int]:
    """Per index of `ds` (but those in `skip`): rows in fragments none of its segments
    covers (`rows`: live rows per fragment, if already read)."""
    covered: dict[str, set[int]] = {}
    for seg in ds.list_indices():
        if skip is None or seg["name"] not in skip:
            covered.setdefault(seg["name"], set()).update(seg["fragment_ids"])
    if not covered:
        return {}
    rows = fragment_rows(ds) if rows is None else rows
    return {
        name: sum(n for fid, n in rows.items() if fid not in frags)
        for name, frags in covered.items()
    }


def describe_indexes(ds: lance.LanceDataset) -> list[dict[str, object]]:
    """Each index of the replica: name, build type (the source's spelling: `IVF_HNSW_SQ`,
    `BTREE`), columns, unindexed rows (for `status`)."""
    loose = unindexed_rows(ds)
    out: list[dict[str, object]] = []
    for d in ds.describe_indices():
        out.append(
            {
                "name": d.name,
                "type": build_type(d),
                "columns": list(d.field_names),
                "unindexed_rows": loose.get(d.name, 0),
            }
        )
    return out


def unbuilt_lines(ds: lance.LanceDataset) -> list[str]:
    """The definitions the replicator last could not build, one line each."""
    value = ds.config().get(UNBUILT_CONFIG)
    return [] if value is None else [str(x) for x in json.loads(value)]
