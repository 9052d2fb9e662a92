"""The change feed of one table: plan commits and read their events.

`read_changes` is the one-call Python API; `ChangeFeed` is what the Spark
source, the CLI and the Kafka publisher hold on to across many calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa

from lance_cdf.core.candidates import resolve_candidates
from lance_cdf.core.columns import union_schema
from lance_cdf.core.events import META_COLUMNS, event_schema, read_version_events
from lance_cdf.core.modes import drop_unchanged_batches, net_changes, pair_safe_batches
from lance_cdf.core.modes import drop_unchanged_updates as drop_unchanged_updates_of
from lance_cdf.core.plan import RowSet, VersionChanges, plan_version, resolve_range
from lance_cdf.core.rows import RowReader
from lance_cdf.core.snapshot import SnapshotFragment, read_snapshot, snapshot_fragments
from lance_cdf.errors import LanceCdfError
from lance_cdf.format.cache import LruCache
from lance_cdf.format.namespace import resolve_table
from lance_cdf.format.table import TableLog

DEFAULT_BATCH_SIZE = 65536


class ChangeFeed:
    """Change events of the Lance table at `uri`, one commit at a time.

    Hold one for many calls on one table (a poller, a stream): manifests, plans, decoded
    row-ID sequences and open data-file readers are kept between calls.

    Args:
        uri: the table's path or URI (`file://`, `s3://`, `gs://`, `az://`).
        storage_options: passed to the object store and to pylance, as for pylance.
        check_latest: check at once that the latest version has stable row IDs; with
            False, each version is checked when it is planned.

    Raises:
        TableNotFoundError: `uri` holds no Lance table.
        StableRowIdsRequiredError: the latest version has no stable row IDs
            (`check_latest=True`).
        StorageAccessError: the object store could not be reached or refused the request.
        UnsupportedStorageError: a URI scheme this build cannot read.
    """

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None = None,
        *,
        check_latest: bool = True,
    ):
        self.table = TableLog(uri, storage_options)
        self.reader = RowReader(self.table)
        # versions never change once written, so their plans can be kept
        self._plans: LruCache[int, VersionChanges] = LruCache(16)
        if check_latest:  # fail at once on a table without stable row IDs
            latest = self.table.manifest(self.table.latest_version, operation=False)
            self.table.require_stable_row_ids(latest)

    @property
    def uri(self) -> str:
        """The table's URI."""
        return self.table.uri

    def latest_version(self) -> int:
        """The table's latest version, listed afresh.

        Returns:
            The highest version number in the table's `_versions/`.
        """
        return self.table.refresh()[-1]

    def resolve_range(
        self, start: int, end: int | None = None, refresh: bool = True
    ) -> tuple[int, int]:
        """Check the range `start`..`end` (None: the latest) before reading it.

        Returns:
            `(start, end)` as version numbers.

        Raises:
            VersionNotFoundError: a version of the range (or the one before `start`, whose
                manifest the first step needs) does not exist or was cleaned up; the message
                names the first start version that can be read.
            LanceCdfError: `start` < 1 or `end` < `start`.
        """
        return resolve_range(self.table, start, end, refresh)

    def plan(self, version: int) -> VersionChanges:
        """Which rows commit `version` inserted, updated and deleted (no data read,
        except the images of moved rows whose writer recorded no versions: see
        lance_cdf.core.candidates).

        Returns:
            The version's plan; `.summary()` is a dict of its version, Lance operation and
            inserted / updated / deleted counts.

        Raises:
            VersionNotFoundError: `version` or `version - 1` does not exist.
            StableRowIdsRequiredError: the version has no stable row IDs.
            UndecidableChangeError: an older writer's moved rows cannot be compared.
            CorruptFileError: a manifest, row-ID or deletion file could not be decoded.
        """
        cached = self._plans.get(version)
        if cached is None:
            plan = resolve_candidates(self.reader, plan_version(self.table, version))
            cached = self._plans.put(version, plan)
        return cached

    def plans(self, start: int, end: int) -> Iterator[VersionChanges]:
        """`plan(v)` of every version `start`..`end`, in order (raises as `plan`)."""
        for version in range(start, end + 1):
            yield self.plan(version)

    def user_schema(self, start: int, end: int, columns: Sequence[str] | None = None) -> pa.Schema:
        """Columns of the events of versions start..end: each column under its newest name
        and type in the range (the documentation's Concepts, "Columns across a range").

        Returns:
            The user columns (without the four metadata columns), as `events()` takes them.

        Raises:
            LanceCdfError: a name in `columns` is not a column of the range, or is one of the
                metadata columns; or a table column has a metadata column's name.
        """
        versions = range(max(start - 1, 1), end + 1)
        if start > 1:  # the base of the first step: its own commit's operation is not needed
            self.table.manifest(start - 1, operation=False, base=True)
        return self.union_of(versions, columns, f"versions {start}..{end}")

    def union_of(
        self, versions: Sequence[int], columns: Sequence[str] | None, where: str
    ) -> pa.Schema:
        """The columns of `versions` (ascending, the first the origin of their column
        tokens) combined by column (`lance_cdf.core.columns`); each distinct schema counts at
        its last occurrence, so the newest version's names and types win (a schema that
        comes back with `restore` beats the one it replaced)."""
        origin = versions[0]
        last: dict[tuple[bytes, tuple[tuple[int, str], ...]], int] = {}  # -> last version
        for version in versions:
            tokens = tuple(sorted(self.reader.tokens(version, origin).items()))
            key = (self.table.manifest(version, operation=False).schema_key(), tokens)
            last.pop(key, None)
            last[key] = version
        schemas = [self.reader.tagged(v, origin) for v in last.values()]
        return self.select_columns(union_schema(schemas), columns, where)

    def schema_at(self, version: int, columns: Sequence[str] | None = None) -> pa.Schema:
        """The table's columns (or `columns`) at one version.

        Raises:
            LanceCdfError: as `user_schema`.
        """
        schema = self.reader.tagged(version, version)
        return self.select_columns(schema, columns, f"version {version}")

    def select_columns(
        self, schema: pa.Schema, columns: Sequence[str] | None, where: str
    ) -> pa.Schema:
        """`schema` narrowed to `columns` (None: all of it); `where` names the versions in
        errors.

        Raises:
            LanceCdfError: as `user_schema`.
        """
        if columns is None:
            clash = [c for c in schema.names if c in META_COLUMNS]
            if clash:
                raise LanceCdfError(
                    f"column(s) {clash} of {self.uri} ({where}) have the names of the metadata "
                    f"columns every event carries ({META_COLUMNS}); events would hold two "
                    "columns of one name. Leave them out with columns=[...], or rename them "
                    "in the table (alter_columns)."
                )
            return schema
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise LanceCdfError(
                f"unknown column(s) {unknown} for {where} of {self.uri}; available: {schema.names}."
            )
        clash = [c for c in columns if c in META_COLUMNS]
        if clash:
            raise LanceCdfError(f"{clash} are added to every event; do not list them in columns.")
        return pa.schema([schema.field(c) for c in columns])

    def events(
        self, changes: VersionChanges, user_schema: pa.Schema, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[pa.RecordBatch]:
        """The events of one planned version.

        Returns:
            Arrow batches of at most `batch_size` rows (an update's two images are never
            split): `user_schema`'s columns plus `_rowid`, `_change_type`,
            `_commit_version`, `_commit_timestamp`; deletes, then update pairs, then inserts,
            each by `_rowid`.

        Raises:
            LanceCdfError: a data file could not be read (its message names the file).
        """
        return read_version_events(self.reader, changes, user_schema, batch_size)

    def range_events(
        self,
        plans: Iterable[VersionChanges],
        user_schema: pa.Schema,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> Iterator[pa.RecordBatch]:
        """The events of `plans` (consecutive versions, in order), as `events()` of each,
        with the image reads of small consecutive versions merged (`reading_together`).

        Returns:
            Arrow batches as `events()` returns them, version after version.
        """
        for group in read_groups(plans):
            with self.reading_together(group, user_schema):
                for changes in group:
                    yield from self.events(changes, user_schema, batch_size)

    @contextmanager
    def reading_together(
        self, plans: Sequence[VersionChanges], user_schema: pa.Schema
    ) -> Iterator[None]:
        """Inside the block, `events()` of `plans` take the rows they need from a data file
        that two of their reads share with one take per file (`RowReader.merge_reads`):
        small consecutive versions often read rows of the same files (the pre-images of
        one, the deleted rows of the next). The events are the same either way. Only for
        groups `read_groups` made: the rows read are held until the block ends."""
        if _mergeable(plans):
            self.reader.merge_reads([r for c in plans for r in _image_reads(c)], user_schema)
        try:
            yield
        finally:
            self.reader.drop_merged()

    def resolve_snapshot(
        self, version: int | None, end: int | None = None, refresh: bool = True
    ) -> tuple[int, int]:
        """Check a snapshot at `version` (None: the latest) followed by the changes
        of version+1..`end` (None: the latest): every version from the snapshot on
        must still be present (`refresh=False`: as last listed).

        Returns:
            `(snapshot version, end version)`.

        Raises:
            VersionNotFoundError: the snapshot version or a later one is missing.
            LanceCdfError: `version` is not a version number >= 1, or `end` is before it.
        """
        if refresh:
            self.table.refresh()
        latest = self.table.latest_version
        if version is None:
            version = latest
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise LanceCdfError(
                f"the snapshot version must be a version number >= 1, got {version!r}"
            )
        if not self.table.has_version(version):
            raise self.table.missing_version_error(version)
        end = latest if end is None else end
        if end < version:
            raise LanceCdfError(
                f"end_version {end} is before the snapshot version {version}; a snapshot is "
                f"followed by the changes after it, so ask for end_version >= {version}."
            )
        if end > version:
            resolve_range(self.table, version + 1, end, refresh=False)
        return int(version), int(end)

    def snapshot_fragments(self, version: int) -> list[SnapshotFragment]:
        """The fragments of a snapshot version and their live row counts (manifests only)."""
        return snapshot_fragments(self.reader, version)

    def snapshot_events(
        self,
        version: int,
        user_schema: pa.Schema,
        batch_size: int = DEFAULT_BATCH_SIZE,
        fragment_id: int | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """`snapshot` events of the table at `version` (or of a slice of one fragment).

        Returns:
            Arrow batches of `user_schema`'s columns and the four metadata columns, with
            `_change_type="snapshot"` and `_commit_version=version`, in fragment order.
        """
        return read_snapshot(
            self.reader, version, user_schema, fragment_id, offset, limit, batch_size
        )


# Consecutive versions whose row images are read together (RowReader.merge_reads): at
# most this many versions, and this many images in all (the merged rows are held until
# the group's events are out).
_GROUP_VERSIONS = 8
_GROUP_IMAGES = 16384


def read_groups(plans: Iterable[VersionChanges]) -> Iterator[list[VersionChanges]]:
    """`plans` in order, as runs of small consecutive versions whose reads may be merged
    (`ChangeFeed.reading_together`; a large version alone)."""
    group: list[VersionChanges] = []
    images = 0
    for plan in plans:
        n = plan.num_events
        if group and (images + n > _GROUP_IMAGES or len(group) >= _GROUP_VERSIONS):
            yield group
            group, images = [], 0
        group.append(plan)
        images += n
    if group:
        yield group


def _mergeable(group: Sequence[VersionChanges]) -> bool:
    """Whether reads of `group` may share data files (one version: its deleted rows and
    its pre-images) and are small enough to hold at once."""
    if sum(changes.num_events for changes in group) > _GROUP_IMAGES:
        return False
    return len(group) > 1 or bool(len(group[0].deleted) and len(group[0].update_pre))


def _image_reads(changes: VersionChanges) -> list[tuple[RowSet, int]]:
    """The (rows, version) reads of one version's events."""
    return [
        (changes.deleted, changes.read_version),
        (changes.update_pre, changes.read_version),
        (changes.update_post, changes.version),
        (changes.inserted, changes.version),
    ]


def read_changes(
    uri: str,
    start_version: int | None = None,
    end_version: int | None = None,
    *,
    columns: Sequence[str] | None = None,
    storage_options: dict[str, str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    snapshot: bool = False,
    net: bool = False,
    drop_unchanged_updates: bool = False,
    database: str | None = None,
) -> pa.RecordBatchReader:
    """Row-level changes of versions `start_version`..`end_version` (inclusive).

    Each event carries the table's columns (or `columns`) plus `_rowid`,
    `_change_type` (insert, update_preimage, update_postimage, delete),
    `_commit_version` and `_commit_timestamp`, ordered by commit version.
    `end_version=None` reads up to the latest version.

    `snapshot=True`: first the table as it stands at `start_version` (None: the
    latest version) as `snapshot` events with `_commit_version=start_version`,
    then the changes of start_version+1..end_version. `net=True`: at most one
    event (an update: one pair) per row ID over the whole range (materialises
    the range in memory). `drop_unchanged_updates=True`: leave out update pairs
    whose images are equal on every returned column. `database`: `uri` is the name of a
    table of this LanceDB database / Lance directory namespace (`sales.orders`; see
    lance_cdf.format.namespace), read with the same `storage_options`.

    Args:
        uri: the table's path or URI (`file://`, `s3://`, `gs://`, `az://`).
        start_version: the first version whose changes are returned (>= 1; version 1's
            changes are the rows the table was created with); with `snapshot=True`, the
            version to snapshot (None: the latest).
        end_version: the last version (inclusive); None: the latest.
        columns: only these table columns; `[]`: the metadata columns only.
        storage_options: passed to the object store and to pylance, as for pylance.
        batch_size: the most rows per Arrow batch (an update's two images are never split).
        snapshot: bootstrap, as above.
        net: net changes, as above.
        drop_unchanged_updates: leave out carry-over updates, as above.
        database: a LanceDB database / Lance directory namespace root; `uri` is then a
            table's name in it (`sales.orders`, `items`).

    Returns:
        A `pyarrow.RecordBatchReader` of the events, read lazily as it is consumed (with
        `net=True`, the range is read before the call returns). The range, the columns and
        stable row IDs of its last version are checked at the call; the errors below about
        a version's files can also come while the reader is read.

    Raises:
        TableNotFoundError: `uri` holds no Lance table (or, with `database`, names no
            table of it).
        StableRowIdsRequiredError: a version of the range has no stable row IDs.
        VersionNotFoundError: a version of the range, or the one before it, does not exist
            or was cleaned up; the message names the first start version that can be read.
        UndecidableChangeError: an older writer's moved rows cannot be compared.
        StorageAccessError: the object store could not be reached or refused the request.
        LanceCdfError: any other bad input, e.g. `start_version` missing, an unknown
            column, a table column named like a metadata column.
    """
    if database is not None:
        uri = resolve_table(database, uri, storage_options)
    # Not the latest manifest: its size follows the table's history (a table whose commits
    # rewrote rows scattered everywhere has manifests of megabytes), not the range asked
    # for; the range's own manifests are checked for stable row IDs instead.
    feed = ChangeFeed(uri, storage_options, check_latest=False)
    start, first_change, end = _checked_range(feed, start_version, end_version, snapshot)
    query = _Query(
        start=start,
        first_change=first_change,
        end=end,
        user_schema=feed.user_schema(first_change, end, columns),
        batch_size=batch_size,
        snapshot=snapshot,
        net=net,
        drop_unchanged_updates=drop_unchanged_updates,
    )
    return _event_reader(feed, query)


@dataclass(frozen=True)
class _Query:
    """A `read_changes` call, its range resolved: the version snapshotted (with
    `snapshot`) or the first changed, the first and last versions whose changes are read,
    the table columns returned, and the call's options."""

    start: int
    first_change: int
    end: int
    user_schema: pa.Schema
    batch_size: int
    snapshot: bool
    net: bool
    drop_unchanged_updates: bool


def _checked_range(
    feed: ChangeFeed, start_version: int | None, end_version: int | None, snapshot: bool
) -> tuple[int, int, int]:
    """`read_changes`' range as (start, first changed version, end), checked to exist
    and, at its last version, to have stable row IDs."""
    # the feed listed the versions a moment ago: one LIST per query
    if snapshot:
        start, end = feed.resolve_snapshot(start_version, end_version, refresh=False)
        first_change = start + 1
    else:
        if start_version is None:
            raise LanceCdfError(
                "start_version is required (the first version whose changes are returned), "
                "unless snapshot=True, where it is the version to snapshot (default: latest)."
            )
        start, end = feed.resolve_range(start_version, end_version, refresh=False)
        first_change = start
    feed.table.require_stable_row_ids(feed.table.manifest(end))  # planned below anyway
    return start, first_change, end


def _event_reader(feed: ChangeFeed, query: _Query) -> pa.RecordBatchReader:
    """The events of `query` as `read_changes` returns them: lazily, but for `net`."""

    def events() -> Iterator[pa.RecordBatch]:
        if query.snapshot:
            yield from feed.snapshot_events(query.start, query.user_schema, query.batch_size)
        plans = feed.plans(query.first_change, query.end)
        yield from feed.range_events(plans, query.user_schema, query.batch_size)

    schema = event_schema(query.user_schema)
    if query.net:
        table = net_changes(pa.Table.from_batches(list(events()), schema=schema))
        if query.drop_unchanged_updates:
            table = drop_unchanged_updates_of(table)
        batches = pair_safe_batches(table, query.batch_size)
        return pa.RecordBatchReader.from_batches(schema, batches)
    batches = events()
    if query.drop_unchanged_updates:
        batches = drop_unchanged_batches(batches)
    return pa.RecordBatchReader.from_batches(schema, batches)
