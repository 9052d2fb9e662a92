"""`lance-cdf publish`: run the lance-cdf stream into Kafka on a local Spark session."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lance_cdf.core.stream_columns import KEY_HASH, PARTITION_COLUMN
from lance_cdf.errors import LanceCdfError, LeaseLostError, PublishError
from lance_cdf.kafka.endpoints import check_broker, check_registry, first_failure
from lance_cdf.kafka.topics import TopicSettings
from lance_cdf.ops.clientconfig import KafkaConnection, redact, redact_url, scrub

if TYPE_CHECKING:  # pyspark is imported once the checks are under way (see _publish)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from lance_cdf.ops.lease import Lease
    from lance_cdf.spark.publish.query_progress import QueryFollower


# A commit waits for the next trigger, then for the micro-batch: commits land at any phase
# of it, so the wait's tail is the whole interval, and 500 ms brings the p99 to Kafka and to
# the replica well under a second (docs/benchmarks.md, "Latency under load"). An idle
# trigger asks the table for its latest version (one listing of
# `_versions/`): twice a second for one table. A database's tables are each listed at every
# trigger (200 tables: 200 listings), so it keeps 1 s.
DEFAULT_TRIGGER = "500 milliseconds"
DEFAULT_DATABASE_TRIGGER = "1 second"


def publish(
    table: str,
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    checkpoint: str,
    starting_version: str | None = None,
    trigger_interval: str | None = None,
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
    transaction_topic: str | None = None,
    transaction_metadata: bool = True,
    database: Database | None = None,
    topics: TopicSettings | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Stream the table's changes to `topic` until stopped (or, with
    `available_now`, until the latest version at start is published).

    `starting_version`: a number, "latest" or "earliest" (None: "latest"), for a new
    checkpoint only: with an existing checkpoint it must be the one that checkpoint was
    started with (or None), else CheckpointMismatchError (the checkpoint would ignore it).
    `snapshot`: first the table as it stands when the query first starts, as
    `op="r"` records, then the changes after it (the checkpoint remembers the
    snapshot's version and how far it got).
    `table_name`: `prefix.table` naming the Avro records (`prefix.table.Envelope`)
    and `source.name` / `source.table`; default `lancecdf.<table directory name>`.
    `master`: the Spark master URL; by default the one `spark-submit --master` gave,
    else `local[2]`. An active session (a spark-submit script's) is reused.
    `metrics_port`: serve Prometheus metrics on metrics_host:metrics_port (0: any free
    port; see lance_cdf.ops.metrics).
    `writers`: parallel writer tasks per micro-batch (default: Spark's default
    parallelism), at most one per partition of the topic; each owns a disjoint set of
    partitions (`partition % writers`) and reads that share of the micro-batch's events
    itself, so per-key order holds whatever their number.
    `exactly_once`: a replayed micro-batch skips the records each partition already holds
    (per-partition high-water marks); False: plain at-least-once.
    `head_start`: publish the commits waiting at start from this process while Spark starts
    (spark/publish/headstart.py; exactly-once only, and only where the query's start is known
    before it starts: a checkpoint's committed offset or a numeric starting version).
    `transaction_metadata`: a BEGIN and an END record per commit version on
    `transaction_topic` (default `<topic>.transaction`; kafka/transactions.py).
    `database`: every matching table of a database instead (`table` and `topic` unused:
    each table to `<topic_prefix>.<qualified name>`; spark/source/database_stream.py).
    `trigger_interval`: Spark's micro-batch interval; default `DEFAULT_TRIGGER` for a
    table, `DEFAULT_DATABASE_TRIGGER` for a database.
    `topics`: how the topics publish writes are created if missing (partitions, replication
    factor, topic settings; kafka/topics.py); by default the broker's defaults, and for a
    database as many partitions as there are writers.
    `stop`: set it (from a signal handler, another thread) to stop publishing: the query is
    stopped between micro-batch checks and publish returns 0. publish installs no signal
    handler itself; `lance-cdf publish` sets `stop` on SIGTERM / SIGINT."""
    if trigger_interval is None:
        trigger_interval = DEFAULT_DATABASE_TRIGGER if database is not None else DEFAULT_TRIGGER
    if database is not None and (transaction_topic or table_name):
        raise LanceCdfError(
            "--database names each table's topic, transaction topic and records itself: "
            "leave out --transaction-topic and --table-name"
        )
    if transaction_metadata and snapshot and max_rows_per_trigger:
        raise LanceCdfError(
            "--snapshot with --max-rows-per-trigger splits the snapshot's version over "
            "micro-batches, so its transaction metadata would count part of it; drop "
            "--max-rows-per-trigger, or publish with --no-transaction-metadata"
        )
    txn = {"transactionMetadata": str(transaction_metadata).lower()}
    if transaction_topic:
        txn["transaction.topic"] = transaction_topic
    txn.update((topics or TopicSettings()).options())  # (sink options, as the above)
    producer_config = dict(producer_config or {})
    # a stop only sets a flag: this thread polls it between short awaitTermination() calls
    # and stops the query itself (a signal handler that called query.stop() would re-enter
    # py4j while this thread is blocked in it)
    stopping = stop if stop is not None else threading.Event()
    lease = None
    try:
        shown = database.topic("*") if database is not None else topic
        lease = checkpoint_lease(checkpoint, shown, storage_options)
        if database is not None:
            head_start = False  # (spark/publish/headstart.py follows one table)
        return _publish(
            stopping,
            table,
            bootstrap_servers,
            topic,
            schema_registry,
            checkpoint,
            starting_version,
            trigger_interval,
            available_now,
            key,
            tombstones,
            producer_config,
            registry_config,
            storage_options,
            max_rows_per_trigger,
            master,
            snapshot,
            drop_unchanged_updates,
            writers,
            exactly_once,
            table_name,
            metrics_port,
            metrics_host,
            head_start,
            txn,
            lease,
            database,
        )
    finally:
        if lease is not None:
            lease.release()


