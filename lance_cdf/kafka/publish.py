"""`lance-cdf publish`: run the lance-cdf stream into Kafka on a local Spark session."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING, Any

from lance_cdf.clientconfig import redact, redact_url, scrub
from lance_cdf.errors import LanceCdfError
from lance_cdf.kafka.endpoints import check_broker, check_registry, check_topic, first_failure
from lance_cdf.keyhash import KEY_HASH, PARTITION_COLUMN

if TYPE_CHECKING:  # pyspark is imported once the checks are under way (see _publish)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from lance_cdf.kafka.progress import QueryFollower


def publish(
    table: str,
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    checkpoint: str,
    starting_version: str = "latest",
    trigger_interval: str = "1 second",
    available_now: bool = False,
    key: str | None = None,
    tombstones: bool = True,
    producer_config: dict[str, str] | None = None,
    registry_config: dict[str, str] | None = None,
    storage_options: dict[str, str] | None = None,
    max_rows_per_trigger: int | None = None,
    master: str | None = None,
    snapshot: bool = False,
    drop_unchanged_updates: bool = False,
    table_name: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    writers: int | None = None,
    exactly_once: bool = True,
    head_start: bool = True,
) -> int:
    """Stream the table's changes to `topic` until stopped (or, with
    `available_now`, until the latest version at start is published).

    `snapshot`: first the table as it stands when the query first starts, as
    `op="r"` records, then the changes after it (the checkpoint remembers the
    snapshot's version and how far it got).
    `table_name`: `prefix.table` naming the Avro records (`prefix.table.Envelope`)
    and `source.name` / `source.table`; default `lancecdf.<table directory name>`.
    `master`: the Spark master URL; by default the one `spark-submit --master` gave,
    else `local[2]`. An active session (a spark-submit script's) is reused.
    `metrics_port`: serve Prometheus metrics on metrics_host:metrics_port (0: any free
    port; see lance_cdf.metrics).
    `writers`: parallel writer tasks per micro-batch (default: Spark's default
    parallelism), at most one per partition of the topic; each owns a disjoint set of
    partitions (`partition % writers`) and reads that share of the micro-batch's events
    itself, so per-key order holds whatever their number.
    `exactly_once`: a replayed micro-batch skips the records each partition already holds
    (per-partition high-water marks); False: plain at-least-once.
    `head_start`: publish the commits waiting at start from this process while Spark starts
    (kafka/headstart.py; exactly-once only, and only where the query's start is known
    before it starts: a checkpoint's committed offset or a numeric starting version)."""
    producer_config = dict(producer_config or {})
    # SIGTERM / SIGINT only set a flag: the main thread polls it between short
    # awaitTermination() calls and stops the query itself. A handler that called
    # query.stop() would re-enter py4j while the main thread is blocked in it
    # ("reentrant call inside <_io.BufferedReader>", then Py4JNetworkError).
    stopping = threading.Event()
    previous = _on_signals(lambda *_: stopping.set())
    try:
        return _publish(
            stopping, table, bootstrap_servers, topic, schema_registry, checkpoint,
            starting_version, trigger_interval, available_now, key, tombstones,
            producer_config, registry_config, storage_options, max_rows_per_trigger, master,
            snapshot, drop_unchanged_updates, writers, exactly_once, table_name,
            metrics_port, metrics_host, head_start,
        )  # fmt: skip
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def route(changes: DataFrame, partitions: int, tasks: int) -> DataFrame:
    """The stream (read with option keyHash) routed for `tasks` parallel writers that keep
    per-key order: each record's Kafka partition is `_key_hash % partitions`, and a hash
    repartition on that partition gives every writer task a disjoint set of Kafka
    partitions. Spark refuses to sort a stream, so each writer task puts its share back in
    commit order itself (`publisher.commit_order`: commit version; deletes, updates,
    inserts; `_event_order`).

    Why a shuffle rather than `coalesce(1)` (one task per micro-batch, the earlier way):
    see BENCHMARKS.md, "Parallel writers". `lance-cdf publish` itself hands each writer
    task its share to read instead (`hand_off`), which is faster; `route` is for a job
    that transforms the events in Spark before writing them."""
    from pyspark.sql import functions as F

    return (
        changes.withColumn(PARTITION_COLUMN, F.pmod(F.col(KEY_HASH), F.lit(partitions)).cast("int"))
        .drop(KEY_HASH)
        .repartition(tasks, PARTITION_COLUMN)
    )  # fmt: skip


def hand_off(work: DataFrame) -> DataFrame:
    """The work-item stream (source option writerSlots) with the events each micro-batch
    planned observed, for the progress reports (`progress.planned_events`): Spark counts
    the work items as its input rows.

    Why work items rather than `route` (a repartition of the events): a Python source's
    events reach a Python writer through Spark's JVM (Arrow -> rows -> shuffle -> Arrow);
    a writer task that reads its own slot's share skips all of it: 1.16x the throughput
    on narrow rows, 1.8x on 768-d vectors, and it grows with the workers (BENCHMARKS.md,
    "Hand-off")."""
    from pyspark.sql import functions as F

    from lance_cdf.kafka.progress import OBSERVED
    from lance_cdf.keyhash import WORK_EVENTS

    return work.observe(OBSERVED, F.sum(WORK_EVENTS).alias("events"))


def _on_signals(handler: Callable[[int, FrameType | None], Any]) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}  # signals are delivered to the main thread only
    return {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}


def _publish(
    stopping: threading.Event,
    table: str,
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    checkpoint: str,
    starting_version: str,
    trigger_interval: str,
    available_now: bool,
    key: str | None,
    tombstones: bool,
    producer_config: dict[str, str],
    registry_config: dict[str, str] | None,
    storage_options: dict[str, str] | None,
    max_rows_per_trigger: int | None,
    master: str | None,
    snapshot: bool,
    drop_unchanged_updates: bool,
    writers: int | None,
    exactly_once: bool,
    table_name: str | None,
    metrics_port: int | None,
    metrics_host: str,
    head_start: bool,
) -> int:
    started = time.monotonic()
    stages: dict[str, float] = {}
    source_options, sink_options = _stream_options(
        table, bootstrap_servers, topic, schema_registry, checkpoint, starting_version, key,
        tombstones, producer_config, registry_config, storage_options, max_rows_per_trigger,
        snapshot, drop_unchanged_updates, exactly_once, table_name,
    )  # fmt: skip
    early = None
    if exactly_once and head_start:
        from lance_cdf.kafka.headstart import start_offset

        early = start_offset(checkpoint, starting_version, snapshot)

    def checks() -> int:
        t = time.monotonic()
        check_broker(bootstrap_servers, producer_config)
        check_registry(schema_registry, registry_config)
        partitions = check_topic(bootstrap_servers, topic, producer_config)
        stages["checks"] = time.monotonic() - t
        return partitions

    def after_checks() -> int:
        partitions = checked.result()
        if early is not None and not stopping.is_set():
            _head_start(source_options, sink_options, partitions, early, stages)
        return partitions

    # The broker, registry and topic checks end before the JVM starts (a refused client is
    # named in seconds, issue 34; if they hang, the JVM starts after 12 s and a failed check
    # still stops publish before any query). The head start (kafka/headstart.py) and the
    # imports run beside the JVM's start: the query starts once the head start has ended.
    pool = ThreadPoolExecutor(3, thread_name_prefix="lance-cdf-start")
    checked = pool.submit(checks)
    pending = pool.submit(after_checks)
    pool.submit(_warm_imports)  # the modules register() needs, loaded while the JVM starts
    pool.shutdown(wait=False)
    first_failure(checked, stopping)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    own_session = SparkSession.getActiveSession() is None
    builder = SparkSession.builder
    chosen = None  # the master publish sets (None: spark-submit's or the active session's)
    if master or (own_session and "PYSPARK_GATEWAY_PORT" not in os.environ):
        chosen = master or "local[2]"
        builder = builder.master(chosen)  # (spark-submit sets the gateway)
    if own_session:
        builder = builder.appName(f"lance-cdf publish {topic}").config("spark.ui.enabled", "false")
        if (chosen or "").startswith("local") and "SPARK_LOCAL_IP" not in os.environ:
            # a local master needs no port reachable from elsewhere: the driver's RPC and
            # block-manager ports listen on loopback only (Spark's default is the host's
            # external address, with authentication off); SPARK_LOCAL_IP asks otherwise
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                "spark.driver.host", "127.0.0.1"
            )
    t = time.monotonic()
    spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if own_session:
        _quiet_accumulators(spark)
    stages["Spark session"] = time.monotonic() - t
    # SparkContext installs its own SIGINT handler (cancel all jobs, raise
    # KeyboardInterrupt inside a py4j call): ours again
    _on_signals(lambda *_: stopping.set())
    try:
        partitions = pending.result()
    except BaseException:
        if own_session:
            spark.stop()
        raise
    from lance_cdf.kafka import sink as spark_sink
    from lance_cdf.streaming import register

    register(spark)
    spark_sink.register(spark)
    tasks = min(partitions, writers or spark.sparkContext.defaultParallelism)
    reader = spark.readStream.format("lance-cdf").options(**source_options)
    reader = reader.option("writerSlots", tasks).option("kafkaPartitions", partitions)
    t = time.monotonic()
    changes = hand_off(reader.load())  # load(): the schema
    stages["source schema"] = time.monotonic() - t
    writer = changes.writeStream.format("lance-cdf-kafka").options(**sink_options)
    trigger = {"availableNow": True} if available_now else {"processingTime": trigger_interval}
    if stopping.is_set():  # stopped during start-up: nothing was started
        if own_session:
            spark.stop()
        return 0
    t = time.monotonic()
    query = writer.trigger(**trigger).start()
    stages["query start"] = time.monotonic() - t
    took = ", ".join(f"{k} {v:.1f} s" for k, v in stages.items())
    print(
        f"publishing {redact_url(table)} -> {topic} on {redact_url(bootstrap_servers)} with "
        f"{tasks} writer(s) over {partitions} partition(s) (checkpoint "
        f"{redact_url(checkpoint)}; producer settings "
        f"{redact(producer_config)}; start-up {time.monotonic() - started:.1f} s: {took})",
        flush=True,
    )
    follower = _serve_metrics(query, table, topic, storage_options, metrics_port, metrics_host)

    error = None
    try:
        # pyspark annotates the timeout as int but takes seconds as a float (int(t * 1000))
        while not stopping.is_set() and not query.awaitTermination(0.5):  # type: ignore[arg-type]
            pass
    except Exception as exc:  # the query failed: Spark raises StreamingQueryException
        error = exc
    if stopping.is_set() and error is None:
        # Stopping interrupts the running micro-batch: it is not committed, so the next
        # start sends it again from the checkpoint (see README, "When things fail").
        query.stop()
    error = error or query.exception()
    if follower is not None:
        follower.stop()
        if error is not None:
            follower.failed()
    if own_session:
        _quiet_stop(spark)
    if error is not None:
        raise LanceCdfError(f"the publishing query failed: {error}") from None
    return 0


def _stream_options(
    table: str,
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    checkpoint: str,
    starting_version: str,
    key: str | None,
    tombstones: bool,
    producer_config: dict[str, str],
    registry_config: dict[str, str] | None,
    storage_options: dict[str, str] | None,
    max_rows_per_trigger: int | None,
    snapshot: bool,
    drop_unchanged_updates: bool,
    exactly_once: bool,
    table_name: str | None,
) -> tuple[dict[str, str], dict[str, str]]:
    """The options of the `lance-cdf` source and of the `lance-cdf-kafka` sink (the query's
    and the head start's)."""
    source_options = {"path": table}
    source_options["startingVersion"] = "snapshot" if snapshot else starting_version
    if drop_unchanged_updates:
        source_options["dropUnchangedUpdates"] = "true"
    if max_rows_per_trigger:
        source_options["maxRowsPerTrigger"] = str(max_rows_per_trigger)
    source_options["keyHash"] = key or "_rowid"
    sink_options = {
        "kafka.bootstrap.servers": bootstrap_servers, "topic": topic,
        "schema.registry.url": schema_registry, "table": table,
        "tombstones": str(tombstones).lower(), "checkpointLocation": checkpoint,
        "exactlyOnce": str(exactly_once).lower(),
    }  # fmt: skip
    if key:
        sink_options["key"] = key
    if table_name:
        sink_options["table.name"] = table_name
    sink_options.update({f"kafka.{k}": v for k, v in producer_config.items()})
    sink_options.update({f"registry.{k}": v for k, v in (registry_config or {}).items()})
    for k, v in (storage_options or {}).items():
        source_options[f"storage.{k}"] = sink_options[f"storage.{k}"] = v
    return source_options, sink_options


def _head_start(
    source_options: dict[str, str],
    sink_options: dict[str, str],
    partitions: int,
    start: dict[str, int],
    stages: dict[str, float],
) -> None:
    """Publish the commits waiting at `start` from this process (kafka/headstart.py); a
    failure is reported and left to the query, which skips whatever was acknowledged."""
    from lance_cdf.kafka.headstart import head_start

    t = time.monotonic()
    try:
        done = head_start(
            {**source_options, "kafkaPartitions": str(partitions)}, sink_options, start
        )
    except Exception as exc:  # noqa: BLE001 (the query reads and publishes them again)
        print(f"head start skipped ({type(exc).__name__}: {scrub(str(exc))}); the query publishes "
              "those commits", flush=True)  # fmt: skip
        return
    finally:
        stages["head start"] = time.monotonic() - t
    if done is not None:
        print(done, flush=True)


def _warm_imports() -> None:
    """Import what the driver needs after the session starts (the source, its SQL function
    and the sink's classes: ~1 s of CPU), in a thread while the main thread waits for the
    JVM. An import error here is raised again, in the main thread, where it is used."""
    try:
        import lance_cdf.kafka.sink  # noqa: F401
        import lance_cdf.streaming.source  # noqa: F401
        import lance_cdf.streaming.table_changes  # noqa: F401
    except Exception:  # noqa: BLE001 - raised again where used, in the main thread
        pass


def _quiet_accumulators(spark: SparkSession) -> None:
    """PySpark's accumulator server prints an EOFError traceback when the JVM closes its
    connection first (a race while a query or the session stops, not an error): silenced
    for the session publish owns."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda *_: None


def _quiet_stop(spark: SparkSession) -> None:
    _quiet_accumulators(spark)
    spark.stop()


def _serve_metrics(
    query: StreamingQuery,
    table: str,
    topic: str,
    storage_options: dict[str, str] | None,
    port: int | None,
    host: str,
) -> QueryFollower | None:
    """Follow the query's progress and serve it as Prometheus metrics (None: no port)."""
    if port is None:
        return None
    from lance_cdf.kafka.progress import QueryFollower
    from lance_cdf.metrics import PipelineMetrics

    follower = QueryFollower(query).start()
    metrics = PipelineMetrics("publish", follower.progress, table, storage_options, topic)
    print(f"metrics at {metrics.serve(port, host)}", flush=True)
    return follower
