"""`lance-cdf publish --database`'s head start: the commits waiting at start in every table,
published from the driver process while Spark starts, as one table's head start does
(spark/publish/headstart.py, whose reasons it shares: why nothing is sent twice or out of
order).

It starts where the query will start, the checkpoint's newest committed offset (a new
checkpoint starts at each table's latest version, known only when the query starts: no
head start), and plans one micro-batch as the query would, with the database stream's own
reader (spark/source/database_stream.py) and one writer slot: whole versions, at most
`HEAD_START_EVENTS` events per table, nothing if all of them together are more than
`HEAD_START_EVENTS_IN_ALL` (the query publishes them). The database sink's writer
publishes each table's share to its topic and its commit writes their transaction
metadata (both skip what an earlier writer left in the topics); then the query plans the
same versions and its writer tasks skip what the topics hold. A table in the middle of its
snapshot gets none (as one table's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from lance_cdf.errors import LanceCdfError
from lance_cdf.spark.publish.headstart import HEAD_START_EVENTS

# all tables' events together: each table up to HEAD_START_EVENTS, the head start as a whole
# bounded so that it still ends within the Spark session's start; more and the query
# publishes them (docs/benchmarks.md, "Start-up")
HEAD_START_EVENTS_IN_ALL = 5 * HEAD_START_EVENTS


@dataclass(frozen=True)
class DatabaseHeadStart:
    records: int
    tables: int  # tables with records published
    seconds: float

    def __str__(self) -> str:
        return (
            f"head start: {self.records} record(s) of {self.tables} table(s) published in "
            f"{self.seconds:.1f} s while Spark started"
        )


def database_start_offset(checkpoint: str) -> dict[str, Any] | None:
    """The database query's committed offset, where a restarted query starts; None for a
    new, remote or unreadable checkpoint, or one with a table in its snapshot."""
    from lance_cdf.spark.source.checkpoint import committed_offset

    try:
        offset = committed_offset(checkpoint)
    except (LanceCdfError, OSError):
        return None
    if offset is None or not isinstance(offset.get("tables"), dict):
        return None
    if any("snapshot" in table for table in offset["tables"].values()):
        return None
    return offset


def database_head_start(
    source_options: dict[str, str], sink_options: dict[str, str], start: dict[str, Any]
) -> DatabaseHeadStart | None:
    """Publish the whole versions waiting after `start` in every followed table (None:
    nothing pending, or more than `HEAD_START_EVENTS_IN_ALL` events in all). Errors propagate;
    records already acknowledged stay and the query skips them."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from lance_cdf.spark.sink import kafka_sink as sink
    from lance_cdf.spark.source.data_source import LanceCdfDataSource
    from lance_cdf.spark.source.database_stream import DatabaseReader, DatabaseSlot
    from lance_cdf.spark.source.handoff import work_struct

    t = time.monotonic()
    options = {k: v for k, v in source_options.items() if k != "report"}  # (the query's)
    source = LanceCdfDataSource({**options, "writerSlots": "1"})
    reader = source.streamReader(source.schema())
    if not isinstance(reader, DatabaseReader):
        raise LanceCdfError(f"the head start needs a database reader, not {type(reader).__name__}")
    end = reader.latestOffset(start, ReadMaxRows(HEAD_START_EVENTS))
    slots = [s for s in reader.partitions(start, end) if isinstance(s, DatabaseSlot) and s.rows]
    if not slots:
        return None
    (slot,) = slots  # one writer slot
    if sum(row[1] for row in slot.rows) > HEAD_START_EVENTS_IN_ALL:
        return None
    writer = sink.LanceCdfKafkaSink(sink_options).streamWriter(work_struct(), False)
    try:
        published = writer.write(reader.read(slot))
        writer.commit([published], -1)  # the versions' BEGIN/END (none without metadata)
    finally:
        sink.close_publishers()  # the driver's producers are not needed after this
    return DatabaseHeadStart(published.records, len(published.tables), time.monotonic() - t)
