"""`lance-cdf publish`'s head start: the first pending commits published from the driver
process while Spark starts.

Spark takes seconds to start its JVM and session, then starts a Python process, one
after another, for each step of a Python data source: the first record waited tens of
seconds, and no change inside lance-cdf's Spark code can go below that floor
(docs/benchmarks.md, "Start-up"). The head start reads and publishes the commits waiting at
start in the driver, beside the JVM's start, with the very code a writer task runs (one
hand-off work item covering every Kafka partition).

Why this sends nothing twice and reorders nothing (the exactly-once marks, see
`KafkaChangePublisher.high_water_marks`):
- it starts where the query will start: the newest committed offset of the checkpoint,
  or, for a new checkpoint, a numeric `--starting-version` (`latest` and timestamps are
  resolved when the query starts, so they get no head start: the head start could begin
  before them and leave a gap). Snapshots get none either;
- it publishes whole versions only (at most `HEAD_START_EVENTS` events planned), in commit
  order per partition, so each partition holds a prefix of its records, as after any
  interrupted writer;
- it ends before the query starts, so one writer at a time appends to a partition; the
  query then plans the same versions, and each writer task finds its partitions' last
  records at or past them and skips what they hold.

It completes what it publishes: once every record is acknowledged it writes the versions'
BEGIN/END transaction metadata (the sink's own commit, `KafkaStreamWriter.commit`), so a
whole-version replicator can apply them whether or not the query ever commits a
micro-batch (a publisher stopped, or killed, while Spark starts). That commit skips what
the transaction topic already holds (its last record says how far an earlier writer got),
and so does the query's commit of the same versions after it: each BEGIN/END once.

Without exactly-once (`--at-least-once`) there are no marks, so there is no head start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from lance_cdf.errors import LanceCdfError

# A head start is meant to end well within the Spark session's start: this many events
# take a small part of it at one process's publishing rate
# (docs/benchmarks.md, "Inside the publisher").
HEAD_START_EVENTS = 20_000


@dataclass(frozen=True)
class HeadStart:
    records: int
    first: int  # first version published
    last: int
    seconds: float
    completed: bool = True  # their transaction metadata written too

    def __str__(self) -> str:
        versions = f"{self.first}" if self.first == self.last else f"{self.first}-{self.last}"
        ends = " with their transaction metadata" if self.completed else ""
        return (
            f"head start: {self.records} record(s) of version(s) {versions} published{ends} "
            f"in {self.seconds:.1f} s while Spark started"
        )


def start_offset(
    checkpoint: str, starting_version: str | None, snapshot: bool
) -> dict[str, Any] | None:
    """Where the query will start (the offset before its first version: the checkpoint's
    own, with the table identity the reader checks), or None where that is only known once
    it starts."""
    from lance_cdf.spark.source.checkpoint import committed_offset

    if snapshot:
        return None
    try:
        offset = committed_offset(checkpoint)
    except (LanceCdfError, OSError):
        return None  # a remote or unreadable checkpoint: Spark reads it
    if offset is not None:
        return None if "snapshot" in offset else offset
    if starting_version is not None and starting_version.isdigit():
        return {"version": int(starting_version) - 1}
    return None


def head_start(
    source_options: dict[str, str], sink_options: dict[str, str], start: dict[str, Any]
) -> HeadStart | None:
    """Publish the whole versions after `start`, up to `HEAD_START_EVENTS` events (None:
    nothing pending, or the first pending version alone is larger: the query publishes
    it). Errors propagate; records already acknowledged stay and the query skips them."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from lance_cdf.spark.sink import kafka_sink as sink
    from lance_cdf.spark.source.data_source import LanceCdfDataSource
    from lance_cdf.spark.source.handoff import work_struct
    from lance_cdf.spark.source.readers import HandOffReader

    t = time.monotonic()
    source = LanceCdfDataSource({**source_options, "writerSlots": "1"})
    reader = source.streamReader(source.schema())
    if not isinstance(reader, HandOffReader):  # option writerSlots (given above) makes one
        raise LanceCdfError(f"the head start needs a hand-off reader, not {type(reader).__name__}")
    end = reader.latestOffset(start, ReadMaxRows(HEAD_START_EVENTS))
    first, last = int(start["version"]) + 1, int(end["version"])
    if last < first:
        return None
    (share,) = reader.partitions(start, end)
    if share.planned > HEAD_START_EVENTS:
        return None
    writer = sink.LanceCdfKafkaSink(sink_options).streamWriter(work_struct(), False)
    lowered = {k.lower(): v for k, v in sink_options.items()}
    completed = lowered.get("transactionmetadata", "true").lower() == "true"
    try:
        published = writer.write(reader.read(share))
        writer.commit([published], -1)  # the versions' BEGIN/END (none without metadata)
    finally:
        sink.close_publishers()  # the driver's producer is not needed after this
    return HeadStart(published.records, first, last, time.monotonic() - t, completed)