@dataclass(frozen=True)
class Database:
    """`lance-cdf publish --database`: the database, which of its tables (regexes over
    qualified names, `re.fullmatch`), and the prefix of their topics."""

    uri: str
    topic_prefix: str
    include: str | None = None
    exclude: str | None = None

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}.{name}"


def checkpoint_lease(checkpoint: str, topic: str, storage_options: dict[str, str] | None) -> Lease:
    """One publisher per checkpoint: the lease `<checkpoint>/publisher.lease`
    (lance_cdf/ops/lease.py), taken before anything is read or sent, so a second `publish`
    on the same checkpoint is refused (LeaseHeldError naming the holder) instead of both
    sending the same versions; renewed from a thread, released on exit; a dead holder's
    lease is taken over. A checkpoint on object storage (`s3a://` as Spark writes it)
    takes the table's storage options."""
    from lance_cdf.ops.lease import Lease

    location = checkpoint.removeprefix("file://")
    if location.startswith("s3a://"):
        location = "s3://" + location[len("s3a://") :]
    lease = Lease.acquire(
        location,
        "publisher",
        storage_options,
        command=f"lance-cdf publish to {topic}",
        target=checkpoint,
    )
    lease.keep_alive()
    return lease


def route(changes: DataFrame, partitions: int, tasks: int) -> DataFrame:
    """The stream (read with option keyHash) routed for `tasks` parallel writers that keep
    per-key order: each record's Kafka partition is `_key_hash % partitions`, and a hash
    repartition on that partition gives every writer task a disjoint set of Kafka
    partitions. Spark refuses to sort a stream, so each writer task puts its share back in
    commit order itself (`publisher.commit_order`: commit version; deletes, updates,
    inserts; `_event_order`).

    Why a shuffle rather than `coalesce(1)` (one task per micro-batch, the earlier way):
    several writer tasks publish at once. `lance-cdf publish` itself hands each writer
    task its share to read instead (`hand_off`), which is faster; `route` is for a job
    that transforms the events in Spark before writing them."""
    from pyspark.sql import functions as F

    return (
        changes.withColumn(PARTITION_COLUMN, F.pmod(F.col(KEY_HASH), F.lit(partitions)).cast("int"))
        .drop(KEY_HASH)
        .repartition(tasks, PARTITION_COLUMN)
    )


