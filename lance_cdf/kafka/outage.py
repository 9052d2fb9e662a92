"""Kafka outages ridden out by `lance-cdf publish`'s writer tasks, and the state they leave.

Spark's local mode does not retry a failed task, so a writer task that gave up at the
first unanswered request would stop publish within seconds of a broker outage. A
writer task instead retries what it needs from the broker (the partitions' offsets and last
records) with backoff, and waits for queued records to be acknowledged (the idempotent
producer keeps them, in order, until `message.timeout.ms`), for up to `RIDE_OUT_S` seconds
in all. Past that it raises `KafkaUnavailableError`: one line, the micro-batch is not
committed, a rerun with the same checkpoint is exact.

One rule says what an outage is, in the log, `status` and the metrics alike: Kafka not
answering for longer than the flush timeout (`--flush-timeout`). A request that fails and
succeeds when retried within it (a partition's leader moving to another broker) is a retry,
counted as such; once the failures last that long, the outage is logged (once when Kafka
stops answering, once when it answers again) and counted.

The state goes to `<checkpoint>/lance-cdf-kafka.json` (local checkpoints only: the
writer tasks and `publish` share the machine), which the metrics endpoint
(`lance_cdf_kafka_unavailable_seconds`, `lance_cdf_kafka_retries_total`) and `lance-cdf
status --checkpoint` read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol, TypeVar

from lance_cdf.errors import KafkaUnavailableError, in_words
from lance_cdf.ops.state_files import checkpoint_file, read_record, update_record
from lance_cdf.retry import RetryPolicy, retry

# How long a flush waits for acknowledgements (and a read for a partition's last record)
# before Kafka counts as not answering and the outage is ridden out: publish's
# --flush-timeout, the sink's option flushTimeout.
FLUSH_TIMEOUT_S = 60.0

log = logging.getLogger("lance_cdf.kafka")

# librdkafka's default message.timeout.ms (300 s) is how long queued records are kept:
# an outage is ridden out as long as that
RIDE_OUT_S = 300.0
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)  # then 15 s between attempts
STATE_FILE = "lance-cdf-kafka.json"

T = TypeVar("T")


class OutageSettings(Protocol):
    """Settings that say how a broker outage is ridden out (`RideOut.of`): the sink's
    options (`SinkOptions`) and a publisher's (`PublisherSettings`)."""

    @property
    def checkpoint(self) -> str | None: ...  # where the outage's state goes (None: nowhere)

    @property
    def flush_timeout_s(self) -> float: ...  # Kafka not answering this long: an outage

    @property
    def ride_out_s(self) -> float: ...  # how long an outage is ridden out


@dataclass
class KafkaState:
    """What the writer tasks last saw of Kafka (unix times; 0: never)."""

    unavailable_since: float = 0.0  # the current outage's start (0: Kafka answers)
    retries: int = 0  # attempts repeated since the checkpoint's first outage
    outages: int = 0
    last_outage_s: float = 0.0  # how long the last outage that ended lasted
    longest_outage_s: float = 0.0  # the longest that ended (a broker back from a long
    # outage can answer one request with a stale-epoch error: a second, short one)
    cause: str = ""  # the last error seen while Kafka did not answer
    updated: float = 0.0


def cause_of(exc: BaseException) -> str:
    """A client error in words: a Kafka error's own text, else `in_words`."""
    from confluent_kafka import KafkaError

    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError):
        return str(err.str())
    return in_words(exc)


def state_path(checkpoint: str | None) -> str | None:
    return checkpoint_file(checkpoint, STATE_FILE)


def read_state(checkpoint: str | None) -> KafkaState | None:
    """The state the writer tasks left in a local checkpoint (None: none, or remote)."""
    path = state_path(checkpoint)
    return None if path is None else read_record(path, KafkaState)


