"""Tables of a database publisher that are set aside for a while, and the transient faults
a take-up or a publish retries.

Taking a table up (reading its versions, making its topics, registering its schemas) and
publishing it meet conditions that pass by themselves: a new topic whose metadata the
controller has not published yet, a broker or registry that does not answer for a while,
an object store that throttles or fails a request, a table caught mid-commit. Such a fault
is retried with backoff. A table whose take-up keeps failing is set aside alone: one log
line naming the cause and the fix, shown by `lance-cdf status` and the metrics, and tried
again later (the backoff doubles up to `TakeUpSettings.longest_s`); the other tables go on,
and the service does not stop for it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from lance_cdf.errors import (
    KafkaAuthorizationError,
    LanceCdfError,
    RegistryRefusedError,
    StorageAccessError,
    in_words,
)
from lance_cdf.ops.state_files import checkpoint_file, read_record, update_record
from lance_cdf.retry import RetryPolicy

log = logging.getLogger("lance_cdf.takeup")

# the writer tasks' retries, in a local checkpoint (they and `publish` share the machine)
STATE_FILE = "lance-cdf-takeup.json"


@dataclass(frozen=True)
class TakeUpSettings:
    """How faults taking a table up are retried."""

    first_s: float = 2.0  # the pause before a set-aside table is tried again
    longest_s: float = 300.0  # the pause doubles up to this
    # a writer task's retries of one table's publish: their pauses, then the last one
    # repeated, for up to `writer_budget_s` in all before the micro-batch fails
    writer_backoff_s: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
    writer_budget_s: float = 300.0

    @property
    def writer_retry(self) -> RetryPolicy:
        """The writer's retries as a `retry` policy."""
        return RetryPolicy(self.writer_backoff_s, self.writer_budget_s, jitter=0.0)

    def pause(self, attempts: int) -> float:
        """The pause after the `attempts`-th failure in a row (1-based)."""
        return float(min(self.longest_s, self.first_s * 2 ** max(0, attempts - 1)))


DEFAULT = TakeUpSettings()

# the remedy named with a set-aside table's cause, by what the cause is about
FIX_TRANSIENT = (
    "it is retried by itself; if it persists, check that the storage, the brokers and the "
    "schema registry are reachable and not throttling"
)


