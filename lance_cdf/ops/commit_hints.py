"""Hints that a table of a database has a new version, from storage events (`commitEvents`,
`lance-cdf publish --commit-events`): where they come from (`CommitEvents`), and the inbox
a receiver fills and the database stream empties at each trigger (`CommitHints`).

A hint names a table's directory (relative to the database's root) and nothing more: the
stream lists that table at its next trigger to learn its versions, as it would have on its
own schedule. So a hint lost, repeated, late or out of order changes when a table is
looked at, never what is published (offsets are versions found by listing:
`IdlePolls` keeps a slow listing of every table as the safety net).

The inbox also says whether its receiver is heard (`heard`): it answered lately and its
last call did not fail. While it is not, the stream looks at its tables on the listing
schedule (`idlePollMax`) and says why (`discovery`: `lance-cdf status`, the metrics).

Receivers (each started by the database stream, which chooses by `CommitEvents`): an SQS
queue that S3 sends `ObjectCreated` notifications to (`sqs_hints`), and the file-system
events of a local database (`file_hints`). GCS Pub/Sub and Azure
Event Grid payloads are read by `storage_events` already; their receivers would
fill the same inbox.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlparse

from lance_cdf.errors import LanceCdfError
from lance_cdf.format.io import local_path
from lance_cdf.ops.clientconfig import redact_url

FILES = "files"  # commitEvents=files: the file-system events of a local database


@dataclass(frozen=True)
class CommitEvents:
    """Where a database's commit events come from: an SQS queue (`queue`, its URL) or the
    file system the database is on (`queue` empty)."""

    queue: str = ""

    @property
    def shown(self) -> str:
        """How status and the log name the source (no credentials)."""
        return f"SQS queue {redact_url(self.queue)}" if self.queue else "file-system events"

    @classmethod
    def parse(cls, text: str, database: str) -> CommitEvents:
        """Option `commitEvents` of the stream of the database at `database`: an SQS queue
        URL (the database on S3), or `files` (the database on a local or mounted file
        system)."""
        value = text.strip()
        if value.lower() == FILES:
            if local_path(database) is None:
                raise LanceCdfError(
                    f"commit events from {FILES!r} watch a local or mounted file system; the "
                    f"database {redact_url(database)} is on object storage: give the SQS queue "
                    "its bucket notifies (its URL, https://sqs.<region>.amazonaws.com/...)"
                )
            return cls()
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or len(parsed.path.strip("/").split("/")) != 2:
            raise LanceCdfError(
                f"commit events {redact_url(value)!r}: give the URL of the SQS queue the "
                "database's bucket notifies (https://sqs.<region>.amazonaws.com/<account>/"
                f"<queue>), or {FILES!r} for a database on a local or mounted file system"
            )
        if not database.lower().startswith(("s3://", "s3a://")):
            raise LanceCdfError(
                f"an SQS queue receives the notifications of an S3 bucket; the database "
                f"{redact_url(database)} is not on S3 (a local database: commit events "
                f"{FILES!r})"
            )
        return cls(queue=value)


class Receiver(Protocol):
    """A running receiver of commit events: it fills a `CommitHints` until stopped."""

    def stop(self) -> None: ...


class CommitHints:
    """The tables hinted since the last `take`, and whether the receiver is heard: it said
    so (`answered`) within `stale_after` seconds and has not failed since (`failed`).
    Filled from the receiver's thread, read from the stream's."""

    def __init__(self, source: str, stale_after: float):
        self.source = source  # how status names where hints come from
        self.stale_after = stale_after
        self.clock = time.monotonic
        self.hints = 0  # hints received since start (repeats included)
        self._dirs: set[str] = set()
        self._answered = -1.0  # when the receiver last answered (-1: not yet)
        self._failure: str | None = "not listening yet"
        self._lock = threading.Lock()

    def add(self, dirs: Iterable[str]) -> None:
        """Tables (directories relative to the database's root) that may have committed."""
        with self._lock:
            for d in dirs:
                self._dirs.add(d)
                self.hints += 1

    def take(self) -> set[str]:
        """The tables hinted since the last call."""
        with self._lock:
            dirs, self._dirs = self._dirs, set()
            return dirs

    def answered(self) -> None:
        """The receiver's call went through: hints flow (none may have come)."""
        with self._lock:
            self._answered = self.clock()
            self._failure = None

    def failed(self, why: str) -> None:
        """The receiver cannot receive (`why`, one line without secrets)."""
        with self._lock:
            self._failure = why

    def heard(self) -> bool:
        return self.why_not() is None

    def why_not(self) -> str | None:
        """Why hints do not flow now (None: they do)."""
        with self._lock:
            if self._failure is not None:
                return self._failure
            if self.clock() - self._answered > self.stale_after:
                return f"no answer for {self.clock() - self._answered:.0f} s"
            return None

    def discovery(self) -> dict[str, object]:
        """What the report says (`lance-cdf status`, the metrics): how commits are found."""
        why = self.why_not()
        return {
            "mode": "events" if why is None else "listing",
            "events": self.source,
            "why": why,
            "hints": self.hints,
        }