class RideOut:
    """One writer task's view of an outage: `call` retries, `waiting` / `answered` mark
    time spent waiting for acknowledgements."""

    def __init__(
        self,
        where: str,
        checkpoint: str | None,
        budget_s: float = RIDE_OUT_S,
        outage_after_s: float = FLUSH_TIMEOUT_S,
    ):
        self.where, self.budget_s, self.outage_after_s = where, budget_s, outage_after_s
        self.path = state_path(checkpoint)
        self.since: float | None = None  # monotonic time Kafka stopped answering
        self.outage = False  # whether that has lasted `outage_after_s`: an outage
        self.attempts = 0

    @classmethod
    def of(cls, where: str, settings: OutageSettings) -> RideOut:
        """The ride-out `settings` ask for, of Kafka at `where` (the bootstrap servers)."""
        return cls(
            where,
            settings.checkpoint,
            budget_s=settings.ride_out_s,
            outage_after_s=settings.flush_timeout_s,
        )

    def call(
        self, what: str, attempt: Callable[[], T], transient: tuple[type[Exception], ...]
    ) -> T:
        """`attempt()`, repeated with backoff while it raises a `transient` error, until
        the outage's budget is spent (`waiting` raises then)."""
        out = retry(
            attempt,
            RetryPolicy(BACKOFF_S, deadline_s=math.inf),
            lambda exc: isinstance(exc, transient),
            lambda exc, retries, pause: self.waiting(f"{what}: {cause_of(exc)}"),
        )
        self.answered()
        return out

    def waiting(self, cause: str, waited_s: float = 0.0) -> None:
        """Kafka did not answer (`cause`; for the last `waited_s` seconds, a flush's wait):
        counted as a retry; once that has lasted `outage_after_s`, as an outage (logged
        once); past the budget, raise."""
        now = time.monotonic()
        if self.since is None:
            self.since, self.attempts, self.outage = now - waited_s, 0, False
        if not self.outage and now - self.since >= self.outage_after_s:
            self.outage = True
            log.warning(
                "Kafka at %s does not answer (%s); retrying for up to %.0f s",
                self.where,
                cause,
                self.budget_s,
            )
            self._write(lambda s: _started(s, cause))
        self.attempts += 1
        self._write(lambda s: _retried(s, cause))
        if now - self.since >= self.budget_s:
            # (the facts only: what to do is the caller's to say, publish's `_FIXES`)
            raise KafkaUnavailableError(
                f"Kafka at {self.where} did not answer for {now - self.since:.0f} s ({cause})"
            )

    def answered(self) -> None:
        """Kafka answered: the outage in hand, if any, ended (logged once)."""
        if self.since is None:
            return
        took = time.monotonic() - self.since
        self.since = None
        if not self.outage:  # (retries within the flush timeout: no outage)
            log.info("Kafka at %s answered after %d retries", self.where, self.attempts)
            return
        self.outage = False
        log.warning(
            "Kafka at %s answers again after %.0f s (%d retries)", self.where, took, self.attempts
        )
        self._write(lambda s: _ended(s, took))

    def _write(self, change: Callable[[KafkaState], None]) -> None:
        """Read, change and replace the state file (atomically: tasks write it in turn)."""
        if self.path is None:
            return

        def changed(state: KafkaState) -> None:
            change(state)
            state.updated = time.time()

        try:
            update_record(self.path, KafkaState, changed, lock=False)
        except OSError as exc:  # the state is for reports: publishing goes on without it
            log.debug("Kafka state not written to %s: %s", self.path, exc)


def _started(state: KafkaState, cause: str) -> None:
    if not state.unavailable_since:
        state.unavailable_since = time.time()
        state.outages += 1
    state.cause = cause


def _retried(state: KafkaState, cause: str) -> None:
    state.retries += 1
    state.cause = cause


def _ended(state: KafkaState, took: float) -> None:
    if state.unavailable_since:
        state.last_outage_s = took
        state.longest_outage_s = max(state.longest_outage_s, took)
    state.unavailable_since = 0.0


def describe_state(checkpoint: str) -> tuple[dict[str, object], str] | None:
    """`lance-cdf status`: the Kafka state a publisher left in its checkpoint, as JSON and
    as one line (None: no outage was ever seen, or a remote checkpoint)."""
    state = read_state(checkpoint)
    if state is None:
        return None
    if state.unavailable_since:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(state.unavailable_since))
        line = (
            f"not answering the publisher since {since} UTC ({state.retries} retries so far; "
            f"{state.cause})"
        )
    else:
        line = (
            f"answering; {state.outages} outage(s) ridden out, the last one "
            f"{state.last_outage_s:.0f} s ({state.retries} retries)"
        )
        if state.longest_outage_s > state.last_outage_s + 0.5:
            line += f"; the longest {state.longest_outage_s:.0f} s"
    return asdict(state), line