def hand_off(work: DataFrame) -> DataFrame:
    """The work-item stream (source option writerSlots) with the events each micro-batch
    planned observed, for the progress reports (`progress.planned_events`): Spark counts
    the work items as its input rows.

    Why work items rather than `route` (a repartition of the events): a Python source's
    events reach a Python writer through Spark's JVM (Arrow -> rows -> shuffle -> Arrow);
    a writer task that reads its own slot's share skips all of it: more throughput, most
    on vectors, and it grows with the workers (docs/benchmarks.md, "Inside the publisher")."""
    from pyspark.sql import functions as F

    from lance_cdf.core.stream_columns import WORK_EVENTS
    from lance_cdf.spark.publish.query_progress import OBSERVED

    return work.observe(OBSERVED, F.sum(WORK_EVENTS).alias("events"))


@contextmanager
def _jvm_ignores_sigterm() -> Iterator[None]:
    """Spark's JVM (and the Python runners it starts) launched with SIGTERM ignored, as
    pyspark already launches it with SIGINT ignored. SIGTERM to publish's whole process
    group (`kill -TERM -- -PGID`) or control group (systemd's default stop) otherwise kills
    the JVM under the running query (exit 1, a Py4JNetworkError traceback): this way only
    publish acts on it, stopping the query and then the JVM. A signal ignored at exec stays
    ignored: HotSpot installs no shutdown handler for it (as for `nohup java`)."""
    from pyspark import java_gateway

    popen = java_gateway.Popen  # type: ignore[attr-defined]  # pyspark's subprocess.Popen

    def launch(*args: Any, **kwargs: Any) -> Any:
        inner = kwargs.get("preexec_fn")

        def preexec() -> None:
            if inner is not None:
                inner()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

        return popen(*args, **{**kwargs, "preexec_fn": preexec})

    java_gateway.Popen = launch  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        java_gateway.Popen = popen  # type: ignore[attr-defined]


@contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """The SIGTERM / SIGINT handlers as they were before the block (what Spark's start
    installs is undone)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (signal handlers belong to the main thread)
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in kept.items():
            if handler is not None:
                signal.signal(s, handler)


@contextmanager
def _python_for_spark() -> Iterator[None]:
    """PYSPARK_PYTHON, if unset, this interpreter while the block starts Spark (the JVM
    and the workers it starts keep it); the process's environment as it was after."""
    if "PYSPARK_PYTHON" in os.environ:
        yield
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        yield
    finally:
        os.environ.pop("PYSPARK_PYTHON", None)