def is_transient(exc: BaseException) -> bool:
    """Whether a fault (or one it was raised from) is one that passes by itself: storage or
    network errors, a broker or registry that does not answer (5xx, no answer). Refusals
    (an ACL, a schema the registry rejects, a table without stable row IDs) are not."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, (KafkaAuthorizationError, RegistryRefusedError)):
            return False
        if isinstance(seen, LanceCdfError) and seen.retriable:
            return True
        # files, sockets, HTTP clients' errors (requests', httpx's)
        if isinstance(seen, (OSError, TimeoutError, ConnectionError)):
            return True
        if _is_client_fault(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# Kafka error names that are refusals, not faults that pass (besides *AUTH* and INVALID_*)
_REFUSALS = frozenset({"POLICY_VIOLATION", "UNSUPPORTED_VERSION"})


def _is_client_fault(exc: BaseException) -> bool:
    """A Kafka client error that is retriable, or a registry answer of 5xx / no answer
    (by their modules' names: this layer imports no Kafka client)."""
    module = type(exc).__module__ or ""
    if module.startswith("confluent_kafka.schema_registry"):
        status = getattr(exc, "http_status_code", None)
        return not isinstance(status, int) or status < 0 or status >= 500
    if module.startswith(("confluent_kafka", "cimpl")):
        err = exc.args[0] if exc.args else None
        fatal, name = getattr(err, "fatal", None), getattr(err, "name", None)
        if callable(fatal) and fatal():
            return False
        code = str(name()) if callable(name) else ""
        return not ("AUTH" in code or code.startswith("INVALID") or code in _REFUSALS)
    return module.startswith(("httpx", "httpcore", "requests", "urllib3"))


@dataclass
class Aside:
    """A table set aside: why, since when (unix time), how often it failed in a row, and
    when it is tried again (monotonic and unix time)."""

    cause: str
    since: float
    attempts: int = 1
    retry_at: float = 0.0  # monotonic
    retry_at_unix: float = 0.0

    def shown(self) -> dict[str, object]:
        """As the report `lance-cdf status` reads."""
        return {
            "cause": self.cause,
            "since": round(self.since, 3),
            "attempts": self.attempts,
            "retry_at": round(self.retry_at_unix, 3),
        }


@dataclass
class AsideTables:
    """The tables set aside by one publisher (driver side), and the counts of take-up
    retries and set-asides the metrics show."""

    settings: TakeUpSettings = DEFAULT
    tables: dict[str, Aside] = field(default_factory=dict)
    retries: int = 0  # take-up attempts repeated, in all
    set_asides: int = 0  # times a table was set aside, in all

    def fail(self, name: str, exc: BaseException, what: str = "taking it up") -> Aside:
        """Table `name` failed (`exc`): set aside, or kept aside, with a longer pause. Logs
        once when it is set aside (and again only when its cause changes)."""
        cause = f"{what} failed: {in_words(exc)}"
        now, wall = time.monotonic(), time.time()
        aside = self.tables.get(name)
        if aside is None:
            aside = self.tables[name] = Aside(cause, wall)
            self.set_asides += 1
        else:
            aside.attempts += 1
            self.retries += 1
        pause = self.settings.pause(aside.attempts)
        aside.retry_at, aside.retry_at_unix = now + pause, wall + pause
        if aside.attempts == 1 or aside.cause != cause:
            aside.cause = cause
            fix = FIX_TRANSIENT if is_transient(exc) else _fix_of(exc)
            log.warning(
                "table %s is set aside: %s; %s. The other tables go on; it is tried again "
                "in %.0f s (then less often while it fails)",
                name,
                cause,
                fix,
                pause,
            )
        return aside

    def due(self, name: str) -> bool:
        """Whether table `name` may be tried now (not aside, or its pause is over)."""
        aside = self.tables.get(name)
        return aside is None or time.monotonic() >= aside.retry_at

    def succeeded(self, name: str) -> None:
        """Table `name` was taken up: no longer aside (logged if it was)."""
        aside = self.tables.pop(name, None)
        if aside is not None:
            log.warning(
                "table %s is taken up again after %d failed attempt(s)", name, aside.attempts
            )

    def forget(self, name: str) -> None:
        """Table `name` left the database: nothing to retry."""
        self.tables.pop(name, None)

    def shown(self) -> dict[str, dict[str, object]]:
        return {n: a.shown() for n, a in sorted(self.tables.items())}


def _fix_of(exc: BaseException) -> str:
    """The remedy for a fault that does not pass by itself (a lance-cdf error names its
    own fix in its message)."""
    if isinstance(exc, LanceCdfError):
        return "see the cause for the fix; it is retried in case it was fixed meanwhile"
    return (
        "if it persists, check the table (can it be read with pylance?) or leave it out with "
        "--exclude; it is retried in case it passes"
    )


@dataclass
class WriterRetries:
    """What a publisher's writer tasks retried (a local checkpoint's `STATE_FILE`)."""

    retries: int = 0  # one table's publish repeated after a transient fault, in all
    table: str = ""  # the last table retried
    cause: str = ""  # its cause, in words
    updated: float = 0.0  # unix time


def read_writer_retries(checkpoint: str | None) -> WriterRetries | None:
    """The writer tasks' retries recorded in a local checkpoint (None: none, or remote)."""
    path = checkpoint_file(checkpoint, STATE_FILE)
    return None if path is None else read_record(path, WriterRetries)


def record_writer_retry(checkpoint: str | None, table: str, cause: str) -> None:
    """Count one retry of `table`'s publish (under a lock: tasks of several processes
    write the file in turn). The state is for reports: a failure to write it is ignored."""
    path = checkpoint_file(checkpoint, STATE_FILE)
    if path is None:
        return

    def retried(state: WriterRetries) -> None:
        state.retries += 1
        state.table, state.cause, state.updated = table, cause, time.time()

    try:
        update_record(path, WriterRetries, retried, lock=True)
    except (OSError, StorageAccessError) as exc:
        log.debug("take-up state not written to %s: %s", path, exc)
