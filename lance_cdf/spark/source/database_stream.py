"""A whole database as one stream (`lance-cdf publish --database`): the `lance-cdf` source
with option `database` and no `path`, read with option writerSlots, follows every table of a
LanceDB database / Lance directory namespace (lance_cdf.format.namespace) whose qualified name
matches option `include` and not option `exclude` (regexes, `re.fullmatch`), in one query.

The offset is a map of the tables' own offsets, each exactly what a single-table stream of
that table would have (its version, snapshot position, identity and start:
`identity.stamp`), checked per table on restart:
`{"tables": {"sales.orders": {"version": 7, ...}, ...}, "from": <the start given>}`.

Each table is followed by a single-table `HandOffReader` kept on the driver, made when the
table is first seen: the tables there when the query first started begin where the start
option says (`startingVersion`, default latest); a table that appears later (created, or
newly matching) begins at its first readable version, or with its snapshot under
`startingVersion=snapshot`. A table enters the offset at its initial offset first (a
micro-batch that sends nothing), so a replayed micro-batch never has to recompute where a
table began. Each micro-batch is `writerSlots` partitions; a slot's partition holds one
work item per table with changes, naming its table (`WorkItem.name`); the sink resolves the
name to the table's URI, topic and record names itself (`KafkaStreamWriter._write_database`).

Cost: a look at a table is one listing of its `_versions/` (the latest version), nothing
else; a table that changed is looked at every trigger, a quiet one less and less often, up
to option `idlePollMax` seconds apart (`IdlePolls`); the database is listed every
`LIST_EVERY` seconds (new tables within that). With option `commitEvents` (an SQS queue
the bucket notifies, or `files`: `CommitEvents`) a table is looked at when an event
names it, and otherwise every `commitEventsPollMax` seconds while the events are heard;
the database is listed every `LIST_EVERY_HEARD` seconds then, or at once when an event
names a table it does not know (a new one). A receiver that is not heard brings back the
listing schedule, and the report (`lance-cdf status`, the metrics) says why.
A table that can never be followed (no stable row IDs, a name that cannot be a topic) is
reported in one line and left out. A table whose take-up or read fails otherwise (the object
store throttles or fails, the table is caught mid-commit, its checkpoint is another
table's) is set aside alone (`AsideTables`: one line naming the cause, the report `lance-cdf
status` reads, the metrics) and tried again later with a growing pause; a followed table
set aside keeps its offset, so it resumes exactly where it was. A table that disappears
from the database is reported and let go; the others go on.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from lance_cdf.core.stream_columns import WORK_COLUMN, WORK_EVENTS, WORK_SCHEMA, WORK_SLOT
from lance_cdf.errors import (
    CheckpointMismatchError,
    LanceCdfError,
    StableRowIdsRequiredError,
    in_words,
)
from lance_cdf.format.io import FileSystem, local_path, open_filesystem
from lance_cdf.format.namespace import TableRef, list_tables
from lance_cdf.format.versions import list_versions
from lance_cdf.ops.commit_hints import CommitEvents, CommitHints, Receiver
from lance_cdf.ops.state_files import write_atomic
from lance_cdf.ops.takeup import AsideTables, is_transient
from lance_cdf.retry import retry
from lance_cdf.spark.source.handoff import WriterSlot
from lance_cdf.spark.source.handover import HandOver
from lance_cdf.spark.source.idle_polls import (
    EVENTS_POLL_MAX,
    IDLE_POLL_MAX,
    IdlePolls,
    default_ceiling,
    idle_poll_max,
)
from lance_cdf.spark.source.options import SourceOptions
from lance_cdf.spark.source.partitions import Offset
from lance_cdf.spark.source.readers import HandOffReader, LanceCdfStreamReader
from lance_cdf.spark.source.resolution import Resolved, event_struct, resolve
from lance_cdf.spark.source.table_feeds import forget_feed

log = logging.getLogger("lance_cdf.spark.source")

LIST_EVERY = 5.0  # seconds between listings of the database (new tables within this)
# the same while commit events are heard: a new table's first commit names it at once (and
# has the database listed then), a dropped table's failed look too; this listing only lets
# go of dropped tables no look has met. A namespace's listing reads its `__manifest` (a few
# requests): at 200 idle tables it would be a fifth of their requests every minute.
LIST_EVERY_HEARD = 300.0
TRANSACTION_SUFFIX = ".transaction"  # default transaction topics' (`kafka.transactions.SUFFIX`)
# options of the database stream itself (the rest are each table's source options)
DATABASE_OPTIONS = {
    "database",
    "include",
    "exclude",
    "report",
    "idlepollmax",
    "handover",
    "commitevents",
    "commiteventspollmax",
}
# a qualified name whose parts are Avro names (each part names a record namespace level)
_AVRO_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_database_stream(options: Mapping[str, str]) -> bool:
    """Option `database` without `path`: the whole database (with `path`, one table of it)."""
    lower = {str(k).lower(): v for k, v in options.items()}
    return bool(lower.get("database")) and not lower.get("path")


@dataclass(frozen=True)
class DatabaseOptions:
    database: str
    include: re.Pattern[str] | None
    exclude: re.Pattern[str] | None
    table_options: dict[str, str]  # each table's source options, but its path
    table: SourceOptions  # the same, parsed (its path: the database's)
    storage_options: dict[str, str]
    report: str | None  # a local file the followed and skipped tables are written to
    starting: str | None  # the start given (startingVersion), None: the default (latest)
    # the longest wait between looks at a quiet table (given, or default_ceiling's)
    idle_poll_max: float = IDLE_POLL_MAX
    # handOver (internal, set by lance-cdf publish): the file through which its head start
    # hands over to this query at its first plan (`HandOver`)
    hand_over: str | None = None
    # commitEvents: where commit events come from (None: tables found by listing alone),
    # and commitEventsPollMax: the safety net's wait between looks while they are heard
    commit_events: CommitEvents | None = None
    events_poll_max: float = EVENTS_POLL_MAX

    @classmethod
    def parse(cls, raw: Mapping[str, str], events: bool = False) -> DatabaseOptions:
        """`events`: the event stream of every table (`DatabaseEventReader`), whose
        own start options are checked there; else the work items of publish --database."""
        options = {str(k): str(v) for k, v in raw.items()}
        lower = {k.lower(): v for k, v in options.items()}
        if not events and not lower.get("writerslots"):
            raise LanceCdfError(
                'option "database" without "path" reads every table of the database: it is '
                "for lance-cdf publish --database (option writerSlots); to read one table, "
                'give its name as option "path"'
            )
        if not events and ("startingtimestamp" in lower or "endingversion" in lower):
            raise LanceCdfError(
                "a database stream takes startingVersion (a number, latest, earliest or "
                "snapshot), not startingTimestamp or endingVersion"
            )
        patterns = {}
        for key in ("include", "exclude"):
            text = lower.get(key)
            try:
                patterns[key] = re.compile(text) if text else None
            except re.error as exc:
                raise LanceCdfError(
                    f"option {key} {text!r} is not a regular expression ({exc}); it is matched "
                    "against whole qualified names, e.g. 'sales\\..*'"
                ) from None
        table_options = {k: v for k, v in options.items() if k.lower() not in DATABASE_OPTIONS}
        # (the event stream's checks of its own come first: `database_events.parse`)
        table = SourceOptions.parse({**table_options, "path": lower["database"]}, not events)
        return cls(
            database=lower["database"],
            include=patterns["include"],
            exclude=patterns["exclude"],
            table_options=table_options,
            table=table,
            storage_options=table.storage_options,
            report=lower.get("report"),
            starting=lower.get("startingversion"),
            idle_poll_max=(
                idle_poll_max(lower["idlepollmax"])
                if "idlepollmax" in lower
                else default_ceiling(lower["database"])
            ),
            hand_over=lower.get("handover") or None,
            commit_events=(
                CommitEvents.parse(lower["commitevents"], lower["database"])
                if lower.get("commitevents")
                else None
            ),
            events_poll_max=idle_poll_max(lower.get("commiteventspollmax", str(EVENTS_POLL_MAX))),
        )

    def matches(self, name: str) -> bool:
        if self.include is not None and not self.include.fullmatch(name):
            return False
        return self.exclude is None or not self.exclude.fullmatch(name)


def not_followable(name: str, names: set[str]) -> str | None:
    """Why table `name` (of a database whose matching tables are `names`) cannot have its
    own topic `<prefix>.<name>`, or None."""
    bad = [p for p in name.split(".") if not _AVRO_PART.fullmatch(p)]
    if bad:
        return (
            f"its name part(s) {bad} cannot name Avro records (letters, digits and _, not "
            "starting with a digit); rename the table or leave it out with --exclude"
        )
    if name.endswith(TRANSACTION_SUFFIX) and name[: -len(TRANSACTION_SUFFIX)] in names:
        return (
            f"its topic would be table {name[: -len(TRANSACTION_SUFFIX)]!r}'s transaction "
            "topic; rename it or leave it out with --exclude"
        )
    return None


@dataclass(frozen=True)
class DatabaseSlot(InputPartition):
    """Writer slot `slot` of a micro-batch: the work items (rows of `work_struct()`, one per
    table with changes) it hands to the sink's writer task, as plain values."""

    slot: int
    rows: tuple[tuple[int, int, str, bytes], ...]


class DatabaseReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The database stream's reader: the tables' `HandOffReader`s on the driver, their
    offsets in one map (see the module's doc)."""

    EVENTS = False  # the work items of publish --database (`DatabaseEventReader`: events)

    def __init__(self, options: Mapping[str, str]):
        self.options = DatabaseOptions.parse(options, events=self.EVENTS)
        self.readers: dict[str, LanceCdfStreamReader] = {}  # name -> its reader (driver only)
        self.refs: dict[str, TableRef] = {}  # the matching tables at the last listing
        self.listed_at = -LIST_EVERY
        self.skipped: dict[str, str] = {}  # name -> why it is not followed
        self.aside = AsideTables()  # tables whose take-up or read failed: tried again later
        self.at_start: set[str] = set()  # set aside at the first start: begin as given
        self.available_now = False
        self.reported: str | None = None
        self.polls = self._polls()  # when tables are looked at
        self.clock = time.monotonic  # the polls' clock
        self.known_dirs: set[tuple[str, ...]] = set()  # root directories found to be tables
        self.root_fs: FileSystem | None = None  # the database's store (quiet tables' looks)
        self.hints: CommitHints | None = None  # commit events' inbox (option commitEvents)
        self.receiver: Receiver | None = None  # what fills it, started at the first look
        self.dirs: dict[str, str] = {}  # a table's directory under the root -> its name
        self.strangers: set[str] = set()  # hinted directories no listing knew since the last

    def _polls(self) -> IdlePolls:
        return IdlePolls(
            ceiling=self.options.idle_poll_max, events_ceiling=self.options.events_poll_max
        )

    def __getstate__(self) -> dict[str, object]:
        # executors need nothing of it: the partitions carry the work items
        return {
            "options": self.options,
            "readers": {},
            "refs": {},
            "listed_at": 0.0,
            "skipped": {},
            "aside": AsideTables(),
            "at_start": set(),
            "available_now": False,
            "reported": None,
            "polls": self._polls(),
            "clock": time.monotonic,
            "known_dirs": set(),
            "root_fs": None,
            "hints": None,
            "receiver": None,
            "dirs": {},
            "strangers": set(),
        }

    # -- tables -----------------------------------------------------------
    def _tables(self, force: bool = False) -> dict[str, TableRef]:
        """The matching tables, listed again every LIST_EVERY seconds (or when `force`)."""
        now = time.monotonic()
        every = LIST_EVERY_HEARD if self.polls.events else LIST_EVERY
        if not force and (self.available_now or now - self.listed_at < every):
            return self.refs
        try:
            listed = list_tables(
                self.options.database, self.options.storage_options, self.known_dirs
            )
        except Exception as exc:
            if self.listed_at < 0:
                raise  # the first listing: the database itself is wrong
            log.warning(
                "listing the database failed (%s); trying again in %.0f s",
                why_not_read(exc),
                LIST_EVERY,
            )
            self.listed_at = now
            return self.refs
        refs = {r.qualified_name: r for r in listed if self.options.matches(r.qualified_name)}
        self.listed_at = now
        for name in sorted(set(self.refs) - set(refs)):
            self.readers.pop(name, None)  # (latestOffset reports it, once)
        for name in [n for n in self.skipped if n not in refs]:
            del self.skipped[name]  # a table of that name may come back: judged afresh
        for name in [n for n in self.aside.tables if n not in refs]:
            self.aside.forget(name)
            self.at_start.discard(name)
        for name in sorted(refs):
            why = self._not_followable(name, set(refs))
            if why is not None and name not in self.skipped:
                self._skip(name, why)
        self.refs = refs
        self._map_dirs(refs)
        return refs

    def _map_dirs(self, refs: Mapping[str, TableRef]) -> None:
        """Each table's directory under the root, as commit events name it; the tables
        outside the root (a `__manifest` location elsewhere) no event names: listed on the
        listing schedule."""
        root = (local_path(self.options.database) or self.options.database).rstrip("/") + "/"
        self.dirs = {
            r.uri[len(root) :].strip("/"): n for n, r in refs.items() if r.uri.startswith(root)
        }
        self.polls.unheard = {n for n, r in refs.items() if not r.uri.startswith(root)}
        self.strangers.clear()

    def _not_followable(self, name: str, names: set[str]) -> str | None:
        """Why a matching table is left out by its name alone (here: it cannot be a topic)."""
        return not_followable(name, names)

    def _stops_on(self, exc: Exception, followed: bool) -> bool:
        """Whether a table's error (`followed`: one it was already following, else one it
        takes up) stops the query instead of leaving the table out."""
        return False

    def _skip(self, name: str, why: str) -> None:
        log.warning("table %s is not followed: %s", name, why)
        self.skipped[name] = why
        self.readers.pop(name, None)

    def _failed(self, name: str, exc: Exception, what: str) -> None:
        """Table `name`'s take-up or read failed: left out for good if it can never be
        followed (no stable row IDs), else set aside and tried again later."""
        self.readers.pop(name, None)  # a retry starts from a fresh reader
        if isinstance(exc, StableRowIdsRequiredError):
            self._skip(name, why_not_read(exc))
            return
        self.aside.fail(name, exc, what)

    def _reader(self, name: str, starting: str | None) -> LanceCdfStreamReader:
        """The table's reader, made on first use (`starting`: its start, if it is new)."""
        reader = self.readers.get(name)
        if reader is None:
            options = {**self.options.table_options, "path": self.refs[name].uri}
            forget_feed(self.refs[name].uri, self.options.storage_options)  # read afresh
            options = {k: v for k, v in options.items() if k.lower() != "startingversion"}
            if starting is not None:
                options["startingVersion"] = starting
            resolved = resolve(options, streaming=True)
            reader = self._make_reader(name, resolved)
            reader.given = None  # the start is checked for the whole database (`_check`)
            if self.available_now:
                reader.prepareForTriggerAvailableNow()
            self.readers[name] = reader
        return reader

    def _make_reader(self, name: str, resolved: Resolved) -> LanceCdfStreamReader:
        """A table's reader from its resolved options (here: one that hands off work items)."""
        return HandOffReader(resolved, event_struct(resolved))

    def _later_start(self) -> str:
        """Where a table seen after the query first started begins: its first version."""
        return "snapshot" if self.options.starting == "snapshot" else "earliest"

    # -- offsets ----------------------------------------------------------
    def initialOffset(self) -> Offset:
        self._listen()
        tables: dict[str, Offset] = {}
        for name in sorted(self._tables(force=True)):
            if name in self.skipped:
                continue
            try:
                tables[name] = self._reader(name, self.options.starting).initialOffset()
            except Exception as exc:  # noqa: BLE001 (one table's fault: reported, left out)
                if self._stops_on(exc, False):
                    raise
                self._failed(name, exc, "taking it up")
                self.at_start.add(name)
        self._report(tables)
        return {"tables": tables, "from": self.options.starting or "latest"}

    def _check(self, start: Offset) -> None:
        held = start.get("from")
        given = self.options.starting or "latest"
        if self.options.starting is not None and held is not None and held != given:
            raise CheckpointMismatchError(
                f"the checkpoint was started with --starting-version {held}; "
                f"--starting-version {given} applies to a new checkpoint only. Leave it out "
                "(or give the same) to resume, or give a new --checkpoint"
            )

    def prepareForTriggerAvailableNow(self) -> None:
        self._tables(force=True)
        self.available_now = True
        for reader in self.readers.values():
            reader.prepareForTriggerAvailableNow()

    def getDefaultReadLimit(self) -> ReadLimit:
        rows = self.options.table.max_rows_per_trigger
        return ReadMaxRows(rows) if rows else ReadAllAvailable()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        self._check(start)
        held: dict[str, Offset] = dict(start.get("tables") or {})
        self._listen()
        now = self.clock()
        self._hear(now)
        refs = self._tables()
        tables: dict[str, Offset] = {}
        for name in sorted(refs):
            if name in self.skipped:
                continue
            offset = held.get(name)
            if offset is not None and not self.aside.due(name):
                tables[name] = offset  # set aside: kept where it was until tried again
                continue
            if offset is None and not self.aside.due(name):
                continue
            try:
                if offset is not None and not self.available_now and not self.polls.due(name, now):
                    tables[name] = offset  # quiet, and not due for a look yet
                    continue
                if offset is not None and self.polls.quiet(name) and self._still(name, offset):
                    tables[name] = offset  # still quiet: one listing, no feed opened
                else:
                    tables[name] = self._table_offset(name, offset, limit)
                if self.polls.looked(name, tables[name] != offset, now):
                    self._unannounced(name)
            except Exception as exc:  # noqa: BLE001 (one table's fault: reported, set aside)
                if self._gone(name):
                    self._let_go(name)
                    tables.pop(name, None)
                elif self._stops_on(exc, offset is not None):
                    raise
                else:
                    what = "taking it up" if offset is None else "reading its latest version"
                    self._failed(name, exc, what)
                    if offset is not None and name not in self.skipped:
                        tables[name] = offset
        for name in sorted(set(held) - set(refs)):
            if name not in self.skipped:
                self._let_go(name)
        self.polls.keep_only(tables)
        self._report(tables)
        return {"tables": tables, "from": start.get("from", self.options.starting or "latest")}

    # -- commit events ----------------------------------------------------
    def _listen(self) -> None:
        """Start the commit events' receiver (option commitEvents), before the first look:
        a commit after it is hinted, one before it is found by that look."""
        events = self.options.commit_events
        if events is None or self.receiver is not None or self.available_now:
            return
        if events.queue:
            from lance_cdf.ops.sqs_hints import STALE_AFTER_S, SqsReceiver

            self.hints = CommitHints(events.shown, STALE_AFTER_S)
            storage = self.options.storage_options
            receiver = SqsReceiver(events.queue, self.options.database, storage, self.hints)
            self.receiver = receiver.start()
            return
        from lance_cdf.ops import file_hints

        path = local_path(self.options.database)
        assert path is not None  # (CommitEvents.parse: files only for a local database)
        self.hints = CommitHints(events.shown, file_hints.STALE_AFTER_S)
        self.receiver = file_hints.FileWatcher(path, self.hints).start()

    def _hear(self, now: float) -> None:
        """Whether the events are heard now (the polls' schedule follows), and the tables
        they named since the last trigger made due; a directory no listing knows (a new
        table) has the database listed again, once per listing."""
        if self.hints is None:
            return
        heard = self.hints.heard()
        if heard != self.polls.events:
            why = self.hints.why_not()
            if heard:
                log.warning(
                    "commit events from %s are heard: tables are looked at as they commit",
                    self.hints.source,
                )
            else:
                log.warning(
                    "commit events from %s are not heard (%s): tables are looked at by "
                    "listing, each within %g s",
                    self.hints.source,
                    why,
                    self.options.idle_poll_max,
                )
        self.polls.hear(heard, now)
        dirs = self.hints.take()
        if dirs - self.dirs.keys() - self.strangers:
            self._tables(force=True)
            self.strangers |= dirs - self.dirs.keys()
        for d in dirs:
            name = self.dirs.get(d)
            if name is not None:
                self.polls.hint(name, now)

    def _unannounced(self, name: str) -> None:
        """A look on the safety net's schedule found a commit of quiet table `name` that no
        event named: the events miss commits (one line, and `lance-cdf status`)."""
        log.warning(
            "table %s: a commit found by listing that no commit event from %s named (%d so "
            "far); check that the bucket notifies the queue of every object created under the "
            "tables' _versions/ (no prefix or suffix filter leaving them out)",
            name,
            self.hints.source if self.hints is not None else "storage",
            self.polls.unannounced,
        )

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.stop()

    def _table_offset(self, name: str, offset: Offset | None, limit: ReadLimit) -> Offset:
        """Table `name`'s next offset from `offset` (None: a table taken up now, which
        enters the map at its initial offset first)."""
        if offset is None:
            start = self.options.starting if name in self.at_start else self._later_start()
            found = self._reader(name, start).initialOffset()
            log.warning("table %s: followed from now on", name)
        else:
            found = self._reader(name, None).latestOffset(offset, limit)
        self.aside.succeeded(name)
        self.at_start.discard(name)
        return found

    def _let_go(self, name: str) -> None:
        log.warning("table %s was dropped from the database: it is no longer followed", name)
        self.readers.pop(name, None)
        self.aside.forget(name)
        self.at_start.discard(name)

    def _still(self, name: str, offset: Offset) -> bool:
        """Whether a quiet table has no version after `offset`'s, from one listing of its
        `_versions/` through the database's own store: a look at a quiet table costs that
        one request, not the opening of its feed (a process keeps few: `FEEDS_KEPT`).
        False when that cannot be told (then the table's reader looks)."""
        uri, root = self.refs[name].uri, self.options.database.rstrip("/")
        if "snapshot" in offset or "version" not in offset or not uri.startswith(root + "/"):
            return False
        try:
            if self.root_fs is None:
                self.root_fs = open_filesystem(root, self.options.storage_options)
            versions, _ = list_versions(self.root_fs, uri[len(root) + 1 :])
        except Exception:  # noqa: BLE001 (the reader's own look reports what is wrong)
            return False
        return versions[-1] == int(offset["version"])

    def table_partitions(
        self, start: Offset, end: Offset
    ) -> Iterator[tuple[str, LanceCdfStreamReader, Sequence[InputPartition]]]:
        """Each table with changes between the offsets `start` and `end`: its name, its
        single-table reader and that reader's partitions (a table gone from the database
        meanwhile is reported and let go)."""
        held: dict[str, Offset] = start.get("tables") or {}
        for name, until in sorted((end.get("tables") or {}).items()):
            since = held.get(name)
            if since is None or since == until:
                continue  # a new table's first offset is its initial one: nothing yet
            found = self._partitions_of(name, since, until)
            if found is not None:
                yield name, found[0], found[1]

    def _partitions_of(
        self, name: str, since: Offset, until: Offset
    ) -> tuple[LanceCdfStreamReader, Sequence[InputPartition]] | None:
        """Table `name`'s reader and partitions between its offsets (None: dropped
        meanwhile). Its offsets are in the offset log already, so a transient fault is
        retried with backoff (TakeUpSettings' writer pauses, up to its budget) rather than
        set aside; past it, or on another fault, the query stops with one line."""
        settings = self.aside.settings

        def attempt() -> tuple[LanceCdfStreamReader, Sequence[InputPartition]] | None:
            try:
                if name not in self.refs:
                    self._tables(force=True)
                reader = self._reader(name, None)
                return reader, reader.partitions(since, until)
            except Exception:
                if self._gone(name):
                    self._let_go(name)
                    return None
                self.readers.pop(name, None)
                raise

        def retrying(exc: BaseException, retries: int, pause: float) -> None:
            if retries == 0:
                log.warning(
                    "table %s: planning its micro-batch failed (%s); retrying for up to %.0f s",
                    name,
                    in_words(exc),
                    settings.writer_budget_s,
                )
            self.aside.retries += 1

        return retry(attempt, settings.writer_retry, is_transient, retrying)

    handed_over = False  # option handOver: this query has taken over from the head start

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        if self.options.hand_over and not self.handed_over:
            # the first plan, before any writer task of the query: the head start of
            # lance-cdf publish --database stops publishing here (`HandOver.take`)
            HandOver(self.options.hand_over).take()
            self.handed_over = True
        slots: dict[int, list[tuple[int, int, str, bytes]]] = {}
        count = 0
        for name, reader, shares in self.table_partitions(start, end):
            kafka_partitions = reader.opts.kafka_partitions
            assert kafka_partitions is not None  # (a work-item stream's: SourceOptions.parse)
            for share in shares:
                # a work-item stream's tables are read by HandOffReaders: their shares
                assert isinstance(share, WriterSlot)
                item = replace(reader.reading.work(share, kafka_partitions), name=name)
                batch = item.to_batch()
                row = (
                    share.slot,
                    batch.column(1)[0].as_py(),
                    batch.column(2)[0].as_py(),
                    batch.column(3)[0].as_py(),
                )
                slots.setdefault(share.slot, []).append(row)
                count = max(count, share.slots)
        return [DatabaseSlot(s, tuple(slots.get(s, ()))) for s in range(count)]

    def _gone(self, name: str) -> bool:
        try:
            return name not in self._tables(force=True)
        except Exception:  # noqa: BLE001 (the database itself is unreadable: not "gone")
            return False

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, DatabaseSlot)
        if not partition.rows:
            return
        slot, events, work, schema = zip(*partition.rows, strict=True)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(slot, pa.int32()),
                pa.array(events, pa.int64()),
                pa.array(work, pa.string()),
                pa.array(schema, pa.binary()),
            ],
            names=[WORK_SLOT, WORK_EVENTS, WORK_COLUMN, WORK_SCHEMA],
        )

    def commit(self, end: Offset) -> None:
        for name, offset in (end.get("tables") or {}).items():
            reader = self.readers.get(name)
            if reader is not None:
                reader.commit(offset)

    # -- the report status reads -----------------------------------------
    def _report(self, tables: Mapping[str, Offset]) -> None:
        """The followed tables (their URIs) and the skipped ones (why) to option `report`, a
        local JSON file, when they change."""
        path = self.options.report
        if not path:
            return
        document = {
            "followed": {n: self.refs[n].uri for n in sorted(tables) if n in self.refs},
            "skipped": dict(sorted(self.skipped.items())),
            "aside": self.aside.shown(),
            "takeup_retries": self.aside.retries,
            "set_asides": self.aside.set_asides,
        }
        if self.hints is not None:
            document["discovery"] = {
                **self.hints.discovery(),
                "unannounced": self.polls.unannounced,
                "unannounced_tables": sorted(self.polls.unannounced_tables),
            }
        text = json.dumps(document, indent=1, sort_keys=True)
        if text == self.reported:
            return
        try:
            write_atomic(path, text, parents=True, mode=0o600)  # owner-only, as it always was
            self.reported = text
        except OSError as exc:
            log.warning("could not write the database report %s: %s", path, exc)


def why_not_read(exc: BaseException) -> str:
    """An error in one line (no stack: the table is reported and left out)."""
    if isinstance(exc, StableRowIdsRequiredError):
        return (
            "it was created without stable row IDs, which a change feed needs (they cannot "
            "be turned on later); recreate it with them (LanceDB: storage option "
            "new_table_enable_stable_row_ids='true') or leave it out with --exclude"
        )
    return in_words(exc)
