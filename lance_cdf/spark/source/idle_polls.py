"""When a database stream looks at each of its tables again (adaptive polling).

Each look at a table lists its `_versions/` (one request to the object store). A table that
changed is looked at every trigger; one that stays quiet is looked at less and less often:
the wait after a look that found nothing new is a fraction (`backoff`) of how long the table
has been quiet, up to `ceiling` seconds. So a table being written keeps its per-trigger
latency, a table quiet for minutes costs one request per `ceiling`, and its first commit
after the quiet is seen within `ceiling` (plus the trigger it lands on). `ceiling` 0: every
table every trigger. Its default depends on where the database is (`default_ceiling`): on
object storage a look is a billed request, on a local or mounted filesystem a directory
listing that costs no request. Tables that went quiet together (all of them at start)
would all be looked at in the same trigger every `ceiling`: the first wait that reaches
the ceiling is shortened by a fraction fixed per table name, so their looks spread over
the triggers.

With commit events heard (`events`: storage events, `CommitHints`) a table is looked
at when a hint names it (`hint`), at the trigger after a look that found it changed (to
read what the last one left), and otherwise once per `events_ceiling` (the safety net: a
lost event delays a commit by that much at most). The events are hints: what a look finds
is the truth either way, so switching between events and listing loses and repeats
nothing. When they stop being heard, every table's next look is brought within the
listing ceiling (`hear`). A quiet table whose safety-net look finds a commit no event
named (`unannounced`) says the events miss commits: a bucket notification whose prefix or
suffix filter leaves `_versions/` out, or a queue a bucket does not send to.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from lance_cdf.errors import LanceCdfError
from lance_cdf.format.objectstore import is_object_store_uri

# Default longest wait between two looks at a quiet table on object storage, in seconds: six
# requests a minute per idle table, its first commit after a quiet period seen within this.
IDLE_POLL_MAX = 10.0
# The same on a local or mounted filesystem, where a look is a directory listing and no
# request: a quiet table's first commit reaches Kafka within a few seconds, for about the
# CPU of looking at fewer tables (docs/benchmarks.md, "Quiet tables on a filesystem").
IDLE_POLL_MAX_LOCAL = 2.0
# The wait after a look that found nothing new, as a fraction of how long the table has been
# quiet: a table written every few seconds is still looked at every trigger or nearly.
IDLE_BACKOFF = 0.25
# Default longest wait between two looks at a table while commit events are heard: the
# safety net that finds a commit whose event was lost. At 200 idle tables, their looks
# and the queue's long polls stay under a tenth of a request per table per minute
# (docs/benchmarks.md, "Commit events").
EVENTS_POLL_MAX = 900.0
# A look falls on a trigger: one due up to this much later than a trigger's time is taken
# at that trigger, so the ceiling is not stretched by a whole trigger interval.
DUE_SLACK = 0.2


def default_ceiling(database: str) -> float:
    """The ceiling for a database at `database` (a URI or a path) when none is given."""
    return IDLE_POLL_MAX if is_object_store_uri(database) else IDLE_POLL_MAX_LOCAL


def idle_poll_max(text: str) -> float:
    """The option / flag value (`idlePollMax`, `commitEventsPollMax`): seconds, >= 0 (0:
    every table every trigger)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise LanceCdfError(
            f"idle poll ceiling {text!r} is not a number of seconds >= 0 (0: look at every "
            f"table every trigger; default {IDLE_POLL_MAX:g} on object storage, "
            f"{IDLE_POLL_MAX_LOCAL:g} on a filesystem)"
        )
    return value


@dataclass
class _Table:
    quiet_since: float  # when the table last changed (or was taken up)
    due: float  # when it is looked at next
    capped: float = 0.0  # the ceiling its waits reached, its phase set (0: none yet)
    quiet: bool = False  # its last look found nothing new
    net: float = 0.0  # its safety-net look, kept while a hint brings a look forward
    hinted: bool = False  # an event named it since its last look
    heard: bool = False  # its last look was made while events were heard


