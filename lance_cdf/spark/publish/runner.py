"""`lance-cdf publish`: run the lance-cdf stream into Kafka on a local Spark session."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lance_cdf.core.stream_columns import KEY_HASH, PARTITION_COLUMN
from lance_cdf.errors import LanceCdfError, LeaseLostError, PublishError, in_words
from lance_cdf.kafka.endpoints import check_broker, check_registry, first_failure
from lance_cdf.kafka.outage import FLUSH_TIMEOUT_S
from lance_cdf.ops.clientconfig import KafkaConnection, redact, redact_url, scrub
from lance_cdf.spark.publish.settings import Database, PublishSettings
from lance_cdf.spark.sink.sink_options import SinkOptions, key_columns
from lance_cdf.spark.source.checkpoint import drop_unfinished_writes, read_report, report_path
from lance_cdf.spark.source.handover import HandOver

if TYPE_CHECKING:  # pyspark is imported once the checks are under way (see _publish)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from lance_cdf.ops.lease import Lease
    from lance_cdf.spark.publish.headstart import Continued
    from lance_cdf.spark.publish.query_progress import QueryFollower
from lance_cdf.spark.publish.spark_driver import (
    import_pyspark,
    jvm_ignores_sigterm,
    keep_workers_warm,
    log_file,
    python_for_spark,
    quiet_accumulators,
    quiet_stop,
    session_builder,
    signal_handlers_kept,
    stop_planner_daemons,
    warm_imports,
)


def publish(settings: PublishSettings, stop: threading.Event | None = None) -> int:
    """Stream the changes `settings` name to Kafka until stopped (or, with
    `run.available_now`, until the latest version at start is published): 0 then. A failed
    query raises LanceCdfError naming its cause in one line (Spark's whole text goes to a
    log file beside the checkpoint).

    `stop`: set it (from a signal handler, another thread) to stop publishing: the query is
    stopped between micro-batch checks and publish returns 0. publish installs no signal
    handler itself; `lance-cdf publish` sets `stop` on SIGTERM / SIGINT."""
    # a stop only sets a flag: this thread polls it between short awaitTermination() calls
    # and stops the query itself (a signal handler that called query.stop() would re-enter
    # py4j while this thread is blocked in it)
    stopping = stop if stop is not None else threading.Event()
    lease = None
    try:
        lease = checkpoint_lease(
            settings.checkpoint, settings.shown_topic(), settings.source.storage_options
        )
        return _publish(settings, stopping, lease)
    finally:
        if lease is not None:
            lease.release()


def checkpoint_lease(checkpoint: str, topic: str, storage_options: dict[str, str] | None) -> Lease:
    """One publisher per checkpoint: the lease `<checkpoint>/publisher.lease`
    (`Lease`), taken before anything is read or sent, so a second `publish`
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


