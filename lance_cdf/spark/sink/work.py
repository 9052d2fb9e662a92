"""The writer-slot hand-off, the Kafka side: a `lance-cdf-kafka` writer task reads its
slot's share of a micro-batch itself from the work items of a stream read with option
writerSlots (`WorkItem`), so no event crosses Spark's JVM. A Python source's
rows otherwise go Arrow -> JVM rows -> (a shuffle) -> Arrow to reach a Python writer
(slower, most on vectors: docs/benchmarks.md, "Inside the publisher").

A work item is data: the source partitions to read, the columns, the key hash and the
slot. The table's location and storage options are the sink's own options (`table`,
`storage.<key>`), never a row's; a row that is not exactly a lance-cdf work item is
refused (`WorkItemError`) before anything is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.avro.schema import TOTAL_ORDER
from lance_cdf.core.change_types import ChangeType
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.core.stream_columns import (
    EVENT_ORDER,
    KEY_HASH,
    PARTITION_COLUMN,
    WORK_COLUMN,
    WORK_EVENTS,
    WORK_SCHEMA,
    WORK_SLOT,
)
from lance_cdf.spark.source.handoff import WorkItem
from lance_cdf.spark.source.partitions import SnapshotSlice, SourcePartition
from lance_cdf.spark.source.readers import work_reading
from lance_cdf.spark.source.table_feeds import keep_feed_if_same


@dataclass(frozen=True)
class SlotWork:
    """One writer slot's share of a micro-batch: the events of the item's partitions
    whose Kafka partition, `_key_hash % kafka_partitions`, belongs to the slot
    (`partition % slots == slot`), each with its `_kafka_partition`, read in the source's
    exact types and order."""

    item: WorkItem
    table: str
    storage_options: dict[str, str] = field(repr=False)  # credentials: never printed

    @property
    def parts(self) -> tuple[SourcePartition, ...]:
        return self.item.parts

    def events(self) -> Iterator[pa.RecordBatch]:
        """The slot's events, each record with its `_total_order` (1-based place among its
        version's records of the micro-batch, in commit order: version; deletes, updates,
        inserts; `_event_order`). Every slot reads every event of the micro-batch and keeps
        its share, so the numbering is dense over the version and the same in every slot
        and on every replay; the share is held until all parts are read (the sink holds it
        anyway, to put it in commit order), plus 24 bytes per event for the numbering."""
        if self.item.name is not None:
            # a database stream's table may have been dropped and created again at the same
            # path since this process read it (the driver takes it up afresh; the work item
            # does not say so): the feed is kept only while its manifests are still the
            # table's own
            keep_feed_if_same(self.table, self.storage_options)
        reading = work_reading(self.item, self.table, self.storage_options)
        slot, slots, partitions = self.item.slot, self.item.slots, self.item.kafka_partitions
        kept: list[tuple[pa.RecordBatch, np.ndarray]] = []  # share, its records' indices
        keys: list[np.ndarray] = []  # (version, group, order) of every record read
        records = 0
        for part in self.item.parts:
            for batch in reading.read(part):
                rows, key = _record_keys(batch)
                index = np.full(batch.num_rows, -1, np.int64)
                index[rows] = np.arange(records, records + len(rows))
                records += len(rows)
                keys.append(key)
                partition = batch.column(KEY_HASH).to_numpy() % partitions
                mine = partition % slots == slot
                if not mine.any():
                    continue
                batch = batch.filter(pa.array(mine)).drop_columns([KEY_HASH])
                owned = pa.array(partition[mine].astype(np.int32))
                kept.append((batch.append_column(PARTITION_COLUMN, owned), index[mine]))
        if not kept:
            return
        every = np.concatenate(keys) if keys else np.empty((0, 3), np.int64)
        rank = _ranks(every)
        for version, base in self._snapshot_bases().items():
            rank[every[:, 0] == version] += base
        for batch, index in kept:
            total = np.where(index >= 0, rank[np.maximum(index, 0)], 0)
            yield batch.append_column(TOTAL_ORDER, pa.array(total, pa.int64()))

    def _snapshot_bases(self) -> dict[int, int]:
        """Per snapshot version of the micro-batch: its live rows before the micro-batch's
        first slice of it (a snapshot spans micro-batches; its slices in one are
        consecutive), so its records are numbered over the whole version."""
        slices = [p for p in self.parts if isinstance(p, SnapshotSlice)]
        if not slices:
            return {}
        feed = ChangeFeed(self.table, self.storage_options, check_latest=False)
        out = {}
        for version in sorted({s.version for s in slices}):
            before, at = 0, {}
            for f in feed.snapshot_fragments(version):
                at[f.fragment_id], before = before, before + f.rows
            out[version] = min(at[s.fragment_id] + s.offset for s in slices if s.version == version)
        return out


def _record_keys(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """The rows that make a record (all but update preimages) and their (version, group,
    order): group 0 deletes, 1 updates, 2 inserts and snapshot reads."""
    kinds = batch.column("_change_type")
    if pa.types.is_dictionary(kinds.type):
        kinds = kinds.cast(pa.string())
    pre = pc.equal(kinds, ChangeType.UPDATE_PRE).fill_null(False).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(~pre)
    group = np.full(batch.num_rows, 2, np.int64)
    group[pc.equal(kinds, ChangeType.DELETE).fill_null(False).to_numpy(zero_copy_only=False)] = 0
    group[pc.starts_with(kinds, "update").fill_null(False).to_numpy(zero_copy_only=False)] = 1
    key = np.empty((len(rows), 3), np.int64)
    key[:, 0] = batch.column("_commit_version").to_numpy()[rows]
    key[:, 1] = group[rows]
    key[:, 2] = batch.column(EVENT_ORDER).to_numpy()[rows]
    return rows, key


def _ranks(keys: np.ndarray) -> np.ndarray:
    """Each record's 1-based rank within its version, ordered by (version, group, order)."""
    n = len(keys)
    order = np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))
    version = keys[order, 0]
    first = np.ones(n, bool)
    first[1:] = version[1:] != version[:-1]
    starts = np.flatnonzero(first)
    position = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
    rank = np.empty(n, np.int64)
    rank[order] = position + 1
    return rank


def slot_works(rows: pa.RecordBatch, table: str, storage_options: dict[str, str]) -> list[SlotWork]:
    """The work items of a batch of work-item rows (every one checked before any is
    read: `WorkItemError` if one is not lance-cdf's)."""
    columns = [
        rows.column(c).to_pylist() if c in rows.schema.names else [None] * rows.num_rows
        for c in (WORK_SLOT, WORK_EVENTS, WORK_COLUMN, WORK_SCHEMA)
    ]
    items = [WorkItem.of(*values) for values in zip(*columns, strict=True)]
    return [SlotWork(item, table, storage_options) for item in items]


def handed_off(
    batches: Iterator[pa.RecordBatch], table: str, storage_options: dict[str, str]
) -> Iterator[pa.RecordBatch]:
    """The events of the work items a hand-off stream gives a writer task."""
    for rows in batches:
        for work in slot_works(rows, table, storage_options):
            yield from work.events()