def _session_builder(
    own_session: bool, master: str | None, topic: str, checkpoint: str, database: Database | None
) -> tuple[SparkSession.Builder, str | None]:
    """The session builder publish starts Spark with, and the master it sets (None:
    spark-submit's or the active session's). `own_session`: no session is active, so the
    settings of a long-running local publisher are publish's to give."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    chosen = None  # the master publish sets (None: spark-submit's or the active session's)
    if master or (own_session and "PYSPARK_GATEWAY_PORT" not in os.environ):
        chosen = master or "local[2]"
        builder = builder.master(chosen)  # (spark-submit sets the gateway)
    if own_session:
        builder = builder.appName(f"lance-cdf publish {topic}").config("spark.ui.enabled", "false")
        # publish prints its own progress lines; Spark's "[Stage N:>...]" bars are noise
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        if (chosen or "").startswith("local") and "SPARK_LOCAL_IP" not in os.environ:
            # a local master needs no port reachable from elsewhere: the driver's RPC and
            # block-manager ports listen on loopback only (Spark's default is the host's
            # external address, with authentication off); SPARK_LOCAL_IP asks otherwise
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                "spark.driver.host", "127.0.0.1"
            )
        # The footprint of a long-running local publisher: Spark's status store keeps up to
        # 1000 SQL executions, 1000 jobs and stages and 100,000 tasks even with the UI off,
        # and every micro-batch adds one of each, so the JVM grew for as long as it ran
        # (docs/benchmarks.md, "Publisher footprint"). A publisher needs none of that
        # history (its progress is its own log): keep 50 of each, 1000 tasks, 50 DAG roots.
        for key, value in (
            ("spark.sql.ui.retainedExecutions", "50"),
            ("spark.ui.retainedJobs", "50"),
            ("spark.ui.retainedStages", "50"),
            ("spark.ui.retainedTasks", "1000"),
            ("spark.ui.dagGraph.retainedRootRDDs", "50"),
            # Python workers: reused (the default, kept explicit: a fresh worker per task
            # re-imports pyarrow + lance, markedly slower per micro-batch). Spark starts one
            # daemon per worker module (6: lookup/create/plan-read/write-into data source,
            # the writer tasks, the streaming sink's commit runner) and forks workers from
            # them; the planners' workers are used once at start and Spark stops idle
            # workers after a minute; the tasks' workers, the largest processes, are bounded
            # by the local master's cores, 2 by default (`--master local[N]` to change).
            # (docs/benchmarks.md, "Publisher footprint")
            ("spark.python.worker.reuse", "true"),
        ):
            builder = builder.config(key, value)
        if "PYSPARK_GATEWAY_PORT" not in os.environ:  # the JVM is started here: its log
            options = _spark_log(checkpoint)
            if (chosen or "").startswith("local"):
                options = f"{options} {LOCAL_JVM_OPTIONS}"
                # the writer tasks' workers fork warm (lance_cdf/spark/sink/warm_daemon.py): Spark
                # starts them in the first micro-batch with data and again after any minute
                # without one, and fresh workers' imports made those micro-batches' commits
                # seconds slower than steady ones; warm workers halve that at start and cut
                # it after a quiet minute, for more memory idle and less under load (the
                # workers share the preloaded pages; docs/benchmarks.md, "A whole
                # database"). Spark 4.3 uses this module for
                # the task workers only (pyspark.worker). One given in PYSPARK_SUBMIT_ARGS
                # wins (`--conf spark.python.daemon.module=pyspark.daemon`: cold workers).
                # A database's publisher only: one table's publisher, whose workers a
                # commit a second keeps warm, has a 1.5 GB footprint target the idle
                # daemon's memory would move away from (not measured for it).
                submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
                if database is not None and "spark.python.daemon.module" not in submit_args:
                    builder = builder.config(
                        "spark.python.daemon.module", "lance_cdf.spark.sink.warm_daemon"
                    )
            builder = builder.config("spark.driver.extraJavaOptions", options)
    return builder, chosen


def _publish(
    stopping: threading.Event,
    table: str,
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    checkpoint: str,
    starting_version: str | None,
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
    transaction_options: dict[str, str],
    lease: Lease | None = None,
    database: Database | None = None,
) -> int:
    started = time.monotonic()
    stages: dict[str, float] = {}
    source_options, sink_options = _stream_options(
        table,
        bootstrap_servers,
        topic,
        schema_registry,
        checkpoint,
        starting_version,
        key,
        tombstones,
        producer_config,
        registry_config,
        storage_options,
        max_rows_per_trigger,
        snapshot,
        drop_unchanged_updates,
        exactly_once,
        table_name,
    )
    if database is not None:
        _database_options(database, source_options, sink_options, checkpoint)
    else:
        _check_checkpoint(checkpoint, source_options, storage_options)
    sink_options.update(transaction_options)
    early = None
    if exactly_once and head_start:
        from lance_cdf.spark.publish.headstart import start_offset

        early = start_offset(checkpoint, starting_version, snapshot)

    def checks() -> int:
        t = time.monotonic()
        check_broker(bootstrap_servers, producer_config)
        check_registry(schema_registry, registry_config)
        # each table's topic is made on first use (spark/sink/database_sink.py)
        if database is not None:
            stages["checks"] = time.monotonic() - t
            return writers or 2
        from lance_cdf.kafka.topics import KNOWN
        from lance_cdf.kafka.transactions import OTHER_TOPIC, default_topic

        connection = KafkaConnection(bootstrap_servers, producer_config)
        settings = TopicSettings.from_options(transaction_options)
        partitions = KNOWN.ensure(connection, topic, settings)
        if transaction_options["transactionMetadata"] == "true":  # before any record: a
            # replicator finding records finds the topic that completes their versions
            txn = transaction_options.get("transaction.topic") or default_topic(topic)
            KNOWN.ensure(
                connection, txn, settings.for_transactions(), one_partition=True, other=OTHER_TOPIC
            )
        stages["checks"] = time.monotonic() - t
        return partitions

    def after_checks() -> int:
        partitions = checked.result()
        if early is not None and not stopping.is_set():
            _head_start(source_options, sink_options, partitions, early, stages)
        return partitions

    # The broker, registry and topic checks end before the JVM starts (a refused client is
    # named in seconds; if they hang, the JVM starts after 12 s and a failed check
    # still stops publish before any query). The head start (spark/publish/headstart.py) and the
    # imports run beside the JVM's start: the query starts once the head start has ended.
    pool = ThreadPoolExecutor(3, thread_name_prefix="lance-cdf-start")
    checked = pool.submit(checks)
    pending = pool.submit(after_checks)
    pool.submit(_warm_imports)  # the modules register() needs, loaded while the JVM starts
    pool.shutdown(wait=False)
    first_failure(checked, stopping)
    from pyspark.sql import SparkSession

    own_session = SparkSession.getActiveSession() is None
    builder, chosen = _session_builder(own_session, master, topic, checkpoint, database)
    t = time.monotonic()
    # SparkContext installs its own SIGINT handler (cancel all jobs, raise
    # KeyboardInterrupt inside a py4j call): the caller's is put back
    with _jvm_ignores_sigterm(), _signal_handlers_kept(), _python_for_spark():
        spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if own_session:
        _quiet_accumulators(spark)
    stages["Spark session"] = time.monotonic() - t
    try:
        partitions = pending.result()
    except BaseException:
        if own_session:
            spark.stop()
        raise
    from lance_cdf.spark.sink import kafka_sink as spark_sink
    from lance_cdf.spark.source import register

    register(spark)
    spark_sink.register(spark)
    tasks = min(partitions, writers or spark.sparkContext.defaultParallelism)
    if database is not None:  # new topics get as many partitions as there are writers
        tasks = writers or spark.sparkContext.defaultParallelism
        partitions = tasks
        sink_options.setdefault("topic.partitions", str(partitions))
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
    shown = f"{redact_url(table)} -> {topic}"
    if database is not None:
        shown = f"the tables of {redact_url(database.uri)} -> {database.topic('<table>')}"
    print(
        f"publishing {shown} on {redact_url(bootstrap_servers)} with "
        f"{tasks} writer(s) over {partitions} partition(s) (checkpoint "
        f"{redact_url(checkpoint)}; producer settings "
        f"{redact(producer_config)}; start-up {time.monotonic() - started:.1f} s: {took})",
        flush=True,
    )
    follower = _serve_metrics(
        query, table, topic, storage_options, metrics_port, metrics_host, checkpoint, database
    )

    trim = own_session and (chosen or "").startswith("local")  # planner daemons to stop
    error = _await(query, spark, stopping, lease, trim)
    if follower is not None:
        follower.stop()
        if error is not None:
            follower.failed()
    if own_session:
        _quiet_stop(spark)
    if error is not None:
        raise LanceCdfError(_one_line(error, checkpoint)) from None
    return 0


def _await(
    query: StreamingQuery,
    spark: SparkSession,
    stopping: threading.Event,
    lease: Lease | None,
    trim: bool,
) -> BaseException | None:
    """Run until `stopping` is set or the query ends; the query's failure, if any (a stop
    is none). `trim`: stop Spark's planner daemons once the query has run."""
    error: BaseException | None = None
    try:
        # pyspark annotates the timeout as int but takes seconds as a float (int(t * 1000))
        while not stopping.is_set() and not query.awaitTermination(0.5):  # type: ignore[arg-type]
            if trim and query.lastProgress is not None:  # the query has planned and run
                trim = False
                _stop_planner_daemons(spark)
            if lease is not None:
                lease.check()  # LeaseLostError: another publisher took the checkpoint over
    except LeaseLostError as exc:
        query.stop()  # the micro-batch in hand is not committed; the new holder sends it
        error = exc
    except Exception as exc:  # the query failed: Spark raises StreamingQueryException
        error = exc
    if stopping.is_set():
        # Stopping interrupts the running micro-batch: it is not committed, so the next
        # start sends it again from the checkpoint (see README, "When things fail"). A
        # failure while stopping (the signal reached Spark's Python workers too) is the stop.
        query.stop()
        error = None
    else:
        error = error or query.exception()
    return error


