"""`lance-cdf publish`'s head start: the pending commits, and those made while Spark
starts, published from the driver process until the query takes over.

Spark starts its JVM and session, then a Python process, one after another, for each
step of a Python data source: the first record waited for all of them, and no change inside
lance-cdf's Spark code can go below that floor (docs/benchmarks.md, "Publishing to Kafka").
The head start reads and publishes the commits waiting at
start in the driver, beside the JVM's start, with the very code a writer task runs (one
hand-off work item covering every Kafka partition): its first round, which the query's
start waits for. Then it goes on, round after round, looking at the table as often as the
query's trigger does, and publishes each new whole version as it lands, until the query
takes over (`HandOver`): a commit made while the query starts reaches Kafka
as soon as one made after.

Why this sends nothing twice and reorders nothing (the exactly-once marks, see
`KafkaChangePublisher.high_water_marks`):
- it starts where the query will start: the newest committed offset of the checkpoint,
  or, for a new checkpoint, a numeric `--starting-version` (`latest` and timestamps are
  resolved when the query starts, so they get no head start: the head start could begin
  before them and leave a gap). Snapshots get none either;
- it publishes whole versions only (at most `HEAD_START_EVENTS` events planned a round),
  in commit order per partition, so each partition holds a prefix of its records, as after
  any interrupted writer;
- each round holds the hand-over lock, and the query takes it before its first writer task
  writes, after which no round starts: one writer at a time appends to a partition. The
  query plans from the same start (its first micro-batch may end before or after what the
  head start published), and each writer task finds its partitions' last records at or
  past them and skips what they hold.

It completes what it publishes: once every record is acknowledged it writes the versions'
BEGIN/END transaction metadata (the sink's own commit, `KafkaStreamWriter.commit`), so a
whole-version replicator can apply them whether or not the query ever commits a
micro-batch (a publisher stopped, or killed, while Spark starts). That commit skips what
the transaction topic already holds (its last record says how far an earlier writer got),
and so does the query's commit of the same versions after it: each BEGIN/END once.

Without exactly-once (`--at-least-once`) there are no marks, so there is no head start.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from lance_cdf.errors import LanceCdfError
from lance_cdf.spark.sink.sink_options import SinkOptions
from lance_cdf.spark.source.handover import HandOver

R = TypeVar("R")

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


def open_rounds(
    source_options: dict[str, str], sink_options: SinkOptions, kind: type[R]
) -> tuple[R, Any]:
    """The query's stream reader (one writer slot; a `kind`, else refused) and a writer of
    its work items: what a head start's rounds plan and publish with. The writer rides out
    a broker outage for one flush timeout, not the query's `rideOut`: a round holds the
    hand-over lock, so a head start waiting for Kafka would hold the query's writers and
    commit back; it ends instead (its acknowledged records stay, the query skips them) and
    the query rides the outage out with clients of its own."""
    from lance_cdf.spark.sink import kafka_sink as sink
    from lance_cdf.spark.source.data_source import LanceCdfDataSource
    from lance_cdf.spark.source.handoff import work_struct

    source = LanceCdfDataSource({**source_options, "writerSlots": "1"})
    reader = source.streamReader(source.schema())
    if not isinstance(reader, kind):  # (option writerSlots, given above, makes one)
        raise LanceCdfError(f"the head start needs a {kind.__name__}, not {type(reader).__name__}")
    brief = replace(sink_options, ride_out_s=sink_options.flush_timeout_s)
    writer = sink.LanceCdfKafkaSink(brief.to_options()).streamWriter(work_struct(), False)
    return reader, writer


class TableRounds:
    """One table's head start, round after round from `start`: each round publishes the
    whole versions after the last round's (up to `HEAD_START_EVENTS` events) with their
    BEGIN/END, in a turn of `hand_over` (None: no query to hand over to, as in a test)."""

    def __init__(
        self,
        source_options: dict[str, str],
        sink_options: SinkOptions,
        start: dict[str, Any],
        hand_over: HandOver | None = None,
    ):
        from lance_cdf.spark.source.readers import HandOffReader

        self.began = time.monotonic()
        self.reader, self.writer = open_rounds(source_options, sink_options, HandOffReader)
        self.completed = sink_options.transaction_metadata
        self.hand_over = hand_over
        self.table = source_options["path"]  # (as the query's writers name it: the URI)
        self.done = start  # the offset published through
        self.first = int(start["version"]) + 1
        self.records = 0

    def round(self) -> bool | None:
        """Publish the whole versions after `done`, up to `HEAD_START_EVENTS` events, then
        their BEGIN/END (none without transaction metadata): True if there were any, False
        if none has landed since; None: the head start ends (the query has taken over, or
        the next version alone is larger than `HEAD_START_EVENTS`: the query publishes
        it). Errors propagate; records already acknowledged stay and the query skips
        them."""
        from pyspark.sql.streaming.datasource import ReadMaxRows

        with turn(self.hand_over) as mine:
            if not mine:
                return None
            end = self.reader.latestOffset(self.done, ReadMaxRows(HEAD_START_EVENTS))
            if int(end["version"]) <= int(self.done["version"]):
                return False
            (share,) = self.reader.partitions(self.done, end)
            if share.planned > HEAD_START_EVENTS:
                return None
            published = self.writer.write(self.reader.read(share))
            self.writer.commit([published], -1)
            if self.hand_over is not None:  # the query's writers need not wait for these
                self.hand_over.published({self.table: int(end["version"])})
        self.reader.commit(end)
        self.records += published.records
        self.done = end
        return True

    def result(self) -> HeadStart | None:
        """What it published since the last call (None: nothing)."""
        last = int(self.done["version"])
        if last < self.first:
            return None
        seconds = time.monotonic() - self.began
        done = HeadStart(self.records, self.first, last, seconds, self.completed)
        self.first, self.records, self.began = last + 1, 0, time.monotonic()
        return done

    def close(self) -> None:
        """The head start has ended: the hand-over says so, and the driver's producer is
        not needed any more."""
        from lance_cdf.spark.sink import kafka_sink as sink

        if self.hand_over is not None:
            self.hand_over.take()
        sink.close_publishers()


@contextmanager
def turn(hand_over: HandOver | None) -> Iterator[bool]:
    if hand_over is None:
        yield True
        return
    with hand_over.turn() as mine:
        yield mine


class Rounds(Protocol):
    """A head start's rounds: a table's (`TableRounds`) or a database's
    (`database_headstart.DatabaseRounds`)."""

    def round(self) -> bool | None: ...

    def close(self) -> None: ...

    def result(self) -> object: ...


def run_rounds(head: Rounds, poll_s: float, stop: threading.Event) -> None:
    """Rounds until the head start ends (see `round`) or `stop` is set, the table looked at
    every `poll_s` seconds while nothing lands (as the query's trigger looks): a commit
    made while the query starts reaches Kafka as soon as one the query publishes."""
    while not stop.is_set():
        went = head.round()
        if went is None:
            return
        if not went:
            stop.wait(poll_s)


def head_start(
    source_options: dict[str, str], sink_options: SinkOptions, start: dict[str, Any]
) -> HeadStart | None:
    """One round from `start` (None: nothing pending, or the first pending version alone
    is larger than `HEAD_START_EVENTS`: the query publishes it)."""
    head = TableRounds(source_options, sink_options, start)
    try:
        head.round()
    finally:
        head.close()
    return head.result()


class Continued:
    """A head start's rounds after its first, in a thread of the publish process, until
    the query takes over or `stop` is set (the runner sets it once the query has run two
    micro-batches, and at its end); it then closes the head start and prints what it
    published (`said`: how a failure is told, one line)."""

    def __init__(self, head: Rounds, poll_s: float, said: Callable[[BaseException], str]):
        self.head, self.poll_s, self.said = head, poll_s, said
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lance-cdf-head-start", daemon=True)

    def start(self) -> Continued:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            run_rounds(self.head, self.poll_s, self.stop)
        except Exception as exc:  # noqa: BLE001 (the query publishes what it did not)
            print(f"head start ended ({self.said(exc)}); the query publishes the rest", flush=True)
        finally:
            self.head.close()
        done = self.head.result()
        if done is not None:
            print(done, flush=True)

    def end(self) -> None:
        """Stop after the round in progress, and wait for it."""
        self.stop.set()
        self.thread.join()
