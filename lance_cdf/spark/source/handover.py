"""The hand-over from `lance-cdf publish`'s head start to its query: one writer at a time.

The head start (spark/publish/headstart.py) keeps publishing new whole versions from the
driver process while the query starts; a writer task of the query must not write a
partition while it does, and it must publish nothing once one may. A local file the
runner creates holds both sides apart:

- the head start publishes each round (the versions found at one look at the table, their
  records and their BEGIN/END) holding an exclusive `flock` on it, and only while no line
  says the query has taken over; after each round it appends how far it has published
  (`through`, per table, by its URI, a database's by name: every record and BEGIN/END up
  to that version is in Kafka);
- the query takes over by appending a line (`taken`) and then taking the lock, so it goes
  on only once a round in progress has ended; every later round sees the line and
  publishes nothing;
- the query's commit (the driver's, on a local master) writes the transaction topic
  holding the lock, without taking over: a micro-batch whose writer tasks published
  nothing (all published by the head start, or versions without events) can still carry a
  table definition on an END, and the BEGIN/END records stay in version order.

Who takes over, and when:

- on a local master, a writer task (the sink's internal option `handOver`: the tasks run on
  this machine) whose share holds a version the head start has not published through, just
  before it reads the partitions' marks, and then publishes that version itself. A task
  whose versions are all published writes nothing (its marks skip them all, however far
  the head start has gone on meanwhile), so it needs no hand-over: the head start goes on
  through the query's first micro-batches, which start Spark's Python processes, and the
  runner ends it once the query has run two (spark/publish/runner.py);
- elsewhere the writer tasks may run on other machines: the query's reader at its first
  `partitions` call (the source's option `handOver`), in the driver's Python process that
  plans each micro-batch, before any writer task of it can start.

The query plans from where the head start began, at or before what it published; its
writers skip what the partitions already hold (the exactly-once marks) and its commit the
BEGIN/END the transaction topic holds (its last record says how far an earlier writer got).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

TAKEN = "taken"  # the query has taken over: no round starts after this line
ENDED = "ended"  # written under the lock by the first to take over: no round is running


@dataclass(frozen=True)
class HandOver:
    """The hand-over file at `path` (see the module's doc): JSON lines."""

    path: str

    @classmethod
    def create(cls) -> HandOver:
        """A new, empty hand-over file in the temporary directory (`remove` it after)."""
        fd, path = tempfile.mkstemp(prefix="lance-cdf-handover-")
        os.close(fd)
        return cls(path)

    @staticmethod
    def _lines(fd: int) -> list[dict[str, Any]]:
        return _parsed(os.pread(fd, os.fstat(fd).st_size, 0))

    @staticmethod
    def _append(fd: int, line: dict[str, object]) -> None:
        os.write(fd, (json.dumps(line) + "\n").encode())

    @contextmanager
    def turn(self) -> Iterator[bool]:
        """The head start's turn to publish a round, the lock held until the block ends:
        True while the query has not taken over (a removed file: taken over)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield not any(TAKEN in line for line in self._lines(fd))
        finally:
            os.close(fd)  # (releases the lock)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The lock held, without taking over: the query's commit writes the transaction
        topic's BEGIN/END in it, never between a round's (a removed file: no head start)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def published(self, through: dict[str, int]) -> None:
        """The head start, in its turn, after a round: every record and BEGIN/END of each
        table (URI) up to its version is in Kafka."""
        with open(self.path, "a") as f:
            f.write(json.dumps({"through": through}) + "\n")

    def take(self) -> None:
        """The query takes over: no round starts after this, and it returns once a round
        in progress has ended (a removed file: the head start has ended already). Once one
        caller has, the others return at once."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            return
        try:
            if any(ENDED in line for line in self._lines(fd)):
                return
            self._append(fd, {TAKEN: os.getpid()})  # before the lock: later rounds see it
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._append(fd, {ENDED: os.getpid()})
        finally:
            os.close(fd)  # (releases the lock)

    def before_writing(self, table: str, last: int) -> None:
        """A writer task about to publish versions of `table` up to `last`: it takes over
        unless the head start has ended or has published through `last` (then the task
        writes nothing, whatever the head start publishes meanwhile)."""
        hold("handover")  # a test's hook: the query's writer waits here
        try:
            with open(self.path, "rb") as f:
                lines = _parsed(f.read())
        except FileNotFoundError:
            return  # the runner removed it: the head start has ended
        if any(ENDED in line for line in lines):
            return
        through = [line["through"] for line in lines if "through" in line]
        if through and int(through[-1].get(table, -1)) >= last:
            return
        self.take()

    def remove(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass


def _parsed(text: bytes) -> list[dict[str, Any]]:
    """The file's lines; one being appended as it is read is left out (a writer task then
    takes over: the safe side)."""
    out = []
    for line in text.decode(errors="replace").splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            out.append(parsed)
    return out


# A test hook (the test's environment reaches Spark's Python workers): `STAGE:FILE`, STAGE
# `write` (a writer task, once its records are acknowledged), `commit` (the query's
# commit, before its transaction metadata) or `handover` (a writer task of publish on a
# local master, before it reads its marks, while the head start may still publish:
# spark/source/handover.py): while FILE exists that step waits, and says so by creating
# `FILE.held` (test_complete_versions, test_headstart_handover). Unset:
# no effect.
HOLD_ENV = "LANCE_CDF_TEST_HOLD"


def hold(stage: str) -> None:
    wanted, _, path = os.environ.get(HOLD_ENV, "").partition(":")
    if wanted != stage or not path or not os.path.exists(path):
        return
    with open(f"{path}.held", "w"):
        pass
    while os.path.exists(path):
        time.sleep(0.05)