def register(spark: SparkSession) -> None:
    """Make `format("lance-cdf")`, the SQL table-valued function `lance_table_changes(path,
    start [, end])` and, where the Kafka extra is installed, `format("lance-cdf-kafka")`
    available in this Spark session (PySpark >= 4.0 finds both data sources without it)."""
    from lance_cdf.spark.source import table_changes
    from lance_cdf.spark.source.data_source import LanceCdfDataSource

    spark.dataSource.register(LanceCdfDataSource)
    table_changes.register(spark)
    try:
        from lance_cdf.spark.sink.kafka_sink import LanceCdfKafkaSink
    except ImportError:  # (lance-cdf[spark] without the Kafka extra: no sink)
        return
    spark.dataSource.register(LanceCdfKafkaSink)


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
    planned observed, for the progress reports (`query_progress.planned_events`): Spark counts
    the work items as its input rows.

    Why work items rather than `route` (a repartition of the events): a Python source's
    events reach a Python writer through Spark's JVM (Arrow -> rows -> shuffle -> Arrow);
    a writer task that reads its own slot's share skips all of it: more throughput, most
    on vectors, and it grows with the workers (docs/benchmarks.md, "Inside the publisher")."""
    from pyspark.sql import functions as F

    from lance_cdf.core.stream_columns import WORK_EVENTS
    from lance_cdf.spark.publish.query_progress import OBSERVED

    return work.observe(OBSERVED, F.sum(WORK_EVENTS).alias("events"))


@dataclass
class _HeadStart:
    """The head start of one publish run: where it starts (None: no head start), the file
    it hands over to the query through (`HandOver`), and its rounds after
    the first, running in a thread until the query takes over or has run two
    micro-batches."""

    start: dict[str, Any] | None
    hand_over: HandOver | None
    continued: Continued | None = None
    first_batch: int | None = None  # the query's first micro-batch seen

    def follow(self, batch_id: int) -> None:
        """The query's latest micro-batch: the head start ends once the query has run two
        (by then Spark has started the query's Python processes, and the query publishes a
        commit as soon as the head start would)."""
        if self.continued is None:
            return
        if self.first_batch is None:
            self.first_batch = batch_id
        elif batch_id > self.first_batch:
            self.continued.stop.set()  # (after the round in progress; joined at the end)

    def end(self) -> None:
        """At publish's end: the rounds stopped (if the query never took over) and the
        hand-over file removed."""
        if self.continued is not None:
            self.continued.end()
        if self.hand_over is not None:
            self.hand_over.remove()


def _publish(settings: PublishSettings, stopping: threading.Event, lease: Lease | None) -> int:
    # the checkpoint is this publisher's now (the lease): a killed one's unfinished writes go
    for name in drop_unfinished_writes(settings.checkpoint):
        print(f"removed {name}, left in the checkpoint by a publisher that was killed", flush=True)
    source_options, sink_options = _query_options(settings)
    early = _head_start_offset(settings) if settings.head_start else None
    head = _HeadStart(early, HandOver.create() if early is not None else None)
    try:
        return _run(settings, stopping, lease, source_options, sink_options, head)
    finally:
        head.end()


def _run(
    settings: PublishSettings,
    stopping: threading.Event,
    lease: Lease | None,
    source_options: dict[str, str],
    sink_options: SinkOptions,
    head: _HeadStart,
) -> int:
    started = time.monotonic()
    stages: dict[str, float] = {}
    pending = _begin(settings, source_options, sink_options, stopping, stages, head)
    spark, own_session, chosen = _start_session(settings, stages)
    try:
        partitions = pending.result()
    except BaseException:
        if own_session:
            spark.stop()
        raise
    query, tasks, partitions = _start_query(
        spark, settings, source_options, sink_options, partitions, stopping, stages, head
    )
    if query is None:  # stopped during start-up: nothing was started
        if own_session:
            spark.stop()
        return 0
    _announce(settings, tasks, partitions, started, stages)
    follower = _serve_metrics(query, settings)

    local = own_session and (chosen or "").startswith("local")
    # a local session's planner daemons to stop, its workers to keep
    warm = local and settings.run.warm_workers
    error = _await(query, spark, stopping, lease, local, warm, settings, head)
    if follower is not None:
        follower.stop()
        if error is not None:
            follower.failed()
    if own_session:
        quiet_stop(spark)
    if error is not None:
        raise LanceCdfError(_one_line(error, settings.checkpoint)) from None
    return 0


def _query_options(settings: PublishSettings) -> tuple[dict[str, str], SinkOptions]:
    """The source's and the sink's options, a table's or a database's (a table's checkpoint
    checked against them first)."""
    source_options, sink_options = _stream_options(settings)
    if settings.database is not None:
        sink_options = _database_options(
            settings.database, source_options, sink_options, settings.checkpoint
        )
    else:
        _check_checkpoint(settings.checkpoint, source_options, settings.source.storage_options)
    return source_options, sink_options


def _begin(
    settings: PublishSettings,
    source_options: dict[str, str],
    sink_options: SinkOptions,
    stopping: threading.Event,
    stages: dict[str, float],
    head: _HeadStart,
) -> Future[int]:
    """Start the broker, registry and topic checks, then the head start, and the imports, in
    threads; the number of partitions of the topic once the head start's first round has
    ended.

    The checks end before the JVM starts (a refused client is named in seconds; if they
    hang, the JVM starts after 12 s and a failed check still stops publish before any
    query). The head start (`_head_start`) and the imports run beside the JVM's
    start: the query starts once the head start's first round (the commits waiting at
    launch) has ended, and its later rounds (the commits made since) go on until the query
    takes over (`_HeadStart`)."""
    from lance_cdf.spark.publish.query_progress import interval_seconds

    # the head start looks at the table as often as the query's trigger does
    poll_s = interval_seconds(settings.trigger_interval) or 0.5

    def after_checks() -> int:
        partitions = checked.result()
        import_pyspark()
        if head.start is not None and not stopping.is_set():
            _head_start(source_options, sink_options, partitions, head, stages, poll_s)
        return partitions

    pool = ThreadPoolExecutor(3, thread_name_prefix="lance-cdf-start")
    checked = pool.submit(_checks, settings, stages)
    pending = pool.submit(after_checks)
    pool.submit(warm_imports)  # the modules register() needs, loaded while the JVM starts
    pool.shutdown(wait=False)
    first_failure(checked, stopping)
    return pending


def _checks(settings: PublishSettings, stages: dict[str, float]) -> int:
    """The broker and the registry answer, and the topic (and its transaction topic) exist:
    the topic's number of partitions (a database's: the writers, each table's topic is made
    on first use, `database_sink.table_topic`)."""
    t = time.monotonic()
    target = settings.target
    check_broker(target.bootstrap_servers, target.producer_config)
    check_registry(target.schema_registry, target.registry_config)
    if settings.database is not None:
        stages["checks"] = time.monotonic() - t
        return settings.run.writers or 2
    from lance_cdf.kafka.topics import KNOWN
    from lance_cdf.kafka.transactions import OTHER_TOPIC, default_topic

    connection = KafkaConnection(target.bootstrap_servers, target.producer_config)
    partitions = KNOWN.ensure(connection, target.topic, target.topics)
    if target.transaction_metadata:  # before any record: a replicator finding records
        # finds the topic that completes their versions
        txn = target.transaction_topic or default_topic(target.topic)
        KNOWN.ensure(
            connection, txn, target.topics.for_transactions(), one_partition=True, other=OTHER_TOPIC
        )
    stages["checks"] = time.monotonic() - t
    return partitions


def _start_session(
    settings: PublishSettings, stages: dict[str, float]
) -> tuple[SparkSession, bool, str | None]:
    """The Spark session (started, or the active one), whether publish owns it, and the
    master publish set (None: spark-submit's or the active session's)."""
    import_pyspark()  # (through the lock the start-up threads take: see spark_driver)
    from pyspark.sql import SparkSession

    own_session = SparkSession.getActiveSession() is None
    builder, chosen = session_builder(own_session, settings)
    t = time.monotonic()
    # SparkContext installs its own SIGINT handler (cancel all jobs, raise
    # KeyboardInterrupt inside a py4j call): the caller's is put back
    with jvm_ignores_sigterm(), signal_handlers_kept(), python_for_spark():
        spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if own_session:
        quiet_accumulators(spark)
    stages["Spark session"] = time.monotonic() - t
    return spark, own_session, chosen


def _start_query(
    spark: SparkSession,
    settings: PublishSettings,
    source_options: dict[str, str],
    sink_options: SinkOptions,
    partitions: int,
    stopping: threading.Event,
    stages: dict[str, float],
    head: _HeadStart,
) -> tuple[StreamingQuery | None, int, int]:
    """The streaming query started (None: stopped during start-up, nothing started), its
    writer tasks and the partitions they share."""
    register(spark)
    writers = settings.run.writers
    tasks = min(partitions, writers or spark.sparkContext.defaultParallelism)
    if settings.database is not None:  # new topics get as many partitions as there are writers
        tasks = writers or spark.sparkContext.defaultParallelism
        partitions = tasks
        sink_options = _with_partitions(sink_options, partitions)
    reader = spark.readStream.format("lance-cdf").options(**source_options)
    reader = reader.option("writerSlots", tasks).option("kafkaPartitions", partitions)
    hand_over = head.hand_over.path if head.continued and head.hand_over else None
    # who takes over from the head start (`HandOver`): on a local master a
    # writer task with a version it has not published, on this machine; elsewhere the
    # reader's first plan, in the driver
    local = (spark.sparkContext.master or "").startswith("local")
    if hand_over is not None and not local:
        reader = reader.option("handOver", hand_over)
    t = time.monotonic()
    changes = hand_off(reader.load())  # load(): the schema
    stages["source schema"] = time.monotonic() - t
    writer = changes.writeStream.format("lance-cdf-kafka").options(**sink_options.to_options())
    if hand_over is not None and local:
        writer = writer.option("handOver", hand_over)
    if settings.run.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=settings.trigger_interval)
    if stopping.is_set():
        return None, tasks, partitions
    t = time.monotonic()
    query = writer.start()
    stages["query start"] = time.monotonic() - t
    return query, tasks, partitions


def _announce(
    settings: PublishSettings, tasks: int, partitions: int, started: float, stages: dict[str, float]
) -> None:
    """The line saying what publishes where, and how long each start-up stage took."""
    target, database = settings.target, settings.database
    took = ", ".join(f"{k} {v:.1f} s" for k, v in stages.items())
    shown = f"{redact_url(settings.source.table)} -> {target.topic}"
    if database is not None:
        shown = f"the tables of {redact_url(database.uri)} -> {database.topic('<table>')}"
    print(
        f"publishing {shown} on {redact_url(target.bootstrap_servers)} with "
        f"{tasks} writer(s) over {partitions} partition(s) (checkpoint "
        f"{redact_url(settings.checkpoint)}; producer settings "
        f"{redact(target.producer_config)}; start-up {time.monotonic() - started:.1f} s: {took})",
        flush=True,
    )


# how often a waiting local publisher marks its Python workers as used: well inside Spark's
# minute of idleness after which it stops them (its monitor looks every 10 s)
WARM_EVERY_S = 20.0


def _await(
    query: StreamingQuery,
    spark: SparkSession,
    stopping: threading.Event,
    lease: Lease | None,
    trim: bool,
    warm: bool,
    settings: PublishSettings,
    head: _HeadStart,
) -> BaseException | None:
    """Run until `stopping` is set or the query ends; the query's failure, if any (a stop
    is none). `trim`: stop Spark's planner daemons once the query has run. `warm`: keep the
    Python workers from Spark's idle timeout (marked every WARM_EVERY_S seconds). `head`:
    told of the query's micro-batches (its rounds end after the query's second)."""
    error: BaseException | None = None
    marked = time.monotonic()
    try:
        # pyspark annotates the timeout as int but takes seconds as a float (int(t * 1000))
        while not stopping.is_set() and not query.awaitTermination(0.5):  # type: ignore[arg-type]
            progress = query.lastProgress
            if progress is not None:
                head.follow(progress.batchId)
            if trim and progress is not None:  # the query has planned and run
                trim = False
                stop_planner_daemons(spark)
            if warm and not trim and time.monotonic() - marked >= WARM_EVERY_S:
                marked = time.monotonic()
                keep_workers_warm(spark)
            if lease is not None:
                lease.check()  # LeaseLostError: another publisher took the checkpoint over
    except LeaseLostError as exc:
        query.stop()  # the micro-batch in hand is not committed; the new holder sends it
        error = exc
    except Exception as exc:  # the query failed: Spark raises StreamingQueryException
        error = exc
    if stopping.is_set():
        # The running micro-batch is let finish first (its records and their versions'
        # END: a whole-version replicator can apply them), up to `stop_timeout_s`; one
        # still running then is interrupted, not committed, and the next start sends it
        # again from the checkpoint (docs/guides/operating.md, "When things fail"). A failure while
        # stopping (the signal reached Spark's Python workers too) is the stop.
        if error is None:
            _finish_running(query, settings)
        query.stop()
        error = None
    else:
        error = error or query.exception()
    return error


def _finish_running(query: StreamingQuery, settings: PublishSettings) -> None:
    """On a stop: wait for the running micro-batch to commit (`finish_micro_batch`), saying so
    if it does not within the run's `stop_timeout_s`."""
    from lance_cdf.spark.publish.query_progress import finish_micro_batch, interval_seconds

    limit = settings.run.stop_timeout_s
    interval = None if settings.run.available_now else interval_seconds(settings.trigger_interval)
    try:
        finished = finish_micro_batch(query, limit, interval)
    except Exception:  # noqa: BLE001 (the query failed or ended meanwhile: stopped below)
        return
    if not finished:
        print(
            f"stopping: the running micro-batch did not finish within {limit:g} s "
            "(--stop-timeout) and is interrupted; its versions may be in the topic without "
            "their END until publish runs again, which completes them",
            flush=True,
        )


