"""Diff two consecutive manifests into a change plan: which row IDs were
inserted, deleted or updated, and where (fragment, physical offset) to read
their post-images at version v and pre-images at version v-1.

Only fragments whose manifest entries differ are looked at. A fragment whose
rows and versions are unchanged but whose deletion file changed contributes
only the offsets that flipped (a roaring-bitmap difference), so the cost grows
with the change, not with the table.

Tables written by pylance 0.33.0 to 0.38.2 record no last-updated versions: a
row that moved between fragments may have been updated or only compacted. Such
rows are *candidates*: no event after a `Rewrite` (compaction) or `Project`
(drop_columns), otherwise `lance_cdf.core.candidates` compares their images and keeps
the pairs whose values differ. So are rows whose data files changed under the
same row IDs and versions, and moved rows of a commit that changed the columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pyroaring import BitMap

from lance_cdf.errors import LanceCdfError, VersionNotFoundError
from lance_cdf.format.manifest import FragmentInfo, Manifest
from lance_cdf.format.operations import Operation
from lance_cdf.format.table import UNKNOWN_VERSION, TableLog

_U64 = np.uint64
_I64 = np.int64


@dataclass(frozen=True)
class RowSet:
    """Rows of one table version: their row IDs and physical locations."""

    rowids: np.ndarray  # uint64
    fragment_ids: np.ndarray  # int64
    offsets: np.ndarray  # int64, physical offset within the fragment
    versions: np.ndarray  # uint64, last-updated version of each row (0: not recorded)

    @staticmethod
    def empty() -> RowSet:
        return RowSet(np.zeros(0, _U64), np.zeros(0, _I64), np.zeros(0, _I64), np.zeros(0, _U64))

    @staticmethod
    def concat(parts: list[RowSet]) -> RowSet:
        if not parts:
            return RowSet.empty()
        return RowSet(
            np.concatenate([p.rowids for p in parts]),
            np.concatenate([p.fragment_ids for p in parts]),
            np.concatenate([p.offsets for p in parts]),
            np.concatenate([p.versions for p in parts]),
        )

    def __len__(self) -> int:
        return int(self.rowids.size)

    def take(self, index: np.ndarray | slice) -> RowSet:
        return RowSet(
            self.rowids[index], self.fragment_ids[index], self.offsets[index], self.versions[index]
        )

    def sorted_by_rowid(self) -> RowSet:
        if self.rowids.size < 2 or bool((self.rowids[1:] > self.rowids[:-1]).all()):
            return self  # already ordered (the rows of a new fragment): no copy
        return self.take(np.argsort(self.rowids, kind="stable"))


@dataclass(frozen=True)
class VersionChanges:
    """The changes one commit made: step `read_version` -> `version`.

    `inserted` and `update_post` are located in `version`; `deleted` and
    `update_pre` in `read_version`. `update_pre[i]` and `update_post[i]` are
    the two images of the same row ID. All sets are ordered by row ID.
    """

    version: int
    read_version: int
    timestamp_us: int
    operation: str
    inserted: RowSet
    deleted: RowSet
    update_pre: RowSet
    update_post: RowSet
    # Moved rows whose last-updated version is not recorded (pylance 0.33.0 - 0.38.2):
    # updates if their values differ. Ordered by row ID, pre[i] and post[i] one row.
    # `candidates.resolve_candidates` (ChangeFeed.plan) decides them before events are read.
    candidate_pre: RowSet = field(default_factory=RowSet.empty)
    candidate_post: RowSet = field(default_factory=RowSet.empty)

    @property
    def num_candidates(self) -> int:
        return len(self.candidate_post)

    @property
    def num_events(self) -> int:
        return len(self.inserted) + len(self.deleted) + 2 * len(self.update_post)

    @property
    def num_changed_rows(self) -> int:
        return len(self.inserted) + len(self.deleted) + len(self.update_post)

    def summary(self) -> dict[str, int | str]:
        return {
            "version": self.version,
            "operation": self.operation,
            "inserted": len(self.inserted),
            "updated": len(self.update_post),
            "deleted": len(self.deleted),
            **({"undecided": self.num_candidates} if self.num_candidates else {}),
        }


def _rows(table: TableLog, frag: FragmentInfo, offsets: np.ndarray) -> RowSet:
    return _locate(table, [(frag, offsets)])


def _locate(table: TableLog, parts: list[tuple[FragmentInfo, np.ndarray]]) -> RowSet:
    """The rows at (fragment, physical offsets) of many fragments, in that order, in one
    pass: fragments whose row IDs are one range and whose rows share one version (every
    fragment as written, until rows move into it) answer by arithmetic over all their
    offsets at once; the others per fragment. A scattered change touches every fragment,
    so the per-fragment cost is what planning it costs."""
    parts = [(f, o) for f, o in parts if o.size]
    if not parts:
        return RowSet.empty()
    counts = np.fromiter((o.size for _, o in parts), dtype=_I64, count=len(parts))
    offsets = np.concatenate([o for _, o in parts]).astype(_I64, copy=False)
    n = len(parts)
    rowid_base, version = np.zeros(n, _U64), np.zeros(n, _U64)
    mixed_ids, mixed_versions = [], []
    for i, (frag, _) in enumerate(parts):
        start = table.row_ids(frag).single_range_start
        if start is None:
            mixed_ids.append(i)
        else:
            rowid_base[i] = start
        one = table.last_updated_versions(frag).single_version
        if one is None:
            mixed_versions.append(i)
        else:
            version[i] = one
    limit = np.repeat(np.fromiter((f.physical_rows for f, _ in parts), _I64, n), counts)
    if offsets.size and (offsets.min() < 0 or (offsets >= limit).any()):
        raise IndexError("offset outside its fragment's physical rows")
    rowids = np.repeat(rowid_base, counts) + offsets.astype(_U64)
    versions = np.repeat(version, counts)
    if mixed_ids or mixed_versions:
        bounds = np.concatenate([[0], np.cumsum(counts)])
        for i in mixed_ids:
            at = slice(bounds[i], bounds[i + 1])
            rowids[at] = table.row_ids(parts[i][0]).values_at(offsets[at])
        for i in mixed_versions:
            at = slice(bounds[i], bounds[i + 1])
            versions[at] = table.last_updated_versions(parts[i][0]).values_at(offsets[at])
    fragment_ids = np.repeat(np.fromiter((f.id for f, _ in parts), _I64, n), counts)
    return RowSet(rowids, fragment_ids, offsets, versions)


def _live_offsets(table: TableLog, frag: FragmentInfo) -> np.ndarray:
    return table.deletions(frag).live_offsets(frag.physical_rows)


def _bitmap_offsets(bitmap: BitMap) -> np.ndarray:
    return np.frombuffer(bitmap.to_array(), dtype=np.uint32)


# Operations that move or reshape rows without changing the values of the remaining
# columns: a moved row with unrecorded versions is no event after them.
_NO_VALUE_CHANGE = frozenset({Operation.REWRITE, Operation.PROJECT})


def _rewritten_in_place(
    table: TableLog, of: FragmentInfo, nf: FragmentInfo
) -> tuple[RowSet, RowSet]:
    """(pre, post) rows live in both `of` and `nf`, one fragment whose data files changed
    while its row IDs and recorded versions stayed: the values may have changed."""
    live = np.intersect1d(
        table.deletions(of).live_offsets(of.physical_rows),
        table.deletions(nf).live_offsets(nf.physical_rows),
        assume_unique=True,
    )
    return _rows(table, of, live), _rows(table, nf, live)


@dataclass
class _EntryDiff:
    """How two manifests' fragment entries differ: (fragment, physical offsets) of the row
    entries present in the old and not in the new (`removed`), in the new and not in the
    old (`added`), and the (pre, post) candidate rows of fragments rewritten in place."""

    removed: list[tuple[FragmentInfo, np.ndarray]] = field(default_factory=list)
    added: list[tuple[FragmentInfo, np.ndarray]] = field(default_factory=list)
    cand_pre: list[RowSet] = field(default_factory=list)
    cand_post: list[RowSet] = field(default_factory=list)


def _diff_entries(
    table: TableLog, old: Manifest | None, new: Manifest, may_change: bool
) -> _EntryDiff:
    """The row entries the commit from `old` to `new` removed and added, fragment by
    fragment; located in bulk by the caller."""
    old_frags = old.fragment_map if old is not None else {}
    new_frags = new.fragment_map
    diff = _EntryDiff()
    changed = []  # (old entry or None, new entry) of every entry that differs
    for fid, nf in new_frags.items():
        of = old_frags.get(fid)
        # identical entries: same rows and deletions. Compared as bytes of the two files
        # (parsed only if those differ): the row-ID sequences of the entries are most of a
        # large manifest's bytes, and a commit leaves most entries alone
        if of is None or not of.same_entry(nf):
            changed.append((of, nf))
    # the deletion files this commit wrote (one per fragment a scattered change touched)
    table.prefetch_deletions([f for pair in changed for f in pair if f is not None])
    for of, nf in changed:
        if of is not None and of.same_lineage(nf):
            # Same rows and versions at the same offsets; only the deletion file
            # moved. Newly deleted offsets left, undeleted offsets came back.
            d_old, d_new = table.deletions(of).bitmap, table.deletions(nf).bitmap
            diff.removed.append((of, _bitmap_offsets(d_new - d_old)))
            diff.added.append((nf, _bitmap_offsets(d_old - d_new)))
            if may_change and not of.same_data_files(nf):
                # new data files under the same rows and versions: add_columns by a writer
                # that bumped no versions (0.38.x), a data replacement, an old restore
                pre, post = _rewritten_in_place(table, of, nf)
                diff.cand_pre.append(pre)
                diff.cand_post.append(post)
            continue
        if of is not None:
            diff.removed.append((of, _live_offsets(table, of)))
        diff.added.append((nf, _live_offsets(table, nf)))
    for fid, of in old_frags.items():
        if fid not in new_frags:
            diff.removed.append((of, _live_offsets(table, of)))
    return diff


@dataclass(frozen=True)
class _Moved:
    """Rows live both before and after a commit: their indices in `came` and `gone`, and
    per such row whether it changed, or is undecided (its values decide)."""

    in_came: np.ndarray
    in_gone: np.ndarray
    changed: np.ndarray
    undecided: np.ndarray


def _moved_rows(
    came: RowSet, gone: RowSet, old: Manifest | None, new: Manifest, may_change: bool
) -> _Moved:
    """Which rows of `came` and `gone` are the same row moved, and which of those changed."""
    # A row ID is live at most once per version, so a row in `came` but not in
    # `gone` was not live before (insert), one in `gone` only is no longer live
    # (delete), and one in both moved; it changed if its version differs. Where a
    # version is not recorded (UNKNOWN_VERSION) on either side, a row this commit
    # stamped with its own version changed; any other is a candidate (values decide),
    # except after a compaction. So is a moved row when the commit changed the columns.
    if len(came) and len(gone):
        _, in_came, in_gone = np.intersect1d(
            came.rowids, gone.rowids, assume_unique=True, return_indices=True
        )
    else:  # only inserts or only deletes: nothing moved
        in_came = in_gone = np.zeros(0, dtype=np.intp)
    v_new, v_old = came.versions[in_came], gone.versions[in_gone]
    known = (v_new != UNKNOWN_VERSION) & (v_old != UNKNOWN_VERSION)
    stamped = v_new == _U64(new.version)
    changed = (known & (v_new != v_old)) | (~known & stamped)
    # a restore across add_columns drops or brings back a column without moving versions
    reshaped = old is not None and set(old.top_level_columns) != set(new.top_level_columns)
    if reshaped and new.operation == Operation.RESTORE:
        # the restored versions go back (or forth) with a column's presence: values of the
        # restored version's columns decide every moved row (lance_cdf.core.candidates): a
        # column it lacks is no change (as drop_columns), one it brings back is compared
        changed = np.zeros_like(changed)
    undecided = may_change & ~changed & (~known | reshaped)
    return _Moved(in_came, in_gone, changed, undecided)


def _only(rows: RowSet, moved: np.ndarray) -> RowSet:
    """The rows of `rows` not at indices `moved`, by row ID."""
    if moved.size == 0:
        return rows.sorted_by_rowid()
    keep = np.ones(len(rows), dtype=bool)
    keep[moved] = False
    return rows.take(keep).sorted_by_rowid()


def diff_manifests(table: TableLog, old: Manifest | None, new: Manifest) -> VersionChanges:
    """The change plan of the commit that turned `old` into `new`.

    `old=None` is the empty table before version 1: every live row is inserted.
    """
    table.require_stable_row_ids(new)
    may_change = new.operation not in _NO_VALUE_CHANGE
    diff = _diff_entries(table, old, new, may_change)
    gone, came = _locate(table, diff.removed), _locate(table, diff.added)
    moved = _moved_rows(came, gone, old, new, may_change)
    cand_pre, cand_post = diff.cand_pre, diff.cand_post
    if moved.undecided.any():
        cand_pre.append(gone.take(moved.in_gone[moved.undecided]))
        cand_post.append(came.take(moved.in_came[moved.undecided]))
    candidate_pre, candidate_post = RowSet.concat(cand_pre), RowSet.concat(cand_post)
    if len(candidate_post) > 1:
        by_rowid = np.argsort(candidate_post.rowids, kind="stable")
        candidate_pre, candidate_post = candidate_pre.take(by_rowid), candidate_post.take(by_rowid)
    return VersionChanges(
        version=new.version,
        read_version=old.version if old is not None else 0,
        timestamp_us=new.timestamp_us,
        operation=new.operation,
        inserted=_only(came, moved.in_came),
        deleted=_only(gone, moved.in_gone),
        update_pre=gone.take(moved.in_gone[moved.changed]),
        update_post=came.take(moved.in_came[moved.changed]),
        candidate_pre=candidate_pre,
        candidate_post=candidate_post,
    )


def resolve_range(
    table: TableLog, start: int, end: int | None, refresh: bool = True
) -> tuple[int, int]:
    """Validate an inclusive version range against what the table still has
    (`refresh=False`: as last listed, for a TableLog that was just opened)."""
    if refresh:
        table.refresh()
    latest = table.latest_version
    if end is None:
        end = latest
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 1:
        raise LanceCdfError(
            f"start_version must be a version number >= 1, got {start!r}; version 1's changes "
            "are the rows the table was created with."
        )
    if start > latest:
        raise table.missing_version_error(start)
    if end > latest:
        raise table.missing_version_error(end)
    if start > end:
        raise LanceCdfError(
            f"start_version {start} is after end_version {end}; both ends are inclusive, so "
            f"ask for start_version <= {end}."
        )
    needed = range(max(start - 1, 1), end + 1)
    present = set(table.versions)
    missing = [v for v in needed if v not in present]
    if missing:
        first = missing[0]
        base = table.clone_base()
        why = (
            f"is before version {base}, where this table was shallow-cloned"
            if base is not None and first < base
            else "was removed by cleanup (pylance's cleanup_old_versions or LanceDB's "
            "optimize(cleanup_older_than=...))"
        )
        raise VersionNotFoundError(
            f"cannot read changes {start}..{end} of {table.uri}: version {first} "
            f"{'(the base the first step is diffed against) ' if first == start - 1 else ''}"
            f"{why} ({len(missing)} version(s) missing, {missing[0]}..{missing[-1]}). "
            f"{table.start_advice(end)}"
        )
    return int(start), int(end)


def plan_version(table: TableLog, version: int) -> VersionChanges:
    """The change plan of one commit (version - 1 -> version)."""
    new = table.manifest(version)
    old = table.manifest(version - 1, operation=False, base=True) if version > 1 else None
    if old is not None:
        table.require_stable_row_ids(old)
    return diff_manifests(table, old, new)
