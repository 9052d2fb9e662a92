"""The `lance-cdf` Spark data source: batch and streaming reads of a Lance
table's change feed on the PySpark Python Data Source API.

Offsets are `{"version": N}`: every change up to and including version N has
been delivered. Partitions are `(version, part, parts)`: an executor re-plans
the version from the manifests (cheap, no data) and reads its share of the
changed rows, so a large commit is read by several tasks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from lance_cdf.errors import LanceCdfError, VersionNotFoundError
from lance_cdf.feed import ChangeFeed
from lance_cdf.plan import VersionChanges
from lance_cdf.read import ROWID
from lance_cdf.streaming.options import SourceOptions

log = logging.getLogger("lance_cdf.streaming")

_FEEDS: dict[tuple, ChangeFeed] = {}


def _feed(opts: SourceOptions) -> ChangeFeed:
    """One ChangeFeed per table per Python process (driver or executor worker)."""
    key = (opts.path, tuple(sorted(opts.storage_options.items())))
    feed = _FEEDS.get(key)
    if feed is None:
        feed = _FEEDS[key] = ChangeFeed(opts.path, opts.storage_options)
    return feed


def spark_arrow_schema(user_schema: pa.Schema) -> tuple[StructType, pa.Schema]:
    """Spark schema of the events and the Arrow schema batches are cast to
    (`_rowid` becomes a signed long: row IDs stay far below 2^63)."""
    fields = [f for f in user_schema] + [
        pa.field(ROWID, pa.int64(), nullable=False),
        pa.field("_change_type", pa.string(), nullable=False),
        pa.field("_commit_version", pa.int64(), nullable=False),
        pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
    spark = from_arrow_schema(pa.schema(fields))
    return spark, to_arrow_schema(spark, timezone="UTC")


@dataclass(frozen=True)
class VersionSlice(InputPartition):
    """Part `part` of `parts` of the changes of one version."""

    version: int
    part: int
    parts: int


def _slice(vc: VersionChanges, part: int, parts: int) -> VersionChanges:
    def cut(rows):
        n = len(rows)
        return rows.take(slice(n * part // parts, n * (part + 1) // parts))

    return replace(
        vc,
        inserted=cut(vc.inserted),
        deleted=cut(vc.deleted),
        update_pre=cut(vc.update_pre),
        update_post=cut(vc.update_post),
    )


class _Reading:
    """What the batch and the stream reader share: schema, planning, reading."""

    def __init__(self, opts: SourceOptions, user_schema: pa.Schema):
        self.opts = opts
        self.user_schema = user_schema
        self.spark_schema, self.arrow_schema = spark_arrow_schema(user_schema)

    def slices(self, first: int, last: int) -> list[VersionSlice]:
        feed = _feed(self.opts)
        out = []
        for version in range(first, last + 1):
            rows = feed.plan(version).num_changed_rows
            parts = max(1, math.ceil(rows / self.opts.rows_per_partition))
            out.extend(VersionSlice(version, p, parts) for p in range(parts))
        return out

    def read(self, partition: VersionSlice) -> Iterator[pa.RecordBatch]:
        feed = _feed(self.opts)
        vc = _slice(feed.plan(partition.version), partition.part, partition.parts)
        for batch in feed.events(vc, self.user_schema):
            yield batch.cast(self.arrow_schema)


def _start_version(opts: SourceOptions, feed: ChangeFeed) -> int:
    """First version whose changes the source delivers."""
    table = feed.table
    table.refresh()
    if opts.starting_timestamp_us is not None:
        for version in table.versions:
            if table.manifest(version).timestamp_us >= opts.starting_timestamp_us:
                return max(version, earliest_start(feed))
        return table.latest_version + 1
    if opts.starting == "latest":
        return table.latest_version + 1
    if opts.starting == "earliest":
        return earliest_start(feed)
    return int(opts.starting)


def earliest_start(feed: ChangeFeed) -> int:
    oldest = feed.table.oldest_version
    return 1 if oldest <= 1 else oldest + 1


def _resolve(options: dict, streaming: bool) -> tuple[SourceOptions, pa.Schema, int]:
    """Parse options and fix the schema: the columns of every version from the
    start to the end (a stream: to the latest version now), as read_changes."""
    opts = SourceOptions.parse(options, streaming)
    feed = _feed(opts)
    start = _start_version(opts, feed)
    latest = feed.latest_version()
    if start > latest + 1 and opts.starting not in ("latest", "earliest"):
        raise feed.table.missing_version_error(start)
    if streaming:
        end = latest
    else:
        start, end = feed.resolve_range(start, opts.ending_version)
    first = max(start, earliest_start(feed))
    if first <= end:
        user_schema = feed.user_schema(first, end, opts.columns)
    else:
        user_schema = feed.schema_at(latest, opts.columns)
    return opts, user_schema, start


class LanceCdfDataSource(DataSource):
    """`spark.read/readStream.format("lance-cdf")`."""

    @classmethod
    def name(cls) -> str:
        return "lance-cdf"

    def _resolved(self, streaming: bool):
        return _resolve(dict(self.options), streaming)

    def schema(self) -> StructType:
        # Spark does not say whether a batch or a stream asks: endingVersion means batch
        # (a stream rejects it in streamReader()); the reader re-checks its own case.
        batch = any(str(k).lower() == "endingversion" for k in self.options)
        _, user_schema, _ = _resolve(dict(self.options), streaming=not batch)
        return spark_arrow_schema(user_schema)[0]

    def reader(self, schema: StructType) -> DataSourceReader:
        opts, user_schema, start = self._resolved(streaming=False)
        return LanceCdfBatchReader(opts, user_schema, start)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts, user_schema, start = self._resolved(streaming=True)
        return LanceCdfStreamReader(opts, user_schema, start)


class LanceCdfBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, user_schema: pa.Schema, start: int):
        self.reading = _Reading(opts, user_schema)
        feed = _feed(opts)
        self.start, self.end = feed.resolve_range(start, opts.ending_version)

    def partitions(self) -> Sequence[InputPartition]:
        return self.reading.slices(self.start, self.end)

    def read(self, partition: VersionSlice) -> Iterator[pa.RecordBatch]:
        return self.reading.read(partition)


class LanceCdfStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, user_schema: pa.Schema, start: int):
        self.opts = opts
        self.reading = _Reading(opts, user_schema)
        self.start = start
        self.target: int | None = None  # Trigger.AvailableNow's end version
        feed = _feed(opts)
        # schema changes are judged against the table as it was when this query (re)started
        self.schema_checked = feed.latest_version()
        self.base_schema = feed.schema_at(self.schema_checked)

    # -- offsets ----------------------------------------------------------
    def initialOffset(self) -> dict:
        return {"version": self.start - 1}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = _feed(self.opts).latest_version()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        if self.opts.max_versions_per_trigger is not None:
            return ReadMaxFiles(self.opts.max_versions_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict:
        return {"version": _feed(self.opts).latest_version()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        feed = _feed(self.opts)
        done = int(start["version"])
        latest = feed.latest_version()
        if self.target is not None:
            latest = min(latest, self.target)
        if latest <= done:
            return start
        first = self._first_readable(done, latest)
        end = latest
        if not isinstance(limit, ReadAllAvailable):
            max_versions = self.opts.max_versions_per_trigger
            if isinstance(limit, ReadMaxFiles):
                max_versions = limit.max_files
            if max_versions is not None:
                end = min(end, first + max_versions - 1)
            if isinstance(limit, ReadMaxRows):
                rows, version = 0, first
                while version <= end:
                    rows += feed.plan(version).num_events
                    # a version is never split: the first one always goes in
                    if rows > limit.max_rows and version > first:
                        version -= 1
                        break
                    if rows >= limit.max_rows:
                        break
                    version += 1
                end = min(end, version)
        self._check_schema(first, end)
        return {"version": end}

    def _first_readable(self, done: int, latest: int) -> int:
        """The first version after `done` that can still be read, or a clear error."""
        feed = _feed(self.opts)
        first = done + 1
        earliest = earliest_start(feed)
        if first >= earliest:
            return first
        missing = f"{first}..{earliest - 1}" if earliest - 1 > first else str(first)
        message = (
            f"versions {missing} of {self.opts.path} were cleaned up before this query read "
            f"them (oldest still available: {feed.table.oldest_version}); their changes are lost "
            "to this stream."
        )
        if self.opts.fail_on_data_loss:
            raise VersionNotFoundError(
                message + " Restart from a new checkpoint, or set failOnDataLoss=false to skip "
                "ahead, and keep more versions (cleanup_old_versions(older_than=...))."
            )
        log.warning("%s Skipping to version %d (failOnDataLoss=false).", message, earliest)
        return earliest

    def _check_schema(self, first: int, end: int) -> None:
        """Stop with a clear message when the table's columns changed incompatibly."""
        feed = _feed(self.opts)
        fixed = self.base_schema
        for version in range(max(first, self.schema_checked + 1), end + 1):
            now = feed.reader.arrow_schema(version)
            wanted = fixed.names if self.opts.columns is None else list(self.opts.columns)
            gone = [c for c in wanted if c not in now.names]
            changed = [
                c for c in wanted if c in now.names and now.field(c).type != fixed.field(c).type
            ]
            added = [c for c in now.names if c not in fixed.names]
            if gone or changed:
                raise LanceCdfError(
                    f"the schema of {self.opts.path} changed at version {version}: "
                    f"{'dropped ' + str(gone) if gone else ''}"
                    f"{' retyped ' + str(changed) if changed else ''}. This stream's schema was "
                    "fixed when it started; restart the query (same checkpoint) to pick up the "
                    "new schema."
                )
            if added and self.opts.columns is None:
                if not self.opts.merge_schema:
                    raise LanceCdfError(
                        f"the schema of {self.opts.path} changed at version {version}: new "
                        f"column(s) {added}. Restart the query (same checkpoint) to pick them "
                        "up, or set mergeSchema=true to keep streaming without them."
                    )
                log.warning(
                    "version %d added column(s) %s; mergeSchema=true: streaming continues "
                    "with the columns the query started with (restart to include them)",
                    version,
                    added,
                )
            self.schema_checked = version

    # -- reading ----------------------------------------------------------
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, last = int(start["version"]) + 1, int(end["version"])
        if last < first:
            return []
        first = self._first_readable(first - 1, last)
        return self.reading.slices(first, last)

    def read(self, partition: VersionSlice) -> Iterator[pa.RecordBatch]:
        return self.reading.read(partition)

    def commit(self, end: dict) -> None:
        pass