# a lance-cdf error as a Python worker's traceback names it, inside Spark's exception text
_OURS = re.compile(r"lance_cdf\.errors\.(\w+): ([^\n]+)")
# lance-cdf errors (by class name) whose message says what happened but not what to do,
# which is publish's to say: the same error ends a head start, which the query rides out
# (`_said`), and reaches a user of the sink outside publish, who restarts their own query
_FIXES = {
    "KafkaUnavailableError": "nothing is lost: rerun lance-cdf publish (same --checkpoint) "
    "once the broker is back",
}


def _one_line(error: BaseException, checkpoint: str) -> str:
    """A failed query's cause in one line (the message of the lance-cdf error inside Spark's
    exception, and its fix where publish names it (`_FIXES`), else the exception's first
    line), and where the whole text went: a log file beside the checkpoint's
    (`<checkpoint>/lance-cdf-publish.log`, local ones; else a temporary file)."""
    text = str(error)
    ours = _OURS.findall(text)
    if ours:
        name, message = ours[-1]
        fix = _FIXES.get(name)
        cause = f"{message.strip()}; {fix}" if fix else message.strip()
    else:
        cause = (text.strip().splitlines() or ["(no message)"])[0]
    log_path = log_file(checkpoint)
    try:
        with open(log_path, "a") as f:
            f.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC: the publishing "
                f"query failed:\n{text}\n\n"
            )
    except OSError:
        return cause
    return f"{cause} (details: {log_path})"