@dataclass
class IdlePolls:
    """Which tables a trigger looks at (`due`), learning from what each look found
    (`looked`). Times are `time.monotonic()` seconds."""

    ceiling: float = IDLE_POLL_MAX
    backoff: float = IDLE_BACKOFF
    tables: dict[str, _Table] = field(default_factory=dict)
    looks: int = 0  # looks taken (tables listed) since start
    skipped: int = 0  # looks saved (a quiet table not due at a trigger)
    events: bool = False  # commit events are heard: quiet tables wait `events_ceiling`
    events_ceiling: float = EVENTS_POLL_MAX
    unheard: set[str] = field(default_factory=set)  # tables no event can name (elsewhere)
    unannounced: int = 0  # quiet tables' commits found by a look no event had brought
    unannounced_tables: set[str] = field(default_factory=set)  # the tables they were in

    def due(self, name: str, now: float) -> bool:
        """Whether the trigger at `now` looks at table `name` (a table never looked at: yes)."""
        state = self.tables.get(name)
        if state is None or self.ceiling <= 0 or now + DUE_SLACK >= state.due:
            self.looks += 1
            return True
        self.skipped += 1
        return False

    def looked(self, name: str, changed: bool, now: float) -> bool:
        """What the look at `now` found: `changed` (new versions, or the table's first look)
        brings its looks back to every trigger. True: it found a commit of a quiet table
        that no event named while events were heard (`unannounced`)."""
        state = self.tables.get(name)
        heard = self.events and name not in self.unheard
        # new versions of a table that was quiet while events were heard, and still are,
        # and that no event named since its last look
        missed = (
            changed
            and heard
            and state is not None
            and state.quiet
            and state.heard
            and not state.hinted
        )
        if missed:
            self.unannounced += 1
            self.unannounced_tables.add(name)
        if state is None or changed:
            self.tables[name] = _Table(quiet_since=now, due=now, heard=heard)
            return missed
        state.quiet, state.hinted, state.heard = True, False, heard
        if heard and state.net > now:  # a hint that found nothing: the net keeps its phase
            state.due, state.net = state.net, 0.0
            return False
        ceiling = self.events_ceiling if heard else self.ceiling
        wait = ceiling if heard else (now - state.quiet_since) * self.backoff
        if wait >= ceiling:
            # the first capped wait sets the table's phase among the triggers
            wait = ceiling if state.capped == ceiling else ceiling * (1 - _spread(name))
            state.capped = ceiling
        state.due = now + wait
        return False

    def hint(self, name: str, now: float) -> None:
        """A commit event names table `name`: it is looked at by the trigger at `now`."""
        state = self.tables.get(name)
        if state is None:
            return
        state.hinted = True
        if state.due > now:
            state.net = max(state.net, state.due)
            state.due = now

    def hear(self, heard: bool, now: float) -> None:
        """Whether commit events are heard from `now` on. When they stop, each table's
        next look comes within the listing ceiling, as if it had been listed all along."""
        if heard == self.events:
            return
        self.events = heard
        if heard:
            return  # (each table keeps its next look; the one after waits events_ceiling)
        for name, state in self.tables.items():
            state.net, state.heard = 0.0, False
            if state.capped and state.capped != self.ceiling:
                state.due = min(state.due, now + self.ceiling * (1 - _spread(name)))
                state.capped = 0.0

    def quiet(self, name: str) -> bool:
        """Whether the last look at `name` found nothing new."""
        state = self.tables.get(name)
        return state is not None and state.quiet

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget the tables not in `names` (gone, no longer followed)."""
        keep = set(names)
        for name in [n for n in self.tables if n not in keep]:
            del self.tables[name]
        self.unannounced_tables &= keep


def _spread(name: str) -> float:
    """A fraction in [0, 1) fixed by the table's name."""
    return zlib.crc32(name.encode()) / 2**32