# a lance-cdf error as a Python worker's traceback names it, inside Spark's exception text
_OURS = re.compile(r"lance_cdf\.errors\.(\w+): ([^\n]+)")


def _one_line(error: BaseException, checkpoint: str) -> str:
    """A failed query's cause in one line (the message of the lance-cdf error inside Spark's
    exception, else its first line), and where the whole text went: a log file beside the
    checkpoint's (`<checkpoint>/lance-cdf-publish.log`, local ones; else a temporary file)."""
    text = str(error)
    ours = _OURS.findall(text)
    cause = ours[-1][1].strip() if ours else (text.strip().splitlines() or ["(no message)"])[0]
    log_path = _log_file(checkpoint)
    try:
        with open(log_path, "a") as f:
            f.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC: the publishing "
                f"query failed:\n{text}\n\n"
            )
    except OSError:
        return cause
    return f"{cause} (details: {log_path})"


# The JVM of a local publisher, smaller (the figures: docs/benchmarks.md, "Publisher
# footprint"). With the JVM's defaults most of its memory is a heap G1 keeps at the size it
# grew to (far above what is live), metaspace, G1's own structures and JIT code. The serial
# collector (no G1 structures; its pauses on a heap this size are milliseconds) and the
# client compiler only (C1: less code, no C2 compiler arenas) take a good part of that off.
# A publisher's JVM moves bytes between the Python processes: C2's peak speed buys it
# nothing measurable at a commit a second (the latency figures in docs/benchmarks.md are
# with these options; a large backfill's throughput with C1 only was not measured).
# -Xms64m: the initial heap is otherwise 1/64 of the host's memory, and every page the
# collector touches in it stays resident: the JVM grew toward that size; from 64 MB the
# heap grows to what is live. The heap limit (Spark's driver memory, 1 GB by default) is
# unchanged: a large snapshot batch still fits.
# -Xmn16m: the young generation at 16 MB instead of a third of the heap (the serial
# collector's default), every page of which the collector cycles through and keeps
# resident: a smaller JVM for more, shorter young collections (about one per micro-batch
# at a commit a second) and no more full ones. The old generation still grows
# to the heap limit: a large micro-batch's objects are promoted there, not refused.
LOCAL_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xms64m -Xmn16m"

