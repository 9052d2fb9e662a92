"""The hand-over from `lance-cdf publish`'s head start to its query: one writer at a time.

The head start (spark/publish/headstart.py) keeps publishing new whole versions from the
driver process while the query starts; the query's writer tasks must not write a partition
while it does, and it must publish nothing once they may. A local file the runner creates
(the source's internal option `handOver`) holds both sides apart:

- the head start publishes each round (the versions found at one look at the table, their
  records and their BEGIN/END) holding an exclusive `flock` on it, and only while the file
  is empty;
- the query takes over by appending a line to the file and then taking the lock, so it goes
  on only once a round in progress has ended; every later round finds the file not empty
  and publishes nothing. On a local master each writer task does so before it writes (the
  sink's option `handOver`: the tasks run on this machine), so the head start publishes
  until the query's first writer task starts, most of the query's start. Elsewhere the
  writer tasks may run on other machines: the query's reader does so at its first
  `partitions` call (the source's option `handOver`), in the driver's Python process that
  plans each micro-batch, before any writer task of it can start.

The query plans from where the head start began, at or before what it published (the head
start may have gone on past the query's first plan: the same); its writers skip what the
partitions already hold (the exactly-once marks) and its commit the BEGIN/END the
transaction topic holds.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

TAKEN = b"taken over by the query\n"
ENDED = b"the head start has ended\n"  # written under the lock by the first to take over


@dataclass(frozen=True)
class HandOver:
    """The hand-over file at `path` (see the module's doc)."""

    path: str

    @classmethod
    def create(cls) -> HandOver:
        """A new, empty hand-over file in the temporary directory (`remove` it after)."""
        fd, path = tempfile.mkstemp(prefix="lance-cdf-handover-")
        os.close(fd)
        return cls(path)

    @contextmanager
    def turn(self) -> Iterator[bool]:
        """The head start's turn to publish a round, the lock held until the block ends:
        True while the query has not taken over (a removed file: taken over)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield os.fstat(fd).st_size == 0
        finally:
            os.close(fd)  # (releases the lock)

    def take(self) -> None:
        """The query takes over: no round starts after this, and it returns once a round
        in progress has ended (a removed file: the head start has ended already). Once one
        caller has, the others (each writer task) return at once."""
        from lance_cdf.spark.sink.kafka_sink import hold

        hold("handover")  # a test's hook: the query reaches its hand-over and waits there
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            return
        try:
            if ENDED in os.pread(fd, 4096, 0):
                return
            os.write(fd, TAKEN)  # before the lock: a round that starts after this sees it
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, ENDED)
        finally:
            os.close(fd)  # (releases the lock)

    def taken(self) -> bool:
        """Whether the query has taken over (a look without the lock, between rounds)."""
        try:
            return os.path.getsize(self.path) > 0
        except FileNotFoundError:
            return True

    def remove(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
