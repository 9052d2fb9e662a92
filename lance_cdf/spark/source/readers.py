"""The readers of the `lance-cdf` Spark data source (`LanceCdfDataSource`): batch and streaming
reads of a Lance table's change feed on the PySpark Python Data Source API.

Offsets are `{"version": N}`: every change up to and including version N has
been delivered. A partition is a list of `(version, part, parts)` segments:
small commits are packed together, a large one is cut into `parts` row ranges
(`rowsPerPartition` changed rows each). An executor re-plans each version from
the manifests (cheap, no data read) and reads only its share of the rows.

`startingVersion=snapshot` first delivers the table as it stood at V0 (the
latest version when the query first started). While that snapshot is being
delivered the offset is `{"version": V0, "snapshot": {"fragment": i, "offset":
k}}`: the rows of V0 before live row k of its i-th fragment (manifest order)
have been delivered. Once complete it is `{"version": V0}` and the changes of
V0+1 onward follow, so old checkpoints parse unchanged. Snapshot partitions are
row ranges of one fragment.

`netChanges=true` collapses the events of each micro-batch (a batch read: of
its range) per row ID. That needs every event of a row in one task, so such a
micro-batch is split by row ID (`rowid % parts`) instead of by version: each
task re-plans all the micro-batch's versions, keeps its share of the row IDs,
reads their images and nets them. The work stays parallel and no shuffle is
needed.

Where things run: `DataSource.schema()` runs once at `load()` in a Python
worker and the instance is pickled for everything after it, so state it sets
(the version the schema was taken at) reaches `reader()`/`streamReader()`.
`latestOffset`/`partitions`/`commit` run in one long-lived Python process on
the driver; `read()` runs on executors with a pickled copy of the reader.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from lance_cdf.core.change_types import ChangeType
from lance_cdf.core.events import event_schema
from lance_cdf.core.feed import read_groups
from lance_cdf.core.keyhash import key_hash
from lance_cdf.core.modes import drop_unchanged_batches, drop_unchanged_updates, net_changes
from lance_cdf.core.plan import VersionChanges
from lance_cdf.core.snapshot import SnapshotFragment
from lance_cdf.core.stream_columns import EVENT_ORDER, KEY_HASH, ORDER_BITS
from lance_cdf.errors import (
    CLEANUP,
    KEEP_VERSIONS,
    LanceCdfError,
    VersionNotFoundError,
    WorkItemError,
)
from lance_cdf.spark.source.handoff import WorkItem, WriterSlot, table_digest
from lance_cdf.spark.source.handover import HandOver
from lance_cdf.spark.source.identity import check_offset, origin, stamp
from lance_cdf.spark.source.options import SourceOptions
from lance_cdf.spark.source.partitions import (
    ChangeSlices,
    NetSlice,
    Offset,
    SnapshotSlice,
    SourcePartition,
)
from lance_cdf.spark.source.resolution import (
    Resolved,
    renamed_columns,
    routed_struct,
    spans,
    unreadable,
)
from lance_cdf.spark.source.slicing import advance, bucket, cut, net_slices, pack, snapshot_slices
from lance_cdf.spark.source.table_feeds import feed_for
from lance_cdf.spark.source.types import META_NAMES, arrow_target, to_spark

log = logging.getLogger("lance_cdf.spark.source")


class TableReading:
    """What executors need (pickled with every reader): options, the columns to
    read, and the Arrow schema Spark expects (`work_reading`: a work item's)."""

    def __init__(self, opts: SourceOptions, union: pa.Schema, declared: StructType):
        self.opts = opts
        routing = (KEY_HASH, EVENT_ORDER)
        wanted = [f.name for f in declared if f.name not in META_NAMES and f.name not in routing]
        unknown = [c for c in wanted if c not in union.names]
        if unknown:
            raise LanceCdfError(
                f"column(s) {unknown} of the query's schema are not columns of {opts.path} "
                f"(available: {union.names}); leave them out of .schema(...) or the columns "
                "option."
            )
        self.read_schema = pa.schema([union.field(c) for c in wanted])
        self.target = arrow_target(declared)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batches = self._routed(partition) if self.opts.key_hash else self._events(partition)
        for batch in batches:
            yield to_spark(batch, self.target)

    def work(self, share: WriterSlot, kafka_partitions: int) -> WorkItem:
        """Option writerSlots: the work item of one writer slot (what `work_reading` reads
        back): the partitions and this reading's settings, no option of the source."""
        return WorkItem(
            slot=share.slot,
            slots=share.slots,
            planned=share.planned,
            kafka_partitions=kafka_partitions,
            key_hash=tuple(self.opts.key_hash or ()),
            drop_unchanged_updates=self.opts.drop_unchanged_updates,
            fail_on_data_loss=self.opts.fail_on_data_loss,
            parts=share.parts,
            read_schema=self.read_schema,
            table=table_digest(self.opts.path),
        )

    def _events(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SnapshotSlice):
            return self._snapshot(partition)
        if isinstance(partition, NetSlice):
            return self._net(partition)
        if isinstance(partition, ChangeSlices):
            return self._changes(partition)
        raise _not_ours(partition)

    def _routed(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Events with `_key_hash` and `_event_order` (option keyHash): sorting a version's
        events by (delete/update/insert, `_event_order`) gives the order `read_changes`
        yields, whichever partitions (slices of the version) they were read in."""
        if isinstance(partition, ChangeSlices):
            for part, batches in self._segments(partition):
                yield from self._with_key_hash(batches, part << ORDER_BITS)
        elif isinstance(partition, SnapshotSlice):
            # by the fragment's place in the manifest (the order snapshot slices are taken
            # in, across micro-batches), not its ID
            ids = [f.fragment_id for f in feed_for(self.opts).snapshot_fragments(partition.version)]
            base = (ids.index(partition.fragment_id) << ORDER_BITS) + partition.offset
            yield from self._with_key_hash(self._snapshot(partition), base)
        elif isinstance(partition, NetSlice):
            yield from self._with_key_hash(self._net(partition), partition.part << ORDER_BITS)
        else:
            raise _not_ours(partition)

    def _with_key_hash(
        self, batches: Iterator[pa.RecordBatch], base: int
    ) -> Iterator[pa.RecordBatch]:
        """Each event's key hash and order (`base` + its position); a batch's trailing
        preimage waits for its postimage (the next batch's first row) so the pair shares
        the postimage's hash."""
        keys = list(self.opts.key_hash or ())
        carry: pa.Table | None = None
        position = base

        def finish(table: pa.Table) -> list[pa.RecordBatch]:
            nonlocal position
            order = np.arange(position, position + table.num_rows, dtype=np.int64)
            position += table.num_rows
            table = table.append_column(KEY_HASH, pa.array(key_hash(table, keys)))
            table = table.append_column(EVENT_ORDER, pa.array(order))
            batches: list[pa.RecordBatch] = table.to_batches()
            return batches

        for batch in batches:
            table = pa.Table.from_batches([batch])
            if carry is not None:
                table, carry = pa.concat_tables([carry, table]).combine_chunks(), None
            if table.num_rows and table["_change_type"][-1].as_py() == ChangeType.UPDATE_PRE:
                carry, table = table.slice(table.num_rows - 1), table.slice(0, table.num_rows - 1)
            if table.num_rows:
                yield from finish(table)
        if carry is not None:  # a preimage without its postimage: its own key
            yield from finish(carry)

    def _plan(self, version: int) -> VersionChanges | None:
        try:
            return feed_for(self.opts).plan(version)
        except VersionNotFoundError as exc:
            if self.opts.fail_on_data_loss:
                raise
            log.warning("skipping version %d (failOnDataLoss=false): %s", version, exc)
            return None

    def _changes(self, partition: ChangeSlices) -> Iterator[pa.RecordBatch]:
        for _, batches in self._segments(partition):
            yield from batches

    def _segments(self, partition: ChangeSlices) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
        """Each segment's part number and events, in order; the image reads of small
        consecutive versions are merged per data file (`ChangeFeed.reading_together`), so
        each segment's events are to be read before the next segment is asked for."""
        feed = feed_for(self.opts)
        cuts = []
        for version, part, parts in partition.segments:
            vc = self._plan(version)
            if vc is not None:
                cuts.append((part, cut(vc, part, parts)))
        done = 0
        for group in read_groups(changes for _, changes in cuts):
            with feed.reading_together(group, self.read_schema):
                for changes in group:
                    batches = feed.events(changes, self.read_schema)
                    if self.opts.drop_unchanged_updates:
                        batches = drop_unchanged_batches(batches)
                    yield cuts[done][0], batches
                    done += 1

    def _net(self, partition: NetSlice) -> Iterator[pa.RecordBatch]:
        feed = feed_for(self.opts)
        mines: list[VersionChanges] = []
        for version in partition.versions:
            vc = self._plan(version)
            if vc is None:
                continue
            p, n = partition.part, partition.parts
            mine = replace(
                vc,
                inserted=bucket(vc.inserted, p, n),
                deleted=bucket(vc.deleted, p, n),
                update_pre=bucket(vc.update_pre, p, n),  # same row IDs, same order as post
                update_post=bucket(vc.update_post, p, n),
            )
            mines.append(mine)
        batches = list(feed.range_events(mines, self.read_schema))
        events = net_changes(pa.Table.from_batches(batches, event_schema(self.read_schema)))
        if self.opts.drop_unchanged_updates:
            events = drop_unchanged_updates(events)
        yield from events.combine_chunks().to_batches()

    def _snapshot(self, part: SnapshotSlice) -> Iterator[pa.RecordBatch]:
        feed = feed_for(self.opts)
        try:
            yield from feed.snapshot_events(
                part.version,
                self.read_schema,
                fragment_id=part.fragment_id,
                offset=part.offset,
                limit=part.limit,
            )
        except VersionNotFoundError as exc:
            raise VersionNotFoundError(snapshot_lost(self.opts.path, part.version, exc)) from None


def _not_ours(partition: InputPartition) -> TypeError:
    # as `partitions.part_json` raises it: Spark hands back the partitions planned here
    return TypeError(f"not a lance-cdf source partition: {type(partition).__name__}")


def snapshot_lost(path: str, version: int, why: Exception) -> str:
    return (
        f"the snapshot of {path} at version {version} cannot be completed: the version was "
        f"removed by {CLEANUP} before the snapshot was delivered ({why}). Restart "
        "the query from a new checkpoint to take a new snapshot, and keep versions longer "
        f"({KEEP_VERSIONS}) than a snapshot takes."
    )


def work_reading(item: WorkItem, path: str, storage_options: dict[str, str]) -> TableReading:
    """What reads a work item's partitions (`SlotWork`) as the stream that wrote it
    would have: the table at `path` with `storage_options` (the Kafka sink's own options
    `table` and `storage.<key>`: the item holds no option of the source), and the item's
    columns (the schema fixed at `load()`), key hash and read options."""
    if table_digest(path) != item.table:
        raise WorkItemError(
            f"the work items are of another table's stream than this sink's table option "
            f"({path}): give the lance-cdf-kafka sink the source's path as its table option"
        )
    opts = replace(
        SourceOptions.parse({"path": path}, streaming=True),
        key_hash=item.key_hash,
        drop_unchanged_updates=item.drop_unchanged_updates,
        fail_on_data_loss=item.fail_on_data_loss,
        storage_options=dict(storage_options),
    )
    return TableReading(opts, item.read_schema, routed_struct(item.read_schema))


class LanceCdfBatchReader(DataSourceReader):
    """`spark.read.format("lance-cdf")`: the events of a fixed version range, each commit's
    rows read in slices of `rowsPerPartition` changed rows, one Spark task per slice."""

    def __init__(self, resolved: Resolved, schema: StructType):
        self.reading = TableReading(resolved.opts, resolved.user_schema, schema)
        self.start, self.end = resolved.start, resolved.end
        self.snapshot_version = resolved.snapshot_version

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.reading.opts
        feed = feed_for(opts)
        if self.snapshot_version is not None:
            fragments = feed.snapshot_fragments(self.snapshot_version)
            end = (len(fragments), 0)
            return snapshot_slices(
                self.snapshot_version, fragments, (0, 0), end, opts.rows_per_partition
            )
        sizes = [(v, feed.plan(v).num_changed_rows) for v in range(self.start, self.end + 1)]
        if opts.net_changes:
            return net_slices(sizes, opts.rows_per_partition)
        return pack(sizes, opts.rows_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.reading.read(partition)


class LanceCdfStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("lance-cdf")`: offsets are `{"version": N}` (plus the
    snapshot position while a snapshot is delivered, and the checkpoint's identity);
    honours `maxVersionsPerTrigger` / `maxRowsPerTrigger` and `Trigger.AvailableNow`."""

    def __init__(self, resolved: Resolved, schema: StructType):
        self.opts = resolved.opts
        self.reading = TableReading(resolved.opts, resolved.user_schema, schema)
        self.start = resolved.start
        self.snapshot_version = resolved.snapshot_version
        self.fragments: dict[int, list[SnapshotFragment]] = {}  # snapshot version -> fragments
        self.target: int | None = None  # Trigger.AvailableNow's last version
        # Schema changes are judged from the version the query's schema was taken at.
        feed = feed_for(self.opts)
        self.checked = resolved.end
        self.present = set(feed.reader.arrow_schema(resolved.end).names)
        self.sizes: dict[int, tuple[int, int]] = {}  # version -> (events, changed rows)
        self.warned = 0  # highest skipped version warned about
        self.given = resolved.given
        self.origin = origin(self.opts.starting, self.opts.starting_timestamp_us)
        self.advice = resolved.advice
        self.checked_offsets: set[tuple[object, ...]] = set()  # offsets made or checked here

    def __getstate__(self) -> dict[str, object]:
        # executors get the reader pickled once, when the query starts (pyspark 4.3: not per
        # micro-batch, so state the driver adds later never reaches them): leave the caches
        # behind
        state = dict(self.__dict__)
        state["sizes"] = {}
        state["fragments"] = {}
        return state

    # -- offsets ----------------------------------------------------------
    def initialOffset(self) -> Offset:
        if self.snapshot_version is not None:
            first = {"version": self.snapshot_version, "snapshot": {"fragment": 0, "offset": 0}}
        else:
            first = {"version": self.start - 1}
        return self._stamp(first, self.origin)

    def _stamp(self, offset: Offset, start: str | None) -> Offset:
        """`offset` with the table's identity and the stream's start (`identity.stamp`)."""
        out = stamp(offset, feed_for(self.opts), self.opts.path, start)
        self.checked_offsets.add(self._key(out))
        return out

    @staticmethod
    def _key(offset: Offset) -> tuple[object, ...]:
        table = offset.get("table")
        commit = table.get("commit") if isinstance(table, dict) else None
        return int(offset["version"]), commit, offset.get("from")

    def _check(self, offset: Offset) -> None:
        """A stored offset (from the checkpoint) checked once against this table and the
        start given now (identity.check_offset); the offsets made here need no check."""
        key = self._key(offset)
        if key in self.checked_offsets:
            return
        check_offset(offset, feed_for(self.opts), self.opts.path, self.given, self.advice)
        self.checked_offsets.add(key)

    def _fragments(self, version: int) -> list[SnapshotFragment]:
        fragments = self.fragments.get(version)
        if fragments is None:
            try:
                fragments = feed_for(self.opts).snapshot_fragments(version)
            except VersionNotFoundError as exc:
                raise VersionNotFoundError(snapshot_lost(self.opts.path, version, exc)) from None
            self.fragments = {version: fragments}
        return fragments

    @staticmethod
    def _position(offset: Offset, fragments: Sequence[SnapshotFragment]) -> tuple[int, int]:
        """Where in the snapshot `offset` is: (fragment index, live-row offset)."""
        snap = offset.get("snapshot")
        if snap is None:
            return len(fragments), 0
        return int(snap["fragment"]), int(snap["offset"])

    def _snapshot_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """The end of the next snapshot micro-batch: the whole rest of the
        snapshot, or `maxRowsPerTrigger` rows of it (changes come after it)."""
        version = int(start["version"])
        fragments = self._fragments(version)
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        i, k = advance(fragments, self._position(start, fragments), rows)
        if i >= len(fragments):
            return self._stamp({"version": version}, start.get("from"))
        end = {"version": version, "snapshot": {"fragment": i, "offset": k}}
        return self._stamp(end, start.get("from"))

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = feed_for(self.opts).latest_version()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        if self.opts.max_versions_per_trigger is not None:
            return ReadMaxFiles(self.opts.max_versions_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> Offset:
        return {"version": feed_for(self.opts).latest_version()}

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        feed = feed_for(self.opts)
        done = int(start["version"])
        latest = feed.latest_version()
        if latest < done:
            raise LanceCdfError(
                f"the checkpoint says versions up to {done} of {self.opts.path} were delivered, "
                f"but its latest version is {latest}: it is another table's checkpoint, or "
                f"the table was replaced. {self.advice.new_checkpoint.capitalize()}."
            )
        self._check(start)
        if "snapshot" in start:
            return self._snapshot_offset(start, limit)
        if self.target is not None:
            latest = min(latest, self.target)
        if latest <= done:
            return start
        if self.opts.fail_on_data_loss:
            # deliver what is still readable, then stop at the first lost version
            gone = unreadable(feed.table.versions, done + 1, latest)
            if gone and gone[0] > done + 1:
                latest = gone[0] - 1
        lost = self._lost(done + 1, latest)
        readable = [v for v in range(done + 1, latest + 1) if v not in lost]
        end = latest
        if readable and not isinstance(limit, ReadAllAvailable):
            max_versions = self.opts.max_versions_per_trigger
            if isinstance(limit, ReadMaxFiles):
                max_versions = limit.max_files
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            taken = rows = 0
            for version in readable:
                events = self._size(version)[0]
                # a version is never split: the first one always goes in
                if taken and (
                    (max_versions is not None and taken >= max_versions)
                    or (max_rows is not None and rows + events > max_rows)
                ):
                    break
                taken, rows, end = taken + 1, rows + events, version
                if max_rows is not None and rows >= max_rows:
                    break
        change = self._check_schema(done + 1, end, lost)
        if change is not None:
            version, message = change
            if version == done + 1:
                raise LanceCdfError(message)
            end = version - 1  # deliver what came before the change; stop at it next time
        if end == done:
            return start
        return self._stamp({"version": end}, start.get("from"))

    def _size(self, version: int) -> tuple[int, int]:
        size = self.sizes.get(version)
        if size is None:
            vc = feed_for(self.opts).plan(version)
            size = self.sizes[version] = (vc.num_events, vc.num_changed_rows)
        return size

    def _lost(self, first: int, last: int) -> set[int]:
        """Versions in first..last that can no longer be read: an error naming
        them, or (failOnDataLoss=false) a warning and the set to skip."""
        table = feed_for(self.opts).table
        gone = unreadable(table.versions, first, last)
        if not gone:
            return set()
        message = (
            f"the changes of version(s) {spans(gone)} of {self.opts.path} can no longer be "
            f"read: {CLEANUP} removed them or the versions they are diffed against "
            f"before this stream read them (versions still present: {spans(table.versions)})."
        )
        if self.opts.fail_on_data_loss:
            raise VersionNotFoundError(f"{message} {self.advice.skip_lost}")
        if gone[-1] > self.warned:
            log.warning("%s Skipping them (failOnDataLoss=false).", message)
            self.warned = gone[-1]
        return set(gone)

    def _check_schema(self, first: int, end: int, lost: set[int]) -> tuple[int, str] | None:
        """The first version in first..end that drops or retypes a column of this
        query, or (without mergeSchema or columns) adds one, and what it did."""
        feed = feed_for(self.opts)
        fixed = self.reading.read_schema
        for version in range(max(first, self.checked + 1), end + 1):
            if version in lost and not feed.table.has_version(version):
                continue
            now = feed.reader.annotated_for(fixed, version)  # blobs as bytes, as in events
            names = set(now.names)
            gone = [c for c in fixed.names if c in self.present and c not in names]
            renamed = renamed_columns(fixed, now, gone)
            if renamed:
                return version, (
                    f"the schema of {self.opts.path} changed at version {version}: renamed "
                    f"{renamed}. This stream's columns were named when the query started; "
                    f"{self.advice.restart} to continue under the new names."
                )
            retyped = [
                f"{c} {fixed.field(c).type} -> {now.field(c).type}"
                for c in fixed.names
                if c in names and now.field(c).type != fixed.field(c).type
            ]
            if gone or retyped:
                what = "; ".join(
                    ([f"dropped {gone}"] if gone else [])
                    + ([f"retyped {retyped}"] if retyped else [])
                )
                return version, (
                    f"the schema of {self.opts.path} changed at version {version}: {what}. This "
                    f"stream's schema was fixed when the query started; {self.advice.restart} "
                    "to continue with the new schema."
                )
            added = [c for c in now.names if c not in self.present and c not in fixed.names]
            if added and self.opts.columns is None:
                if not self.opts.merge_schema:
                    return version, (
                        f"the schema of {self.opts.path} changed at version {version}: new "
                        f"column(s) {added}. {self.advice.new_columns}"
                    )
                log.warning(
                    "version %d of %s added column(s) %s; mergeSchema=true: streaming goes on "
                    "with the columns the query started with (restart to include them)",
                    version,
                    self.opts.path,
                    added,
                )
            self.present = names
            self.checked = version
        return None

    # -- reading ----------------------------------------------------------
    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        return self._slices(start, end)

    def _slices(self, start: Offset, end: Offset) -> list[SourcePartition]:
        # a restarted query replays its last planned micro-batch from the checkpoint
        self._check(start)
        self._check(end)
        out: list[SourcePartition] = []
        if "snapshot" in start:
            version = int(start["version"])
            fragments = self._fragments(version)
            # an end in a later version means the snapshot was completed
            stop = (
                self._position(end, fragments)
                if int(end["version"]) == version
                else (len(fragments), 0)
            )
            position = self._position(start, fragments)
            out += snapshot_slices(version, fragments, position, stop, self.opts.rows_per_partition)
        first, last = int(start["version"]) + 1, int(end["version"])
        if last < first:
            return out
        feed_for(self.opts).latest_version()  # re-list versions: cleanup may have run
        lost = self._lost(first, last)
        sizes = [(v, self._size(v)[1]) for v in range(first, last + 1) if v not in lost]
        if self.opts.net_changes:
            return out + net_slices(sizes, self.opts.rows_per_partition)
        return out + pack(sizes, self.opts.rows_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.reading.read(partition)

    def commit(self, end: Offset) -> None:
        done = int(end["version"])
        for version in [v for v in self.sizes if v <= done]:
            del self.sizes[version]


class HandOffReader(LanceCdfStreamReader):
    """Option writerSlots: each micro-batch is `writerSlots` rows, one work item per writer
    slot (`WorkItem`; the lance-cdf-kafka sink reads them), not its events
    (offsets, limits and snapshots as without it). As Spark then counts work items as the
    batch's input rows, the first slot's row carries the number of events planned
    (`_events`: snapshot rows, and each version's events before dropUnchangedUpdates or an
    old writer's undecided rows drop any)."""

    handed_over = False  # option handOver: this query has taken over from the head start

    def partitions(self, start: Offset, end: Offset) -> Sequence[WriterSlot]:
        if self.opts.hand_over and not self.handed_over:
            # the first plan, before any writer task of the query: the head start of
            # lance-cdf publish stops publishing here (`HandOver.take`)
            HandOver(self.opts.hand_over).take()
            self.handed_over = True
        parts = tuple(self._slices(start, end))
        if not parts:
            return []
        versions = {v for p in parts if isinstance(p, ChangeSlices) for v, _, _ in p.segments}
        events = sum(self._size(v)[0] for v in versions) + sum(
            p.limit for p in parts if isinstance(p, SnapshotSlice)
        )
        slots = self.opts.writer_slots
        if slots is None:  # LanceCdfDataSource.streamReader makes this reader only with it
            raise LanceCdfError("a hand-off stream needs option writerSlots")
        return [WriterSlot(parts, s, slots, 0 if s else events) for s in range(slots)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, WriterSlot)
        assert self.opts.kafka_partitions is not None  # SourceOptions.parse checks it
        yield self.reading.work(partition, self.opts.kafka_partitions).to_batch()
