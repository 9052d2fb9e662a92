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

# The observation `publish.hand_off` names: the events each micro-batch planned, as its
# input rows are work items (one per writer slot).
OBSERVED = "lance_cdf"


def planned_events(report: dict[str, Any]) -> int | None:
    """The events a hand-off micro-batch planned (None: not a hand-off stream)."""
    observed = (report.get("observedMetrics") or {}).get(OBSERVED)
    if observed is None:
        return None
    return int(observed["events"] or 0)


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
