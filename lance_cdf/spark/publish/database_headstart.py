"""`lance-cdf publish --database`'s head start: the commits waiting at start in every table,
and those made while Spark starts, published from the driver process until the query takes
over, as one table's head start does (`headstart.TableRounds`, whose reasons it shares: why
nothing is sent twice or out of order, and the hand-over, `HandOver`).

It starts where the query will start: the checkpoint's newest committed offset, or for a
new checkpoint with a numeric or `earliest` starting version each table's start as the
query's own reader takes it (`initialOffset`; a new checkpoint at `latest`, the default,
has nothing waiting: no head start). Each round plans one micro-batch as the query would,
with the database stream's own reader (`DatabaseReader`: its looks at quiet
tables spaced as the query's) and one writer slot: whole versions, at most
`HEAD_START_EVENTS` events per table; the head start ends if all of them together are more
than `HEAD_START_EVENTS_IN_ALL` (the query publishes them), and a round goes table after
table for at most `HEAD_START_SECONDS` (the next round, or the query, publishes the tables
not reached). The database sink's writer publishes each table's share to its topic and its
commit writes their transaction metadata (both skip what an earlier writer left in the
topics); the query plans from the same start and its writer tasks skip what the topics
hold. A table in the middle of its snapshot gets none (as one table's).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from lance_cdf.errors import LanceCdfError
from lance_cdf.spark.publish.headstart import HEAD_START_EVENTS, open_rounds, turn
from lance_cdf.spark.sink.sink_options import SinkOptions
from lance_cdf.spark.source.handover import HandOver

# all tables' events together: each table up to HEAD_START_EVENTS, the head start as a whole
# bounded so that it still ends within the Spark session's start; more and the query
# publishes them (docs/benchmarks.md, "Publishing to Kafka")
HEAD_START_EVENTS_IN_ALL = 5 * HEAD_START_EVENTS
# the query starts once the head start's first round has ended, and takes over from a later
# round once it has ended: a round stops taking tables up after this long (each table's
# first use costs its topic check, registry subjects and first reads), well within the
# JVM's and the session's start, which the first round runs beside
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


class DatabaseRounds:
    """A database's head start, round after round from `start`: each round plans one
    micro-batch as the query would (whole versions, at most `HEAD_START_EVENTS` events per
    table) and publishes it table after table, with the tables' BEGIN/END, in a turn of
    `hand_over` (None: no query to hand over to, as in a test)."""

    def __init__(
        self,
        source_options: dict[str, str],
        sink_options: SinkOptions,
        start: dict[str, Any],
        hand_over: HandOver | None = None,
    ):
        from lance_cdf.spark.source.database_stream import DatabaseReader

        self.began = time.monotonic()
        # the report is the query's; so are the commit events: a receiver here would take
        # (and delete) queue messages whose tables the query then looks at only by its
        # safety net. The head start's rounds look at its tables by listing.
        dropped = {"report", "commitEvents", "commitEventsPollMax"}
        options = {k: v for k, v in source_options.items() if k not in dropped}
        self.reader, self.writer = open_rounds(options, sink_options, DatabaseReader)
        self.hand_over = hand_over
        if "tables" not in start:  # a new checkpoint: each table where the query will take it
            start = self.reader.initialOffset()
        self.done = start  # per table, the offset published through
        self.records = 0
        self.tables: set[str] = set()  # tables with records published
        self.left = 0  # tables with waiting commits the last round did not reach
        self.rounds = 0  # rounds that published
        self.looked = False  # a round has run

    def round(self) -> bool | None:
        """Publish the whole versions waiting after `done` in every table, table after
        table for at most `HEAD_START_SECONDS`, then their BEGIN/END: True if there were
        any, False if none has landed since; None: the head start ends (the query has
        taken over, they are more than `HEAD_START_EVENTS_IN_ALL` events, or the plan alone
        took the time). Errors propagate; records already acknowledged stay and the query
        skips them."""
        from pyspark.sql.streaming.datasource import ReadMaxRows

        from lance_cdf.spark.source.database_stream import DatabaseSlot

        # the first round's time counts from the start (the tables' take-up included)
        t = time.monotonic() if self.looked else self.began
        self.looked = True
        with turn(self.hand_over) as mine:
            if not mine:
                return None
            end = self.reader.latestOffset(self.done, ReadMaxRows(HEAD_START_EVENTS))
            parts = self.reader.partitions(self.done, end)
            slots = [s for s in parts if isinstance(s, DatabaseSlot) and s.rows]
            if not slots:
                return False
            (slot,) = slots  # one writer slot: a row (a work item) per table
            if time.monotonic() > t + HEAD_START_SECONDS:
                return None
            if sum(row[1] for row in slot.rows) > HEAD_START_EVENTS_IN_ALL:
                return None
            published = []
            for row in slot.rows:  # whole tables: the query publishes those not reached
                if time.monotonic() > t + HEAD_START_SECONDS:
                    break
                one = DatabaseSlot(slot.slot, (row,))
                published.append(self.writer.write(self.reader.read(one)))
            self.writer.commit(list(published), -1)  # their BEGIN/END (none without metadata)
            reached = {json.loads(row[2])["name"] for row in slot.rows[: len(published)]}
            self.done = _through(self.done, end, reached)
            if self.hand_over is not None:  # the query's writers need not wait for these
                self.hand_over.published(_versions(self.done))
        self.records += sum(p.records for p in published)
        self.tables |= {name for p in published for name in p.tables}
        self.left = len(slot.rows) - len(published)
        self.rounds += 1
        return True

    def result(self) -> DatabaseHeadStart | None:
        """What it published since the last call (None: nothing)."""
        if not self.rounds:
            return None
        seconds = time.monotonic() - self.began
        done = DatabaseHeadStart(self.records, len(self.tables), self.left, seconds)
        self.records, self.tables, self.rounds = 0, set(), 0
        self.began = time.monotonic()
        return done

    def close(self) -> None:
        """The head start has ended: the hand-over says so, and the driver's producers are
        not needed any more."""
        from lance_cdf.spark.sink import kafka_sink as sink

        if self.hand_over is not None:
            self.hand_over.take()
        sink.close_publishers()


def _versions(offset: dict[str, Any]) -> dict[str, int]:
    """Each table's version in a database offset."""
    tables = offset.get("tables") or {}
    return {name: int(o["version"]) for name, o in tables.items() if "version" in o}


def _through(done: dict[str, Any], end: dict[str, Any], reached: set[str]) -> dict[str, Any]:
    """The database offset published through after a round planned `done` -> `end`: `end`'s
    offset for the tables whose share it published, `done`'s for the others (never past
    what is in Kafka: the query's writers go on without the lock up to it). A table with
    no share (no events, or set aside) is planned again next round."""
    tables = dict(done.get("tables") or {})
    tables.update({n: o for n, o in (end.get("tables") or {}).items() if n in reached})
    return {**end, "tables": tables}


def database_head_start(
    source_options: dict[str, str], sink_options: SinkOptions, start: dict[str, Any]
) -> DatabaseHeadStart | None:
    """One round from `start` (None: nothing pending, more than `HEAD_START_EVENTS_IN_ALL`
    events in all, or the plan alone took `HEAD_START_SECONDS`)."""
    head = DatabaseRounds(source_options, sink_options, start)
    try:
        head.round()
    finally:
        head.close()
    return head.result()
