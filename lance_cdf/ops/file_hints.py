"""Commit hints from the file-system events of a database on a local or mounted file
system (inotify on Linux, through watchdog; `CommitHints` says what a hint is).

The database's root is watched recursively: a manifest created or renamed into a table's
`_versions/` hints that table (`storage_events.commit_at`), a new table's first
one too (watchdog reports what a new directory already holds when it starts watching it;
the stream lists the database when a hint names a table it does not know). The
watch is checked every `CHECK_S` seconds and started again if it stopped (the inotify
watch limit reached, the root gone); while it is down the inbox is not heard and the
stream looks at its tables by listing. A file system that gives no events (many network
mounts) is not detected: there the listing's safety net is what finds commits.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler

from lance_cdf.errors import in_words
from lance_cdf.format.storage_events import commit_at
from lance_cdf.ops.commit_hints import CommitHints
from lance_cdf.retry import RetryPolicy

log = logging.getLogger("lance_cdf.ops.commit_hints")

CHECK_S = 5.0  # how often the watch is checked alive
WRITES = ("created", "moved", "modified", "closed")  # watchdog's event types that write
STALE_AFTER_S = 3 * CHECK_S  # not checked for this long: not heard
# the pauses before watching again after the watch could not start (the last one repeats)
PAUSES = RetryPolicy(pauses=(1.0, 5.0, 30.0), deadline_s=float("inf"))


class FileWatcher:
    """Watches the database at local path `root` into `hints` (`start`, `stop`)."""

    def __init__(self, root: str, hints: CommitHints):
        self.root = os.path.abspath(root)
        self.hints = hints
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lance-cdf-watch", daemon=True)
        self._observer: Any = None

    def start(self) -> FileWatcher:
        self._observer = self._watch()  # before the stream's first look: no commit between
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._observer is not None:
            self._observer.stop()

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(CHECK_S if failures == 0 else _pause(failures)):
            if self._observer is not None and _alive(self._observer):
                self.hints.answered()
                continue
            if failures == 0:
                log.warning(
                    "commit events: the watch of %s stopped; tables are looked at by listing "
                    "until it is back",
                    self.root,
                )
            self.hints.failed("the file watch stopped")
            if self._observer is not None:
                self._observer.stop()
            self._observer = self._watch()
            failures = 0 if self._observer is not None else failures + 1

    def _watch(self) -> Any:
        """A started observer of the root (None, the inbox told why, if it cannot start)."""
        from watchdog.observers import Observer

        observer = Observer()
        try:
            observer.schedule(_Handler(self.root, self.hints), self.root, recursive=True)
            observer.start()
        except Exception as exc:  # noqa: BLE001 (OSError: the watch limit, the root gone)
            self.hints.failed(f"cannot watch {self.root}: {in_words(exc)}")
            return None
        self.hints.answered()
        return observer


def _pause(failures: int) -> float:
    return PAUSES.pause(failures - 1) or CHECK_S


def _alive(observer: Any) -> bool:
    return bool(observer.is_alive()) and all(e.is_alive() for e in observer.emitters)


class _Handler(FileSystemEventHandler):
    """watchdog's event handler: a table's commit."""

    def __init__(self, root: str, hints: CommitHints):
        self.root = root + os.sep
        self.hints = hints

    def dispatch(self, event: FileSystemEvent) -> None:
        # a manifest written, or linked or renamed into place; not one opened or read
        # (each look's own reads would hint its table again)
        if event.is_directory or event.event_type not in WRITES:
            return
        for path in (event.src_path, event.dest_path):
            path = os.fsdecode(path)
            if not path.startswith(self.root):
                continue
            commit = commit_at(path[len(self.root) :].replace(os.sep, "/"))
            if commit is not None:
                self.hints.add([commit.table_dir])
