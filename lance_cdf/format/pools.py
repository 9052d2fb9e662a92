"""Thread pools that start on first use and stop when closed.

Reading a commit's rows and deletion files runs in a few threads. Each `Pool` makes its
threads only once work arrives (importing lance-cdf starts none) and `close()` stops them
(a later use starts them again), so a program that embeds lance-cdf decides when they go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar, TypeVarTuple

T = TypeVar("T")
R = TypeVar("R")
Ts = TypeVarTuple("Ts")


class Pool:
    """A thread pool of at most `workers` threads named `name`, started on first use."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers, self.name = workers, name
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _started(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=self.name)
            return self._executor

    def submit(self, fn: Callable[[*Ts], R], *args: *Ts) -> Future[R]:
        return self._started().submit(fn, *args)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        return self._started().map(fn, items)

    def close(self, wait: bool = True) -> None:
        """Stop the threads (after the work given to them, with `wait`)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=wait)


# the pools of this process's reads (`RowReader`, `read_version_events`, `TableLog`)
READS = Pool(4, "lance-cdf-read")
# chunk-level lookahead: separate from READS, so a chunk never waits on its own pool
PREFETCH = Pool(4, "lance-cdf-prefetch")
# deletion files of a commit fetched concurrently (a round trip each on object storage)
DELETIONS = Pool(4, "lance-cdf-deletions")


def close_all(wait: bool = True) -> None:
    """Stop every pool's threads (they start again if used)."""
    for pool in (READS, PREFETCH, DELETIONS):
        pool.close(wait)
