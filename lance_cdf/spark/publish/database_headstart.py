"""`lance-cdf publish --database`'s head start: the commits waiting at start in every table,
published from the driver process while Spark starts, as one table's head start does
(spark/publish/headstart.py, whose reasons it shares: why nothing is sent twice or out of
order).

It starts where the query will start: the checkpoint's newest committed offset, or for a
new checkpoint with a numeric or `earliest` starting version each table's start as the
query's own reader takes it (`initialOffset`; a new checkpoint at `latest`, the default,
has nothing waiting: no head start), and plans one micro-batch as the query would, with
the database stream's own reader (spark/source/database_stream.py) and one writer slot:
whole versions, at most `HEAD_START_EVENTS` events per table, nothing if all of them
together are more than `HEAD_START_EVENTS_IN_ALL` (the query publishes them), and table
after table for at most `HEAD_START_SECONDS` (the query publishes the tables not reached).
The database sink's writer publishes each table's share to its topic and its commit writes
their transaction metadata (both skip what an earlier writer left in the topics); then the
query plans the same versions and its writer tasks skip what the topics hold. A table in
the middle of its snapshot gets none (as one table's).
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
# the query starts once the head start has ended: it stops taking tables up after this
# long (each table's first use costs its topic check, registry subjects and first reads),
# well within the JVM's and the session's start, which it runs beside
HEAD_START_SECONDS = 5.0


@dataclass(frozen=True)
class DatabaseHeadStart:
    records: int
    tables: int  # tables with records published
    left: int  # tables with waiting commits left to the query (the time was up)
    seconds: float

    def __str__(self) -> str:
        left = f" ({self.left} more left to the query)" if self.left else ""
        return (
            f"head start: {self.records} record(s) of {self.tables} table(s) published in "
            f"{self.seconds:.1f} s while Spark started{left}"
        )


def database_start_offset(checkpoint: str, starting: str | None) -> dict[str, Any] | None:
    """Where the database query starts: the checkpoint's committed offset; for a new
    checkpoint started at a version number or `earliest`, `{"from": starting}` (the tables'
    offsets are taken by the head start's reader, as the query's takes them); None where
    nothing waits or the start is known only to the query: a new checkpoint at `latest` or
    a snapshot, a remote or unreadable checkpoint, or one with a table in its snapshot."""
    from lance_cdf.spark.source.checkpoint import committed_offset

    try:
        offset = committed_offset(checkpoint)
    except (LanceCdfError, OSError):
        return None
    if offset is None:
        new = starting is not None and (starting.isdigit() or starting == "earliest")
        return {"from": starting} if new else None
    if not isinstance(offset.get("tables"), dict):
        return None
    if any("snapshot" in table for table in offset["tables"].values()):
        return None
    return offset


def database_head_start(
    source_options: dict[str, str], sink_options: dict[str, str], start: dict[str, Any]
) -> DatabaseHeadStart | None:
    """Publish the whole versions waiting after `start` in the followed tables, table by
    table until `HEAD_START_SECONDS` have passed (None: nothing pending, more than
    `HEAD_START_EVENTS_IN_ALL` events in all, or the plan alone took that long). Errors
    propagate; records already acknowledged stay and the query skips them."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from lance_cdf.spark.sink import kafka_sink as sink
    from lance_cdf.spark.source.data_source import LanceCdfDataSource
    from lance_cdf.spark.source.database_stream import DatabaseReader, DatabaseSlot
    from lance_cdf.spark.source.handoff import work_struct

    t = time.monotonic()
    deadline = t + HEAD_START_SECONDS
    options = {k: v for k, v in source_options.items() if k != "report"}  # (the query's)
    source = LanceCdfDataSource({**options, "writerSlots": "1"})
    reader = source.streamReader(source.schema())
    if not isinstance(reader, DatabaseReader):
        raise LanceCdfError(f"the head start needs a database reader, not {type(reader).__name__}")
    if "tables" not in start:  # a new checkpoint: each table where the query will take it
        start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(HEAD_START_EVENTS))
    slots = [s for s in reader.partitions(start, end) if isinstance(s, DatabaseSlot) and s.rows]
    if not slots or time.monotonic() > deadline:
        return None
    (slot,) = slots  # one writer slot: a row (a work item) per table
    if sum(row[1] for row in slot.rows) > HEAD_START_EVENTS_IN_ALL:
        return None
    writer = sink.LanceCdfKafkaSink(sink_options).streamWriter(work_struct(), False)
    published = []
    try:
        for row in slot.rows:  # whole tables: the query publishes those not reached
            if time.monotonic() > deadline:
                break
            published.append(writer.write(reader.read(DatabaseSlot(slot.slot, (row,)))))
        writer.commit(list(published), -1)  # their BEGIN/END (none without metadata)
    finally:
        sink.close_publishers()  # the driver's producers are not needed after this
    tables = {name for p in published for name in p.tables}
    return DatabaseHeadStart(
        sum(p.records for p in published),
        len(tables),
        len(slot.rows) - len(published),
        time.monotonic() - t,
    )