def _stream_options(settings: PublishSettings) -> tuple[dict[str, str], SinkOptions]:
    """The options of the `lance-cdf` source and of the `lance-cdf-kafka` sink (the query's
    and the head start's)."""
    source, target = settings.source, settings.target
    # entryPoint: the source's error advice names publish's flags (`advice_for`)
    source_options = {"path": source.table, "entryPoint": "publish"}
    if source.snapshot or source.starting_version is not None:  # else the default, latest
        start = "snapshot" if source.snapshot else str(source.starting_version)
        source_options["startingVersion"] = start
    if source.drop_unchanged_updates:
        source_options["dropUnchangedUpdates"] = "true"
    if source.max_rows_per_trigger:
        source_options["maxRowsPerTrigger"] = str(source.max_rows_per_trigger)
    source_options["keyHash"] = target.key or "_rowid"
    for k, v in source.storage_options.items():
        source_options[f"storage.{k}"] = v
    return source_options, _sink_options(settings)


def _sink_options(settings: PublishSettings) -> SinkOptions:
    """The `lance-cdf-kafka` sink's options for a table (`_database_options`: a database)."""
    target = settings.target
    return SinkOptions(
        bootstrap_servers=target.bootstrap_servers,
        registry_url=target.schema_registry,
        table=settings.source.table,
        topic=target.topic,
        table_name=target.table_name or None,
        key=key_columns(target.key),
        tombstones=target.tombstones,
        exactly_once=target.exactly_once,
        transaction_metadata=target.transaction_metadata,
        table_definitions=target.table_definitions,
        transaction_topic=target.transaction_topic or None,
        topics=target.topics,
        flush_timeout_s=target.flush_timeout or FLUSH_TIMEOUT_S,
        checkpoint=settings.checkpoint,
        producer=tuple(sorted(target.producer_config.items())),
        registry=tuple(sorted(target.registry_config.items())),
        storage=tuple(sorted(settings.source.storage_options.items())),
    )


