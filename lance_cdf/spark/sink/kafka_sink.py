"""Spark streaming sink `format("lance-cdf-kafka")`: the lance-cdf stream to Kafka.

Options: `SinkOptions` (parsed once, in `streamWriter`; the Spark options reference's
"Sink options" lists them). Each commit version's BEGIN and END records go to the
transaction topic after every writer task of a micro-batch succeeded (`TransactionWriter`),
with the table's definition where it changed (`table_definitions`); `handOver` is
internal: `lance-cdf publish` on a local master hands over from its head start to the
query's writer tasks through it (`HandOver`).

The topic's schema carries the table's own types, not Spark's: Spark widens what it
cannot hold (uint32 -> long, fixed_size_list -> list, fixed_size_binary -> binary, see
`spark.source.types.sparkable`); the sink reads the table's Arrow schema and casts such columns
back before building the Avro schema (`arrow.fixedSize`, `fixed`, `arrow.type`).

Per-key order needs each key's records of a micro-batch written by one task, in
commit order. `lance-cdf publish` routes the stream for that (`publish.route`: a
`_kafka_partition` column from the key's hash, a repartition on it); each task then
sorts its share into commit order (Spark cannot sort a stream) and produces each
record to its `_kafka_partition`. A stream without those columns must be written by
one task in order (`changes.coalesce(1).writeStream...`): the producer's
partitioner picks partitions.

A stream read with option writerSlots (what `lance-cdf publish` writes) carries work
items instead of events (`WorkItem`): each writer task reads its slot's share
of the micro-batch itself from the table (`handed_off`) with the sink's `table` and
`storage.<key>` options; the items hold no option of the source. A `_work` column that is
not exactly lance-cdf's is refused with `WorkItemError`.

Database mode (option `database`, instead of `table` and `topic`; with `topic.prefix`):
the work items of a database stream name their table, and each table goes to its own
topic `<topic.prefix>.<name>` with record names `<topic.prefix>.<name>.*`, `source.table`
its qualified name and its own transaction topic, every guarantee per table
(`table_works`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from lance_cdf.avro.names import TableName
from lance_cdf.core.stream_columns import EVENT_ORDER, PARTITION_COLUMN, WORK_COLUMN
from lance_cdf.errors import LanceCdfError
from lance_cdf.format.cache import LruCache
from lance_cdf.spark.sink.sink_options import SinkOptions
from lance_cdf.spark.source.handoff import check_work_columns
from lance_cdf.spark.source.handover import hold
from lance_cdf.spark.source.hangup import quiet_when_spark_hangs_up

if TYPE_CHECKING:  # (imported where used: the driver's commit and the writer tasks)
    from lance_cdf.kafka.transactions import DefinitionChange, TransactionWriter, VersionCounts

if TYPE_CHECKING:
    import pyarrow as pa

    from lance_cdf.core.feed import ChangeFeed
    from lance_cdf.kafka.publisher import KafkaChangePublisher
    from lance_cdf.spark.sink.database_sink import TableWork

# The producer side (lance_cdf.kafka.publisher: confluent-kafka's registry client, the Avro
# encoder) and pyarrow / numpy are imported by the writer tasks only: Spark also loads this
# module in the data-source lookup, the writer's creation and the commit, one Python process
# each, on the way to the first record (docs/benchmarks.md, "Start-up"); the writer's
# creation and the commit's processes stay up beside the query, smaller without pyarrow and
# numpy (docs/benchmarks.md, "Publisher footprint").
# Publishers (and transaction writers) kept per process at most, least recently used first
# out: a database publisher writes a topic per table. Each holds its table's schemas and its
# partitions' last positions only (tens of KB); the producer, consumer and registry client
# they use are the process's, one per setting (`kafka.clients`). An evicted one is flushed
# first; its successor re-reads the topic's marks.
MAX_CLIENTS = 512


def _retire(oldest: Any) -> None:
    """A publisher or transaction writer let go by its cache: flushed, then closed."""
    oldest.producer.flush(60)  # nothing of it still in flight
    close = getattr(oldest, "close", None)
    if close is not None:
        close()


# one KafkaChangePublisher per writer setting: (the table's sink options, user schema)
_PUBLISHERS: LruCache[tuple[SinkOptions, pa.Schema], KafkaChangePublisher] = LruCache(
    MAX_CLIENTS, _retire
)


def close_publishers() -> None:
    """Close and forget this process's publishers and their clients (the driver's, after a
    head start)."""
    from lance_cdf.kafka import clients

    while _PUBLISHERS:
        _PUBLISHERS.popitem()[1].close()
    _TRANSACTION_WRITERS.clear()  # (their producer and consumer are the process's clients)
    clients.close_all()


@dataclass
class Published(WriterCommitMessage):
    records: int  # sent by this attempt
    # per commit version: the task's records per Kafka partition, sent or already held
    # (a replayed micro-batch counts what it skips): the transaction metadata's counts
    versions: dict[int, VersionCounts] = field(default_factory=dict)
    # database mode: the same per table (qualified name)
    tables: dict[str, dict[int, VersionCounts]] = field(default_factory=dict)


# one TransactionWriter per sink setting, in the process running the driver's commits
_TRANSACTION_WRITERS: LruCache[SinkOptions, TransactionWriter] = LruCache(MAX_CLIENTS, _retire)


class LanceCdfKafkaSink(DataSource):
    """The Spark sink `writeStream.format("lance-cdf-kafka")`: a `lance-cdf` stream's events
    (or its work items) to a Kafka topic as Avro change records in Debezium's envelope,
    registered in a schema registry; options: `SinkOptions`.

    A micro-batch commits only after every record is acknowledged; a replayed one skips
    what each partition already holds (exactly once per record). Raises `LanceCdfError`
    for a missing, unknown or bad option and `WorkItemError` for a `_work` column that is not
    lance-cdf's; a task fails (and Spark retries it) when the broker does not acknowledge.
    """

    @classmethod
    def name(cls) -> str:
        return "lance-cdf-kafka"

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        quiet_when_spark_hangs_up()  # in the commit's runner process
        writer = KafkaStreamWriter(SinkOptions.parse(dict(self.options)))
        writer.handoff = WORK_COLUMN in schema.fieldNames()
        if writer.handoff:  # a foreign `_work` column is refused here, before any task
            check_work_columns(schema)
        writer.routed = writer.handoff or EVENT_ORDER in schema.fieldNames()
        return writer


@contextmanager
def _archives_last() -> Iterator[None]:
    """Imports with the archives (zips, jars) at the end of `sys.path`. Spark puts them first
    on a Python worker's path: the jars of `spark.jars.packages`, pyspark.zip, py4j's zip,
    spark-core's jar. Importing the registry client looks a package's version up through
    importlib.metadata, which lists every archive ahead of site-packages: a noticeable
    part of a new worker process's start, most with the Kafka/Avro packages jars, next to
    nothing with the archives last (docs/benchmarks.md, "Inside the publisher"). Modules
    already imported are not affected."""
    saved = list(sys.path)
    archive = (".zip", ".jar")
    sys.path[:] = [p for p in saved if not p.endswith(archive)] + [
        p for p in saved if p.endswith(archive)
    ]
    try:
        yield
    finally:
        sys.path[:] = saved


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """The sink's writer: `write` runs in each Spark task (produce, wait for every
    acknowledgement), `commit` on the driver (transaction metadata after all tasks)."""

    routed = False
    handoff = False

    def __init__(self, options: SinkOptions):
        self.options = options

    def _publisher(
        self, user_schema: pa.Schema, options: SinkOptions, name: TableName
    ) -> KafkaChangePublisher:
        from lance_cdf.kafka.publisher import KafkaChangePublisher, PublisherSettings

        cache_key = (options, user_schema)
        publisher = _PUBLISHERS.get(cache_key)
        if publisher is None:
            assert options.topic is not None  # (a table's options: `for_table` in a database)
            publisher = KafkaChangePublisher(
                options.bootstrap_servers,
                options.topic,
                options.registry_url,
                user_schema,
                table_name=name,
                key_columns=list(options.key) or None,
                tombstones=options.tombstones,
                settings=PublisherSettings(
                    producer_config=options.producer_config,
                    registry_config=options.registry_config,
                    topic_settings=options.topics,
                    checkpoint=options.checkpoint,
                    flush_timeout_s=options.flush_timeout_s,
                    ride_out_s=options.ride_out_s,
                ),
            )
        return _PUBLISHERS.put(cache_key, publisher)  # the most recently used last

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        opts = self.options
        if opts.database:
            return self._write_database(iterator)
        assert opts.table is not None  # (parse: a table's sink has one)
        storage = opts.storage_options
        if self.handoff:  # option writerSlots: the task reads its slot's share itself
            from lance_cdf.spark.sink.work import handed_off

            iterator = handed_off(iterator, opts.table, storage)
        name = TableName.of(opts.table_name, uri=opts.table)
        return self._write(iterator, opts, name, opts.table, storage)

    def _write_database(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        """Database mode: each table's work items as a single-table sink would write them,
        to the table's own topic (`table_works`)."""
        import logging

        from lance_cdf.spark.sink.database_sink import table_works

        database, storage = str(self.options.database), self.options.storage_options
        out = Published(0)
        for name, work in table_works(iterator, database, storage).items():
            if work.uri is None:
                logging.getLogger("lance_cdf.kafka").warning(
                    "table %s was dropped from the database: its changes are let go", name
                )
                continue
            done = self._write_table(work)
            if done is not None:
                out.records += done.records
                out.tables[name] = done.versions
        return out

    def _write_table(self, work: TableWork) -> Published | None:
        """One table's work items to its topic (made sure of first). A transient fault
        (a new topic's metadata not there yet, a broker, registry or object store that does
        not answer, a table caught mid-commit) is retried with backoff, the whole table
        again (exactly once: the retry reads the partitions' marks, as a retried task
        does), for up to `TakeUpSettings.writer_budget_s`; past it, or on a fault that does
        not pass by itself, the micro-batch fails with one line. None: the table was
        dropped meanwhile (let go)."""
        import logging

        from lance_cdf.errors import in_words
        from lance_cdf.kafka.outage import RideOut
        from lance_cdf.ops.clientconfig import KafkaConnection
        from lance_cdf.ops.takeup import DEFAULT, is_transient, record_writer_retry
        from lance_cdf.retry import retry
        from lance_cdf.spark.sink.database_sink import is_gone, table_topic, with_partitions

        log = logging.getLogger("lance_cdf.kafka")
        name, uri = work.name, str(work.uri)
        opts = self.options.for_table(uri, name)
        database, storage, topic = str(opts.database), opts.storage_options, str(opts.topic)
        checkpoint = opts.checkpoint
        ride_out = RideOut.of(opts.bootstrap_servers, opts)

        def attempt() -> Published | None:
            try:
                partitions = table_topic(
                    KafkaConnection(opts.bootstrap_servers, opts.producer_config),
                    topic,
                    opts.topics,
                    f"{topic}.transaction" if opts.transaction_metadata else None,
                    ride_out,
                )
                works = with_partitions(work.works, partitions)
                events = (batch for w in works for batch in w.events())
                table_name = TableName(str(opts.topic_prefix), name, uri)
                return self._write(events, opts, table_name, uri, storage)
            except Exception:
                if is_gone(database, name, storage):  # dropped while being read: let go
                    log.warning("table %s was dropped while being published: let go", name)
                    return None
                raise

        def retrying(exc: BaseException, retries: int, pause: float) -> None:
            cause = in_words(exc)
            if retries == 0:
                log.warning(
                    "table %s: publishing failed (%s); retrying for up to %.0f s",
                    name,
                    cause,
                    DEFAULT.writer_budget_s,
                )
            record_writer_retry(checkpoint, name, cause)

        return retry(attempt, DEFAULT.writer_retry, is_transient, retrying)

    def _write(
        self,
        iterator: Iterator[pa.RecordBatch],
        options: SinkOptions,
        name: TableName,
        table: str,
        storage: dict[str, str],
    ) -> Published:
        """The events of one table to its topic (`options`: the sink's, for that table)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from lance_cdf.core.feed import ChangeFeed

        with _archives_last():
            from lance_cdf.kafka.publisher import carry_update_pairs, commit_order, user_schema_of

        feed: ChangeFeed | None = None
        publisher: KafkaChangePublisher | None = None
        sent = 0
        exact = None
        owned: list[int] = []
        last_version = -1  # a routed share's last commit version
        if self.routed:
            # a routed stream (publish.route): the task's whole share, put in commit order
            # (Spark cannot sort a stream); memory is bounded by the micro-batch's size
            # (a task whose share is empty gets no batch at all: nothing to write)
            batches = [b for b in iterator if b.num_rows]
            if not batches:
                return Published(0)
            whole = commit_order(pa.Table.from_batches(batches))
            owned = pc.unique(whole[PARTITION_COLUMN]).to_pylist()
            last_version = int(pc.max(whole["_commit_version"]).as_py())
            # in batches of 65,536: a share filtered from many small reads arrives in small
            # chunks, and the encoder has a cost per batch
            iterator = whole.combine_chunks().to_batches(max_chunksize=65536)
        exactly_once = self.routed and options.exactly_once
        marks = None
        for events in carry_update_pairs(iterator):
            versions = np.unique(events["_commit_version"].to_numpy()).tolist()
            if feed is None or publisher is None:  # (both made together)
                # the source checked the table; the latest manifest is not needed here
                feed = ChangeFeed(table, storage, check_latest=False)
                exact = table_types(user_schema_of(events.schema), feed, max(versions))
                with _archives_last():  # the registry client looks its version up
                    publisher = self._publisher(exact, options, name)
                publisher.begin()  # a retried task starts clean
                if exactly_once and options.hand_over:  # publish's head start may run
                    _hand_over(options, name, table, last_version)
                if exactly_once:  # how far an earlier attempt got, per owned partition
                    marks = publisher.high_water_marks(owned)
            events = restore_types(events, exact)
            operations = {v: feed.table.manifest(v).operation for v in versions}
            sent += publisher.send(events, operations, marks)  # acks are awaited once, below
        if publisher is None:
            return Published(sent)
        publisher.flush()  # every record acknowledged, or the micro-batch fails
        hold("write")
        return Published(sent, dict(publisher.version_counts))

    def commit(  # noqa: N803 (Spark's name)
        self, messages: list[WriterCommitMessage | None], batchId: int
    ) -> None:
        """Every writer task succeeded: the BEGIN/END records of the micro-batch's versions
        (`TransactionWriter`), written once however often the micro-batch runs. The head
        start (`TableRounds`) calls it too, with batch id -1, for what it
        published; the query's later commit of those versions skips them."""
        if not self.options.transaction_metadata:
            return
        if batchId >= 0:
            hold("commit")
        if self.options.hand_over:  # publish's head start may still write BEGIN/END records
            from lance_cdf.spark.source.handover import HandOver

            with HandOver(self.options.hand_over).exclusive():
                self._commit(messages, batchId)
            return
        self._commit(messages, batchId)

    def _commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        """`commit`'s work: the micro-batch's BEGIN/END records (and definition)."""
        with _archives_last():
            from lance_cdf.kafka.transactions import merge

        if not all(isinstance(m, Published) for m in messages):
            raise LanceCdfError(
                f"micro-batch {batch_id}: a writer task returned no record counts, so its "
                "versions' transaction metadata would be wrong; the micro-batch is not "
                "committed (restart publish to retry it)"
            )
        published = [m for m in messages if isinstance(m, Published)]
        o = self.options
        if o.database:  # per table, to its own transaction topic
            self._commit_database(published, batch_id)
            return
        from lance_cdf.spark.sink.definition_sync import batch_spans, table_definitions

        assert o.table is not None  # (parse: a table's sink has one)
        versions = merge([m.versions for m in published])
        have: dict[str | None, list[int]] = {None: [c.version for c in versions]}
        span = batch_spans(o.checkpoint, batch_id, have).get(None) if o.table_definitions else None
        defs = table_definitions(o.table, o.storage_options)
        change = None if span is None else defs.change(span)
        if versions or (span is not None and not defs.unchanged(span)):
            name = TableName.of(o.table_name, uri=o.table)
            writer = self._transaction_writer(o, name)
            self._write_markers(writer, versions, change, None if span is None else span.end)

    def _commit_database(self, published: list[Published], batch_id: int) -> None:
        """Database mode: each table's BEGIN/END records (and definition) to its own
        transaction topic, for the tables with changes or a new version in the batch."""
        from lance_cdf.kafka.transactions import merge
        from lance_cdf.spark.sink.database_sink import uri_of
        from lance_cdf.spark.sink.definition_sync import batch_spans, table_definitions

        opts = self.options
        prefix, storage = str(opts.topic_prefix), opts.storage_options
        counted = {
            t: merge([m.tables[t] for m in published if t in m.tables])
            for t in {t for m in published for t in m.tables}
        }
        have: dict[str | None, list[int]] = {t: [c.version for c in v] for t, v in counted.items()}
        spans = batch_spans(opts.checkpoint, batch_id, have) if opts.table_definitions else {}
        for table in sorted({*counted, *(str(t) for t in spans)}):
            versions, span = counted.get(table, []), spans.get(table)
            uri = uri_of(str(opts.database), table, storage) if span is not None else None
            defs = None if uri is None else table_definitions(uri, storage)
            wanted = defs is not None and span is not None and not defs.unchanged(span)
            if not versions and not wanted:
                continue
            name = TableName(prefix, table)
            options = opts.for_table(table, table)  # (named by its name: no read here)
            change = None if defs is None or span is None else defs.change(span)
            end = None if span is None else span.end
            self._write_markers(self._transaction_writer(options, name), versions, change, end)

    def _write_markers(
        self,
        writer: TransactionWriter,
        versions: list[VersionCounts],
        change: DefinitionChange | None = None,
        end: int | None = None,
    ) -> None:
        """`writer.write(versions)`, a broker outage ridden out as the writer tasks ride it
        out (`RideOut`: up to RIDE_OUT_S, then one line): a failed commit would stop
        the query. A retry first waits until no record of the failed attempt is queued, so
        the topic's last record is what it reads (no BEGIN/END written twice)."""
        from confluent_kafka import KafkaException

        from lance_cdf.errors import PublishError, in_words
        from lance_cdf.kafka.outage import RideOut
        from lance_cdf.ops.takeup import is_transient

        ride_out = RideOut.of(self.options.bootstrap_servers, self.options)

        def attempt() -> int:
            if writer.producer.flush(10):
                raise PublishError("transaction records of an earlier attempt still queued")
            try:
                return writer.write(versions, change, end)
            except (KafkaException, PublishError):
                raise
            except Exception as exc:  # the registry (a new table's first schemas)
                if is_transient(exc):
                    raise PublishError(f"the schema registry failed: {in_words(exc)}") from exc
                raise

        ride_out.call("writing transaction metadata", attempt, (KafkaException, PublishError))

    def _transaction_writer(self, options: SinkOptions, name: TableName) -> TransactionWriter:
        with _archives_last():
            from lance_cdf.kafka.transactions import TransactionWriter, default_topic

        writer = _TRANSACTION_WRITERS.get(options)
        if writer is None:
            topic = options.transaction_topic or default_topic(str(options.topic))
            writer = TransactionWriter(
                options.bootstrap_servers,
                topic,
                options.registry_url,
                name.namespace,
                options.producer_config,
                options.registry_config,
                timeout=options.flush_timeout_s,
                topic_settings=options.topics,
            )
        return _TRANSACTION_WRITERS.put(options, writer)  # the most recently used last

    def abort(  # noqa: N803
        self, messages: list[WriterCommitMessage | None], batchId: int
    ) -> None:
        pass