# The Python data-source planners Spark runs in the driver when the query starts (look the
# source up, create it, plan the read): each gets its own pyspark.daemon that stays for the
# life of the application (their workers Spark stops after a minute idle); a running query
# does not use them again (docs/benchmarks.md, "Publisher footprint"). (The
# writer-creating module, write_into_data_source, runs at every micro-batch: kept.)
_PLANNER_MODULES = frozenset(
    {
        "pyspark.sql.worker.lookup_data_sources",
        "pyspark.sql.worker.create_data_source",
        "pyspark.sql.worker.plan_data_source_read",
    }
)


def _stop_planner_daemons(spark: SparkSession) -> int:
    """Stop the planners' Python daemons (and workers) once the query runs (3 processes of a
    local publisher); the number stopped. Spark keeps one worker factory per worker
    module in the private `SparkEnv.pythonWorkers` map and offers no call to stop one:
    this removes the planners' factories and stops them, so a later planning (a restarted
    query) starts a fresh daemon as on the first. Best effort: on a Spark without that map
    nothing is stopped (a debug log line)."""
    try:
        # no method of SparkEnv is called through py4j: its reflection of SparkEnv's
        # methods fails (a signature names a protobuf class Spark does not ship)
        jvm = spark._jvm
        env = spark.sparkContext._jsc.sc().env()
        field = jvm.java.lang.Class.forName("org.apache.spark.SparkEnv").getDeclaredField(  # type: ignore[union-attr]
            "pythonWorkers"
        )
        field.setAccessible(True)
        workers = field.get(env)
        keys = []
        it = workers.keysIterator()
        while it.hasNext():
            keys.append(it.next())
        stopped = 0
        for key in keys:
            if str(key.workerModule()) in _PLANNER_MODULES:
                factory = workers.remove(key)
                if factory.isDefined():
                    factory.get().stop()
                    stopped += 1
        return stopped
    except Exception as exc:  # py4j errors: a Spark whose internals differ
        import logging

        logging.getLogger("lance_cdf.kafka").debug("planner daemons not stopped: %s", exc)
        return 0


