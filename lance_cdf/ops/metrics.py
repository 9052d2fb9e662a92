"""Prometheus metrics of `lance-cdf publish` and `lance-cdf replicate` (`--metrics-port`).

A pipeline hands `PipelineMetrics` a function returning its `Progress` (counters
it keeps anyway); every scrape reads that, and the source table's latest version
and commit times, so lag is computed when asked, never stale:

    lance_cdf_source_latest_version      latest version of the source table
    lance_cdf_published_version          publish: changes up to it are in Kafka
    lance_cdf_applied_version            replicate: the replica equals the source at it
                                         (without transaction metadata: the highest
                                         version of any record applied, not known complete)
    lance_cdf_lag_versions               latest - published/applied
    lance_cdf_lag_seconds                age of the oldest version not yet published/applied
                                         (now - its commit time; 0 when caught up)
                                         (both absent until a version is published /
                                         applied: the lag is not known, not 0)
    lance_cdf_events_total               events published / records consumed
    lance_cdf_events_per_second          over the last minute
    lance_cdf_batches_total              micro-batches / replica batches
    lance_cdf_dead_letters_total         records set aside (replicate --dead-letter-topic)
    lance_cdf_delivery_failures_total    failed micro-batches (publish) / offset commits
                                         and dead-letter writes that failed (replicate)
    lance_cdf_last_error_timestamp_seconds  unix time of the last failure (0: none)
    lance_cdf_kafka_lag_records          replicate: records in the topic not yet consumed
    lance_cdf_consumer_restarts_total    replicate: consumers renewed after a fatal consumer
                                         error (a static member fenced)
    lance_cdf_kafka_unavailable_seconds  publish: how long the broker has not answered (0: it does)
    lance_cdf_kafka_retries_total        publish: broker requests repeated during outages
    lance_cdf_takeup_retries_total       publish --database: a table's take-up or publish
                                         repeated after a transient fault
    lance_cdf_tables_set_aside           publish --database: tables set aside now (their
                                         take-up keeps failing; tried again later)
    lance_cdf_set_asides_total           publish --database: times a table was set aside
    lance_cdf_commit_events_heard        publish --commit-events: 1 while commit events are
                                         heard, 0 while tables are found by listing instead
                                         (`lance-cdf status` says why)
    lance_cdf_commit_hints_total         publish --commit-events: tables named by commit
                                         events (repeats included)
    lance_cdf_commits_unannounced_total  publish --commit-events: commits of quiet tables found
                                         by the safety-net listing that no event named (the
                                         bucket's notification misses them)
    lance_cdf_index_builds_total         replicate: replica indexes built or rebuilt from the
                                         source's definition (or --index)
    lance_cdf_indexes_unbuilt            replicate: index definitions the replica could not
                                         build now (named in the log and `status`; retried)
    lance_cdf_pipeline_info{role,table,topic}  1

A database publisher (`publish --database`) gives the source and lag gauges once per
followed table, with a `table` label (its qualified name; only the tables followed, so the
label's values are bounded by the database), and the counters once for the publisher. A
database replicator (`replicate --database-target`) gives `lance_cdf_applied_version` and
`lance_cdf_kafka_lag_records` per replica table (the source and lag gauges too, given the
source database), and the counters summed over its tables.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from lance_cdf.errors import LanceCdfError
from lance_cdf.ops.clientconfig import redact_url

if TYPE_CHECKING:
    from lance_cdf.format.table import TableLog

RATE_WINDOW = 60.0  # seconds of history behind lance_cdf_events_per_second


@dataclass
class Progress:
    """What a pipeline has done since it started."""

    version: int | None = None  # source version published / applied through (None: none yet)
    events: int = 0
    batches: int = 0
    dead_letters: int = 0
    delivery_failures: int = 0
    last_error: float = 0.0  # unix time, 0 = never
    kafka_lag: int | None = None
    # replicate: consumers renewed after a fatal consumer error; None: not a replicator
    consumer_restarts: int | None = None
    # publish: how long Kafka has not answered (0: it answers) and the retries since the
    # checkpoint's first outage (`KafkaState`); None: not known
    kafka_unavailable_s: float | None = None
    kafka_retries: int | None = None
    # publish --database: take-up and publish attempts of a table repeated after a
    # transient fault, the tables set aside now, and the times a table was set aside
    # (`AsideTables`, `WriterRetries`); None: not a database publisher
    takeup_retries: int | None = None
    tables_aside: int | None = None
    set_asides: int | None = None
    # publish --commit-events: 1 while the events are heard (0: listing instead), and the
    # tables they named (`CommitHints`); None: no commit events
    events_heard: int | None = None
    commit_hints: int | None = None
    commits_unannounced: int | None = None
    # replicate: replica indexes built or rebuilt, and definitions not built now
    # (`IndexKeeper`); None: not a replicator
    index_builds: int | None = None
    indexes_unbuilt: int | None = None


# the metrics a pipeline has only where its Progress gives the value: (Progress attribute,
# family, name, meaning); a Counter's name gets `_total` when exposed
OPTIONAL_METRICS: tuple[
    tuple[str, type[GaugeMetricFamily | CounterMetricFamily], str, str], ...
] = (
    (
        "kafka_unavailable_s",
        GaugeMetricFamily,
        "lance_cdf_kafka_unavailable_seconds",
        "how long the broker has not answered the publisher (0: it answers)",
    ),
    (
        "kafka_retries",
        CounterMetricFamily,
        "lance_cdf_kafka_retries",
        "requests to the broker repeated during outages",
    ),
    # a database publisher's take-up (`AsideTables`)
    (
        "takeup_retries",
        CounterMetricFamily,
        "lance_cdf_takeup_retries",
        "take-ups or publishes of a table repeated after a transient fault",
    ),
    (
        "tables_aside",
        GaugeMetricFamily,
        "lance_cdf_tables_set_aside",
        "tables set aside now (their take-up keeps failing; tried again later)",
    ),
    ("set_asides", CounterMetricFamily, "lance_cdf_set_asides", "times a table was set aside"),
    # a database publisher's commit events (`CommitHints`)
    (
        "events_heard",
        GaugeMetricFamily,
        "lance_cdf_commit_events_heard",
        "1 while commit events are heard, 0 while tables are found by listing instead",
    ),
    (
        "commit_hints",
        CounterMetricFamily,
        "lance_cdf_commit_hints",
        "tables named by commit events (repeats included)",
    ),
    (
        "commits_unannounced",
        CounterMetricFamily,
        "lance_cdf_commits_unannounced",
        "commits of quiet tables found by listing that no commit event named",
    ),
    (
        "index_builds",
        CounterMetricFamily,
        "lance_cdf_index_builds",
        "replica indexes built or rebuilt from the source's definition or --index",
    ),
    (
        "indexes_unbuilt",
        GaugeMetricFamily,
        "lance_cdf_indexes_unbuilt",
        "index definitions the replica could not build now (retried at upkeeps)",
    ),
    (
        "consumer_restarts",
        CounterMetricFamily,
        "lance_cdf_consumer_restarts",
        "consumers renewed after a fatal consumer error",
    ),
)


class PipelineMetrics:
    """The metrics of one pipeline (`role` "publish" or "replicate"), collected on scrape."""

    def __init__(
        self,
        role: str,
        progress: Callable[[], Progress],
        table: str | None = None,
        storage_options: dict[str, str] | None = None,
        topic: str = "",
        tables: Callable[[], Mapping[str, tuple[str | None, int | None]]] | None = None,
        kafka_lags: Callable[[], Mapping[str, int]] | None = None,
        seen: Callable[[], Mapping[str, int]] | None = None,
    ):
        """`tables`: a database pipeline's tables, qualified name -> (the source table's
        URI, None where not known; the version published / applied through), read on every
        scrape; `kafka_lags`: a database replicator's records not yet consumed, per table;
        `seen`: per table, the newest version the pipeline has seen of its source (its own
        polls): a table done through it is not looked at (a scrape costs an idle table no
        request to its storage; its lag shows once the pipeline's next poll sees a commit)."""
        if role not in ("publish", "replicate"):
            raise LanceCdfError(f"unknown pipeline role {role!r}: publish or replicate")
        self.role, self.progress, self.table, self.topic = role, progress, table, topic
        self.storage_options = dict(storage_options or {})
        self._log: TableLog | None = None  # the source table's TableLog, opened on the first scrape
        self.tables, self.kafka_lags, self.seen = tables, kafka_lags, seen
        self._logs: dict[str, TableLog] = {}  # a database's: per followed table URI
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)
        self.server: WSGIServer | None = None
        self.url: str | None = None

    # -- serving ------------------------------------------------------------------
    def serve(self, port: int, host: str = "127.0.0.1") -> str:
        """Serve `/metrics` on host:port (0: a free port) from a daemon thread; the URL."""
        try:
            server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise LanceCdfError(
                f"cannot serve metrics on {host}:{port} ({exc}); pick a free --metrics-port"
            ) from None
        self.server = server
        # the address actually bound (0.0.0.0 / :: for every interface), not a guess
        bound = str(server.server_address[0])
        shown = f"[{bound}]" if ":" in bound else bound
        self.url = f"http://{shown}:{server.server_port}/metrics"
        return self.url

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # -- the source table -----------------------------------------------------------
    def _source(
        self, version: int | None, table: str | None = None
    ) -> tuple[int | None, float | None]:
        """(latest version, commit time of the first version after `version`) of the
        pipeline's table, or of the database's table at URI `table`."""
        if table is None and self.table is None:
            return None, None
        from lance_cdf.format.table import TableLog

        if table is not None:
            log = self._logs.get(table)
            if log is None:
                log = self._logs[table] = TableLog(table, self.storage_options)
        else:
            if self._log is None:
                assert self.table is not None
                self._log = TableLog(self.table, self.storage_options)
            log = self._log
        versions = log.refresh()
        latest = versions[-1]
        done = version or 0
        behind = [v for v in versions if v > done]
        if not behind:
            return latest, None
        return latest, log.manifest(behind[0], operation=False).timestamp_us / 1e6

    def _rate(self, events: int, now: float) -> float:
        with self._lock:
            self._samples.append((now, events))
            while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW:
                self._samples.popleft()
            t0, e0 = self._samples[0]
        return (events - e0) / (now - t0) if now > t0 else 0.0

    # -- prometheus_client Collector --------------------------------------------------
    def describe(self) -> list[Metric]:
        return []  # collected fresh on every scrape

    def collect(self) -> Iterator[Metric]:
        p = self.progress()
        now = time.time()
        info = InfoMetricFamily("lance_cdf_pipeline", "the pipeline this process runs")
        info.add_metric(
            [], {"role": self.role, "table": redact_url(self.table or ""), "topic": self.topic}
        )
        yield info
        done = "published" if self.role == "publish" else "applied"
        if self.tables is not None:
            yield from self._table_gauges(self.tables(), done, now)
        yield from self._source_gauges(p, done, now)
        yield from self._event_counters(p, now)
        yield from self._kafka_gauges(p)

    def _source_gauges(self, p: Progress, done: str, now: float) -> Iterator[Metric]:
        """The pipeline table's latest version, the version done, and the lag between."""
        latest, oldest_pending = self._source(p.version)
        if latest is not None:
            yield GaugeMetricFamily(
                "lance_cdf_source_latest_version",
                "latest version of the source table",
                value=latest,
            )
        if p.version is not None:
            meaning = f"the changes up to this source version are {done}"
            if self.role == "replicate":  # whole versions only with transaction metadata
                meaning = (
                    "the replica equals the source at this version (without transaction "
                    "metadata: the highest source version of any record applied, versions "
                    "up to it possibly incomplete)"
                )
            yield GaugeMetricFamily(f"lance_cdf_{done}_version", meaning, value=p.version)
        if latest is not None and p.version is not None:  # (else the lag is not known yet)
            yield GaugeMetricFamily(
                "lance_cdf_lag_versions",
                f"latest source version - {done} version",
                value=max(0, latest - p.version),
            )
            yield GaugeMetricFamily(
                "lance_cdf_lag_seconds",
                f"seconds since the oldest source version not yet {done} was committed",
                value=0.0 if oldest_pending is None else max(0.0, now - oldest_pending),
            )

    def _event_counters(self, p: Progress, now: float) -> Iterator[Metric]:
        """Events, their rate, batches and failures."""
        yield CounterMetricFamily(
            "lance_cdf_events", "change events published / records consumed", value=p.events
        )
        yield GaugeMetricFamily(
            "lance_cdf_events_per_second",
            f"events per second over the last {RATE_WINDOW:.0f} s",
            value=self._rate(p.events, now),
        )
        yield CounterMetricFamily("lance_cdf_batches", "batches completed", value=p.batches)
        yield CounterMetricFamily(
            "lance_cdf_dead_letters",
            "records sent to the dead-letter topic",
            value=p.dead_letters,
        )
        yield CounterMetricFamily(
            "lance_cdf_delivery_failures",
            "failed micro-batches, offset commits or dead-letter writes",
            value=p.delivery_failures,
        )
        yield GaugeMetricFamily(
            "lance_cdf_last_error_timestamp_seconds",
            "unix time of the last failure (0: none)",
            value=p.last_error,
        )

    def _kafka_gauges(self, p: Progress) -> Iterator[Metric]:
        """The broker's availability and retries, and the records not yet consumed."""
        for attr, family, name, meaning in OPTIONAL_METRICS:
            value = getattr(p, attr)
            if value is not None:  # (None: not a quantity of this pipeline)
                yield family(name, meaning, value=value)
        if p.kafka_lag is not None:
            yield GaugeMetricFamily(
                "lance_cdf_kafka_lag_records",
                "records in the topic not yet consumed",
                value=p.kafka_lag,
            )
        if self.kafka_lags is not None:
            lags = GaugeMetricFamily(
                "lance_cdf_kafka_lag_records",
                "records in the table's topic not yet consumed",
                labels=["table"],
            )
            for name, lag in sorted(self.kafka_lags().items()):
                lags.add_metric([name], lag)
            yield lags

    def _table_gauges(
        self, tables: Mapping[str, tuple[str | None, int | None]], done: str, now: float
    ) -> Iterator[Metric]:
        """The source and lag gauges per followed table of a database, labelled `table`
        (a table whose source is not known: its published / applied version only)."""
        for gone in [u for u in self._logs if u not in {u for u, _ in tables.values()}]:
            del self._logs[gone]  # a table no longer followed: its label goes too
        latest_g = GaugeMetricFamily(
            "lance_cdf_source_latest_version",
            "latest version of the source table",
            labels=["table"],
        )
        done_g = GaugeMetricFamily(
            f"lance_cdf_{done}_version",
            f"the changes up to this source version are {done}",
            labels=["table"],
        )
        lag_g = GaugeMetricFamily(
            "lance_cdf_lag_versions", f"latest source version - {done} version", labels=["table"]
        )
        age_g = GaugeMetricFamily(
            "lance_cdf_lag_seconds",
            f"seconds since the oldest source version not yet {done} was committed",
            labels=["table"],
        )
        seen = self.seen() if self.seen is not None else {}
        for name, (uri, version) in sorted(tables.items()):
            if uri is None:
                if version is not None:
                    done_g.add_metric([name], version)
                continue
            known = seen.get(name)
            latest: int | None
            oldest_pending: float | None
            try:
                if version is not None and known is not None and known <= version:
                    latest, oldest_pending = version, None  # done through all it has seen
                else:
                    latest, oldest_pending = self._source(version, uri)
            except (LanceCdfError, OSError):
                continue  # dropped since: left out until the publisher lets it go
            if latest is None:
                continue
            latest_g.add_metric([name], latest)
            if version is None:
                continue  # nothing published / applied yet: its lag is not known
            done_g.add_metric([name], version)
            lag_g.add_metric([name], max(0, latest - version))
            age = 0.0 if oldest_pending is None else max(0.0, now - oldest_pending)
            age_g.add_metric([name], age)
        yield from (latest_g, done_g, lag_g, age_g)