def _hand_over(opts: SinkOptions, name: TableName, table: str, last: int) -> None:
    """A writer task of lance-cdf publish on a local master, before it reads its marks:
    the head start publishes nothing more unless it has published through the task's
    last version (`HandOver.before_writing`); a database's tables by name, a table by its
    URI."""
    from lance_cdf.spark.source.handover import HandOver

    key = name.table if opts.database else table
    HandOver(str(opts.hand_over)).before_writing(key, last)


def _avro_of(t: pa.DataType) -> Any:  # an Avro schema: a name, or its JSON object
    from lance_cdf.avro.names import Namer
    from lance_cdf.avro.schema import avro_type

    return avro_type(t, "c", Namer())


def table_types(widened: pa.Schema, feed: ChangeFeed, version: int) -> pa.Schema:
    """`widened` (the user columns as Spark delivers them) with each column whose Avro
    type Spark changed (unsigned and narrow integers, float16, fixed-size lists and
    binaries, inside lists and structs too) back in the table's own type at `version`.
    Dates and times keep Spark's form (same values; Spark's microsecond units are the
    ones the Avro mapping writes)."""
    import pyarrow as pa

    table = feed.schema_at(version)
    fields = []
    for f in widened:
        own = table.field(f.name) if f.name in table.names else None
        if own is not None and own.type != f.type and not pa.types.is_temporal(own.type):
            try:
                changed = _avro_of(own.type) != _avro_of(f.type)
            except LanceCdfError:
                changed = False
            if changed:
                f = f.with_type(own.type)
        fields.append(f)
    return pa.schema(fields)


def restore_types(events: pa.Table, exact: pa.Schema) -> pa.Table:
    """`events` with the user columns cast to `exact` (see `table_types`)."""
    import pyarrow as pa

    for f in exact:
        i = events.schema.get_field_index(f.name)
        if i < 0 or events.schema.field(i).type == f.type:
            continue
        try:
            column = events.column(i).cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise LanceCdfError(
                f"column {f.name!r}: Spark delivered {events.schema.field(i).type}, which does "
                f"not cast back to the table's {f.type} ({exc}); leave the column out with "
                "the columns option."
            ) from None
        events = events.set_column(i, events.schema.field(i).with_type(f.type), column)
    return events
