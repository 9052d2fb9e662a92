"""The `lance-cdf` Spark data source (`format("lance-cdf")`): which reader serves a read.

One table's batch and streaming reads are `LanceCdfBatchReader`'s and
`LanceCdfStreamReader`'s; a whole database's, as work items (`DatabaseReader`) or as events
(`DatabaseEventReader`, `DatabaseBatchReader`). Spark finds the class through
`pyspark_lance_cdf` or `lance_cdf.spark.register`.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from lance_cdf.spark.source.database_events import (
    DatabaseBatchReader,
    DatabaseEventReader,
    database_schema,
    is_database_events,
)
from lance_cdf.spark.source.database_stream import (
    DatabaseOptions,
    DatabaseReader,
    is_database_stream,
)
from lance_cdf.spark.source.handoff import work_struct
from lance_cdf.spark.source.hangup import quiet_when_spark_hangs_up
from lance_cdf.spark.source.options import SourceOptions
from lance_cdf.spark.source.readers import HandOffReader, LanceCdfBatchReader, LanceCdfStreamReader
from lance_cdf.spark.source.resolution import event_struct, resolve
from lance_cdf.spark.source.table_feeds import feed_for


class LanceCdfDataSource(DataSource):
    """The Spark source `format("lance-cdf")`: `spark.read` for a version range,
    `spark.readStream` for a stream whose offsets are table versions.

    Rows are the change events of `read_changes` — the table's columns plus `_change_type`,
    `_commit_version`, `_commit_timestamp`, `_rowid` — with the options of the Spark
    options reference (`path`, `startingVersion`, `endingVersion`, `columns`,
    `maxVersionsPerTrigger`, `netChanges`, `storage.<key>`, ...). Registered by
    `lance_cdf.spark.register(spark)`, or found without a call on PySpark >= 4.0.

    Raises (at `load()`, as a `LanceCdfError` inside Spark's error): unknown options or
    bad values, a table that does not exist or lacks stable row IDs, a version that is not
    there or was cleaned up; in a running stream, versions cleaned up before they were read
    (unless `failOnDataLoss=false`), a column added mid-stream (unless `mergeSchema=true`)
    and a checkpoint of another table (`CheckpointMismatchError`).
    """

    @classmethod
    def name(cls) -> str:
        return "lance-cdf"

    def schema(self) -> StructType:
        # Spark does not say whether a batch or a stream asks. endingVersion means batch
        # (a stream rejects it); otherwise the stream's schema is declared, and a batch
        # read returns the declared columns (docs/guides/spark.md, "Streaming semantics":
        # they differ only when no start is given and columns were dropped before the
        # latest version).
        if is_database_events(self.options):  # every table's events (`DatabaseEventReader`)
            return database_schema(self.options)
        if is_database_stream(self.options):  # every table of a database (`DatabaseReader`)
            DatabaseOptions.parse(self.options)
            return work_struct()
        batch = "endingversion" in {str(k).lower() for k in self.options}
        resolved = resolve(self.options, streaming=not batch)
        # pickled with this instance: what "latest" means for the reader created next, and
        # the Arrow schemas read to resolve it (Arrow IPC: the stream's source runner takes
        # them instead of importing pylance to read them again, rows.RowReader.known_schemas)
        self._as_of = resolved.end
        self._schemas = feed_for(resolved.opts).reader.known_schemas()
        declared = event_struct(resolved)
        return work_struct() if resolved.opts.writer_slots else declared

    def reader(self, schema: StructType) -> DataSourceReader:
        if is_database_events(self.options):
            return DatabaseBatchReader(self.options, schema)
        as_of = getattr(self, "_as_of", None)
        return LanceCdfBatchReader(resolve(self.options, False, as_of), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        quiet_when_spark_hangs_up()
        if is_database_events(self.options):
            return DatabaseEventReader(self.options, schema)
        if is_database_stream(self.options):
            return DatabaseReader(self.options)
        as_of = getattr(self, "_as_of", None)
        known = getattr(self, "_schemas", None)
        if known:
            feed_for(SourceOptions.parse(dict(self.options), True)).reader.learn_schemas(known)
        resolved = resolve(self.options, True, as_of)
        if resolved.opts.writer_slots:
            return HandOffReader(resolved, event_struct(resolved))
        return LanceCdfStreamReader(resolved, schema)