def _spark_log(checkpoint: str) -> str:
    """The JVM option that sends Spark's own log (its ERROR lines carry Java and Python
    tracebacks) to publish's log file instead of the terminal."""
    log_path = _log_file(checkpoint)
    config = os.path.join(os.path.dirname(log_path), "lance-cdf-log4j2.properties")
    with open(config, "w") as f:
        f.write(
            "rootLogger.level = warn\nrootLogger.appenderRef.file.ref = file\n"
            "appender.file.type = File\nappender.file.name = file\n"
            f"appender.file.fileName = {log_path}\nappender.file.append = true\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = %d{yyyy-MM-dd HH:mm:ss} %p %c{1}: %m%n%ex\n"
        )
    return f"-Dlog4j2.configurationFile=file:{config}"


def _log_file(checkpoint: str) -> str:
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        import tempfile

        return os.path.join(tempfile.gettempdir(), f"lance-cdf-publish-{os.getpid()}.log")
    root = checkpoint.removeprefix("file://")
    os.makedirs(root, exist_ok=True)
    return os.path.join(root, "lance-cdf-publish.log")


def _stream_options(
    table: str,
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    checkpoint: str,
    starting_version: str | None,
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
    # entryPoint: the source's error advice names publish's flags (spark/source/advice.py)
    source_options = {"path": table, "entryPoint": "publish"}
    if snapshot or starting_version is not None:  # else the stream's default, latest
        source_options["startingVersion"] = "snapshot" if snapshot else str(starting_version)
    if drop_unchanged_updates:
        source_options["dropUnchangedUpdates"] = "true"
    if max_rows_per_trigger:
        source_options["maxRowsPerTrigger"] = str(max_rows_per_trigger)
    source_options["keyHash"] = key or "_rowid"
    sink_options = {
        "kafka.bootstrap.servers": bootstrap_servers,
        "topic": topic,
        "schema.registry.url": schema_registry,
        "table": table,
        "tombstones": str(tombstones).lower(),
        "checkpointLocation": checkpoint,
        "exactlyOnce": str(exactly_once).lower(),
    }
    if key:
        sink_options["key"] = key
    if table_name:
        sink_options["table.name"] = table_name
    sink_options.update({f"kafka.{k}": v for k, v in producer_config.items()})
    sink_options.update({f"registry.{k}": v for k, v in (registry_config or {}).items()})
    for k, v in (storage_options or {}).items():
        source_options[f"storage.{k}"] = sink_options[f"storage.{k}"] = v
    return source_options, sink_options


def report_path(checkpoint: str) -> str | None:
    """Where a database publisher's stream lists the tables it follows and skips (a local
    checkpoint's `database-tables.json`; None on object storage)."""
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return None
    return os.path.join(checkpoint.removeprefix("file://"), "database-tables.json")


def _database_options(
    database: Database,
    source_options: dict[str, str],
    sink_options: dict[str, str],
    checkpoint: str,
) -> None:
    """The source and sink options of a database publisher (spark/source/database_stream.py,
    spark/sink/database_sink.py) in place of a table's."""
    del source_options["path"]
    source_options["database"] = database.uri
    for key, value in (
        ("include", database.include),
        ("exclude", database.exclude),
        ("report", report_path(checkpoint)),
    ):
        if value:
            source_options[key] = value
    for key in ("table", "topic", "table.name"):
        sink_options.pop(key, None)
    sink_options["database"] = database.uri
    sink_options["topic.prefix"] = database.topic_prefix


def _check_checkpoint(
    checkpoint: str, source_options: dict[str, str], storage_options: dict[str, str] | None
) -> None:
    """Before anything starts: a local checkpoint that has delivered something is of this
    table, and `--starting-version` / `--snapshot`, if given, is the start it was made with
    (the query checks the same when it starts: spark/source/identity.py)."""
    from lance_cdf.spark.source.checkpoint import committed_offset

    try:
        offset = committed_offset(checkpoint)
    except (LanceCdfError, OSError):
        return  # remote or not lance-cdf's: the query checks (or refuses) it
    if offset is None:
        return
    from lance_cdf.core.feed import ChangeFeed
    from lance_cdf.spark.source.advice import PUBLISH
    from lance_cdf.spark.source.identity import check_offset

    table = source_options["path"]
    given = source_options.get("startingVersion")
    feed = ChangeFeed(table, storage_options or {}, check_latest=False)
    check_offset(offset, feed, table, given, PUBLISH, f"checkpoint {checkpoint}")


def _head_start(
    source_options: dict[str, str],
    sink_options: dict[str, str],
    partitions: int,
    start: dict[str, Any],
    stages: dict[str, float],
) -> None:
    """Publish the commits waiting at `start` from this process (spark/publish/headstart.py); a
    failure is reported and left to the query, which skips whatever was acknowledged."""
    from lance_cdf.spark.publish.headstart import head_start

    t = time.monotonic()
    try:
        done = head_start(
            {**source_options, "kafkaPartitions": str(partitions)}, sink_options, start
        )
    except Exception as exc:  # noqa: BLE001 (the query reads and publishes them again)
        if isinstance(exc, LanceCdfError) and not isinstance(exc, PublishError):
            raise  # the table's or the checkpoint's: the query would stop the same way
        print(
            f"head start skipped ({type(exc).__name__}: {scrub(str(exc))}); the query publishes "
            "those commits",
            flush=True,
        )
        return
    finally:
        stages["head start"] = time.monotonic() - t
    if done is not None:
        print(done, flush=True)


def _warm_imports() -> None:
    """Import what the driver needs after the session starts (the source, its SQL function
    and the sink's classes: about a second of CPU; docs/benchmarks.md, "Inside the publisher"),
    in a thread while the main thread waits for the
    JVM. An import error here is raised again, in the main thread, where it is used."""
    try:
        import lance_cdf.spark.sink.kafka_sink  # noqa: F401
        import lance_cdf.spark.source.data_source  # noqa: F401
        import lance_cdf.spark.source.table_changes  # noqa: F401
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
    checkpoint: str,
    database: Database | None = None,
) -> QueryFollower | None:
    """Follow the query's progress and serve it as Prometheus metrics (None: no port); a
    database publisher's per followed table (`database_tables`)."""
    if port is None:
        return None
    from lance_cdf.ops.metrics import PipelineMetrics
    from lance_cdf.spark.publish.query_progress import QueryFollower

    follower = QueryFollower(query, checkpoint=checkpoint).start()
    if database is not None:
        metrics = PipelineMetrics(
            "publish",
            follower.progress,
            None,
            storage_options,
            database.topic("*"),
            tables=lambda: database_tables(checkpoint),
        )
        print(f"metrics at {metrics.serve(port, host)}", flush=True)
        return follower
    metrics = PipelineMetrics("publish", follower.progress, table, storage_options, topic)
    print(f"metrics at {metrics.serve(port, host)}", flush=True)
    return follower


def database_tables(checkpoint: str) -> dict[str, tuple[str, int | None]]:
    """A database publisher's followed tables (its stream's report) and the version each
    is published through (the checkpoint's last committed offsets): name -> (URI, version)."""
    from lance_cdf.spark.source.checkpoint import committed_tables
    from lance_cdf.spark.source.database_stream import read_report

    path = report_path(checkpoint)
    followed = ((read_report(path) if path else None) or {}).get("followed") or {}
    try:
        delivered = committed_tables(checkpoint) or {}
    except (LanceCdfError, OSError):
        delivered = {}
    return {str(n): (str(uri), delivered.get(n)) for n, uri in followed.items()}