def _with_partitions(sink_options: SinkOptions, partitions: int) -> SinkOptions:
    """A database sink's options with new topics made of `partitions` partitions, unless
    the user gave a count."""
    if sink_options.topics.partitions is not None:
        return sink_options
    return replace(sink_options, topics=replace(sink_options.topics, partitions=partitions))


def _database_options(
    database: Database,
    source_options: dict[str, str],
    sink_options: SinkOptions,
    checkpoint: str,
) -> SinkOptions:
    """The source options of a database publisher (`DatabaseOptions`) in place of a
    table's (changed in place), and its sink options (`SinkOptions.database`)."""
    del source_options["path"]
    source_options["database"] = database.uri
    for key, value in (
        ("include", database.include),
        ("exclude", database.exclude),
        ("report", report_path(checkpoint)),
    ):
        if value:
            source_options[key] = value
    if database.idle_poll_max is not None:
        source_options["idlePollMax"] = f"{database.idle_poll_max:g}"
    if database.commit_events:
        source_options["commitEvents"] = database.commit_events
    if database.events_poll_max is not None:
        source_options["commitEventsPollMax"] = f"{database.events_poll_max:g}"
    return replace(
        sink_options,
        table=None,
        topic=None,
        table_name=None,
        database=database.uri,
        topic_prefix=database.topic_prefix,
    )


def _check_checkpoint(
    checkpoint: str, source_options: dict[str, str], storage_options: dict[str, str] | None
) -> None:
    """Before anything starts: a local checkpoint that has delivered something is of this
    table, and `--starting-version` / `--snapshot`, if given, is the start it was made with
    (the query checks the same when it starts: `identity.check_offset`)."""
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


