"""What `lance-cdf publish` reports to the metrics endpoint, followed from the Spark
query's progress reports (one per micro-batch, read every second)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from lance_cdf.kafka.outage import read_state
from lance_cdf.ops.metrics import Progress
from lance_cdf.ops.takeup import read_writer_retries
from lance_cdf.spark.source.checkpoint import read_report, report_path
from lance_cdf.spark.source.stream_lag import source_versions

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("lance_cdf.kafka")

# The observation `runner.hand_off` names: the events each micro-batch planned, as its
# input rows are work items (one per writer slot).
OBSERVED = "lance_cdf"


def planned_events(report: dict[str, Any]) -> int | None:
    """The events a hand-off micro-batch planned (None: not a hand-off stream)."""
    observed = (report.get("observedMetrics") or {}).get(OBSERVED)
    if observed is None:
        return None
    return int(observed["events"] or 0)


# (s) how often a stop looks whether the running micro-batch has ended
STOP_LOOK_S = 0.02
# (s) a stop waits for the next trigger when it is closer than this (or than a quarter of
# the interval): a trigger that starts just as the query is stopped would be interrupted
STOP_MARGIN_S = 0.1
_UNITS = {"millisecond": 0.001, "second": 1.0, "minute": 60.0, "hour": 3600.0}


def interval_seconds(interval: str | None) -> float | None:
    """Spark's trigger interval text ("500 milliseconds", "2 seconds") in seconds (None:
    none, or a form this does not read)."""
    if not interval:
        return None
    parts = interval.strip().lower().split()
    if len(parts) != 2:
        return None
    try:
        number = float(parts[0])
    except ValueError:
        return None
    unit = _UNITS.get(parts[1].rstrip("s"))
    return None if unit is None else number * unit


def clear_of_trigger(now: float, interval_s: float | None) -> bool:
    """Whether the next trigger is far enough from `now` (the epoch's seconds) for a stop:
    Spark's processing-time triggers fire at multiples of the interval since the epoch."""
    if not interval_s or interval_s <= 0:
        return True
    return interval_s - (now % interval_s) > min(STOP_MARGIN_S, interval_s / 4)


def finish_micro_batch(query: StreamingQuery, limit_s: float, interval_s: float | None) -> bool:
    """Wait, up to `limit_s`, until the query is between micro-batches (the running one,
    if any, has committed: its transaction metadata written) and clear of the next
    trigger, so that stopping it then interrupts nothing; True if so (or it has ended),
    False when the limit passed with a micro-batch still running."""
    deadline = time.monotonic() + limit_s
    while query.isActive:
        try:
            active = bool(query.status.get("isTriggerActive"))
        except Exception:  # noqa: BLE001 (the query ended meanwhile: nothing runs)
            return True
        if not active and clear_of_trigger(time.time(), interval_s):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(STOP_LOOK_S)
    return True


class QueryFollower:
    """Accumulates the progress reports of a running StreamingQuery into `Progress`."""

    def __init__(self, query: StreamingQuery, interval: float = 1.0, checkpoint: str | None = None):
        self.query, self.interval = query, interval
        self.checkpoint = checkpoint  # where the writer tasks leave Kafka's state
        self.state = Progress()
        self._last_batch = -1
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lance-cdf-progress", daemon=True)

    def start(self) -> QueryFollower:
        self._thread.start()
        return self

    def progress(self) -> Progress:
        with self._lock:
            out = Progress(**vars(self.state))
        kafka = read_state(self.checkpoint)
        if kafka is not None:
            since = kafka.unavailable_since
            out.kafka_unavailable_s = max(0.0, time.time() - since) if since else 0.0
            out.kafka_retries = kafka.retries
        self._takeup(out)
        return out

    def _takeup(self, out: Progress) -> None:
        """A database publisher's take-up retries and set-aside tables: its stream's
        report (the driver's) and the writer tasks' state, in a local checkpoint."""
        path = report_path(self.checkpoint) if self.checkpoint else None
        report = read_report(path) if path else None
        if report is None or "aside" not in report:
            return
        writer = read_writer_retries(self.checkpoint)
        out.takeup_retries = int(report.get("takeup_retries") or 0) + (
            writer.retries if writer is not None else 0
        )
        out.tables_aside = len(report.get("aside") or {})
        out.set_asides = int(report.get("set_asides") or 0)
        discovery = report.get("discovery")
        if discovery:  # (publish --commit-events)
            out.events_heard = int(discovery.get("mode") == "events")
            out.commit_hints = int(discovery.get("hints") or 0)
            out.commits_unannounced = int(discovery.get("unannounced") or 0)

    def failed(self) -> None:
        """The query failed: its micro-batch was not delivered."""
        with self._lock:
            self.state.delivery_failures += 1
            self.state.last_error = time.time()

    def stop(self) -> None:
        self._stop.set()
        self.update()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.update()
            except Exception as exc:  # e.g. the JVM is stopping: the caller reports that
                log.debug("reading the query's progress failed: %s", exc)

    def update(self) -> None:
        reports = self.query.recentProgress or []
        with self._lock:
            for p in reports:
                batch = int(p.get("batchId", -1))
                if batch <= self._last_batch:
                    continue
                self._last_batch = batch
                versions = source_versions(p)
                rows = planned_events(p)
                if versions is None and rows is None:
                    continue  # (a database stream's offsets hold no one version: rows only)
                if rows is None:
                    rows = int(p.get("numInputRows") or 0)
                self.state.batches += 1
                self.state.events += rows
                if versions is not None:
                    self.state.version = versions.delivered
