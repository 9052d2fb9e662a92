"""The writer-slot hand-off, the Kafka side: a `lance-cdf-kafka` writer task reads its
slot's share of a micro-batch itself from the work items of a stream read with option
writerSlots (streaming/handoff.py), so no event crosses Spark's JVM. A Python source's
rows otherwise go Arrow -> JVM rows -> (a shuffle) -> Arrow to reach a Python writer
(1.16x narrow, 1.8x 768-d vectors: BENCHMARKS.md, "Hand-off").

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

from lance_cdf.keyhash import (
    KEY_HASH,
    PARTITION_COLUMN,
    WORK_COLUMN,
    WORK_EVENTS,
    WORK_SCHEMA,
    WORK_SLOT,
)
from lance_cdf.streaming.handoff import WorkItem
from lance_cdf.streaming.partitions import SourcePartition
from lance_cdf.streaming.source import work_reading


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
        reading = work_reading(self.item, self.table, self.storage_options)
        slot, slots, partitions = self.item.slot, self.item.slots, self.item.kafka_partitions
        for part in self.item.parts:
            for batch in reading.read(part):
                partition = batch.column(KEY_HASH).to_numpy() % partitions
                mine = partition % slots == slot
                if not mine.any():
                    continue
                batch = batch.filter(pa.array(mine)).drop_columns([KEY_HASH])
                owned = pa.array(partition[mine].astype(np.int32))
                yield batch.append_column(PARTITION_COLUMN, owned)


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