def _head_start_offset(settings: PublishSettings) -> dict[str, Any] | None:
    """Where the query will start, if that is known before it starts (the head start's
    start), else None."""
    source = settings.source
    if settings.database is not None:
        from lance_cdf.spark.publish.database_headstart import database_start_offset

        starting = "snapshot" if source.snapshot else source.starting_version
        return database_start_offset(settings.checkpoint, starting)
    from lance_cdf.spark.publish.headstart import start_offset

    return start_offset(settings.checkpoint, source.starting_version, source.snapshot)


def _head_start(
    source_options: dict[str, str],
    sink_options: SinkOptions,
    partitions: int,
    head: _HeadStart,
    stages: dict[str, float],
    poll_s: float,
) -> None:
    """The head start's first round: publish the commits waiting at `head.start` from this
    process (`TableRounds`, `DatabaseRounds`); then its later rounds in a
    thread (`head.continued`) until the query takes over or has run two micro-batches. A
    failure is reported and left to the query, which skips whatever was acknowledged."""
    from lance_cdf.spark.publish.database_headstart import DatabaseRounds
    from lance_cdf.spark.publish.headstart import Continued, TableRounds

    assert head.start is not None
    t = time.monotonic()
    source = {**source_options, "kafkaPartitions": str(partitions)}
    rounds: TableRounds | DatabaseRounds | None = None
    try:
        if "database" in source_options:  # new topics: a partition per writer, as the query's
            sink = _with_partitions(sink_options, partitions)
            rounds = DatabaseRounds(source, sink, head.start, head.hand_over)
        else:
            rounds = TableRounds(source, sink_options, head.start, head.hand_over)
        going = rounds.round()
    except Exception as exc:  # noqa: BLE001 (the query reads and publishes them again)
        if rounds is not None:
            rounds.close()
        if isinstance(exc, LanceCdfError) and not isinstance(exc, PublishError):
            raise  # the table's or the checkpoint's: the query would stop the same way
        print(f"head start skipped ({_said(exc)}); the query publishes those commits", flush=True)
        return
    finally:
        stages["head start"] = time.monotonic() - t
    done = rounds.result()  # the commits waiting at launch (the later rounds' at their end)
    if done is not None:
        print(done, flush=True)
    if going is None or head.hand_over is None:  # nothing more for it to publish
        rounds.close()
        return
    head.continued = Continued(rounds, poll_s, _said).start()


def _said(exc: BaseException) -> str:
    """Why a head start ended, in one line (a broker that does not answer: for how long and
    why; the query rides the outage out)."""
    return scrub(in_words(exc))


def _serve_metrics(query: StreamingQuery, settings: PublishSettings) -> QueryFollower | None:
    """Follow the query's progress and serve it as Prometheus metrics (None: no port); a
    database publisher's per followed table (`database_tables`)."""
    run, source, database = settings.run, settings.source, settings.database
    if run.metrics_port is None:
        return None
    from lance_cdf.ops.metrics import PipelineMetrics
    from lance_cdf.spark.publish.query_progress import QueryFollower
    from lance_cdf.spark.source.checkpoint import planned_tables

    checkpoint = settings.checkpoint
    follower = QueryFollower(query, checkpoint=checkpoint).start()
    if database is not None:
        metrics = PipelineMetrics(
            "publish",
            follower.progress,
            None,
            source.storage_options,
            database.topic("*"),
            tables=lambda: database_tables(checkpoint),
            seen=lambda: planned_tables(checkpoint) or {},
        )
    else:
        metrics = PipelineMetrics(
            "publish",
            follower.progress,
            source.table,
            source.storage_options,
            settings.target.topic,
        )
    print(f"metrics at {metrics.serve(run.metrics_port, run.metrics_host)}", flush=True)
    return follower


def database_tables(checkpoint: str) -> dict[str, tuple[str, int | None]]:
    """A database publisher's followed tables (its stream's report) and the version each
    is published through (the checkpoint's last committed offsets): name -> (URI, version)."""
    from lance_cdf.spark.source.checkpoint import committed_tables

    path = report_path(checkpoint)
    followed = ((read_report(path) if path else None) or {}).get("followed") or {}
    try:
        delivered = committed_tables(checkpoint) or {}
    except (LanceCdfError, OSError):
        delivered = {}
    return {str(n): (str(uri), delivered.get(n)) for n, uri in followed.items()}
