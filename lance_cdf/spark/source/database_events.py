"""A whole database as one stream of change events: the `lance-cdf` source
with option `database`, no `path` and no `writerSlots` reads the events of every table of
a LanceDB database / Lance directory namespace whose qualified name matches `include` and
not `exclude`, in the single-table source's columns plus `_table` (the qualified name,
`sales.orders`, `items`).

Stream (`DatabaseEventReader`): the database stream of `DatabaseReader` (one offset
map of the tables' own offsets, tables taken up, let go and skipped as there, each table's
identity checked on restart), with a single-table `LanceCdfStreamReader` per table instead
of a hand-off reader: a micro-batch's partitions are each table's own partitions, in its
own order, each tagged with its table's name (`TableSlice`); an executor reads one with
that table's `TableReading` (pickled with the reader by Spark, as for one table) and widens
the batch to the stream's columns. Batch read (`DatabaseBatchReader`): a
`LanceCdfBatchReader` per table, the same way.

The schema (fixed at `load()`, as Spark fixes a stream's): the union by name of the
matching tables' event columns over their versions from the start given (default: every
version still present), then the metadata columns and `_table`. A column a table lacks is
null in its rows. A column whose Spark type differs between two tables is refused at
`load()` (`DatabaseSchemaError`, naming the column, both tables and the fix); a table taken
up later, or a followed table that changes, with a column the stream lacks stops the query
with one line saying to restart it (never another table's column, never a column dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
)
from pyspark.sql.types import StringType, StructField, StructType

from lance_cdf.core.stream_columns import EVENT_ORDER, KEY_HASH
from lance_cdf.errors import (
    CheckpointMismatchError,
    DatabaseSchemaError,
    LanceCdfError,
    NoVersionSinceError,
    StableRowIdsRequiredError,
)
from lance_cdf.format.namespace import list_tables
from lance_cdf.ops.takeup import is_transient
from lance_cdf.spark.source.database_stream import DatabaseOptions, DatabaseReader, why_not_read
from lance_cdf.spark.source.partitions import Offset, SourcePartition
from lance_cdf.spark.source.readers import LanceCdfBatchReader, LanceCdfStreamReader, TableReading
from lance_cdf.spark.source.resolution import Resolved, event_struct, resolve
from lance_cdf.spark.source.table_feeds import keep_feed_if_same
from lance_cdf.spark.source.types import META_NAMES, arrow_target

log = logging.getLogger("lance_cdf.spark.source")

TABLE_COLUMN = "_table"  # the qualified name of the event's table
_TAIL = META_NAMES | {KEY_HASH, EVENT_ORDER}  # columns every table's events have alike


def is_database_events(options: Mapping[str, str]) -> bool:
    """Option `database` without `path` and without `writerSlots`: every table's events."""
    lower = {str(k).lower(): v for k, v in options.items()}
    return bool(lower.get("database")) and not lower.get("path") and not lower.get("writerslots")


def parse(raw: Mapping[str, str], streaming: bool) -> DatabaseOptions:
    """The options of a database read, with the start options that hold across tables."""
    options = DatabaseOptions.parse(raw, events=True)
    lower = {str(k).lower(): str(v) for k, v in raw.items()}
    if "endingversion" in lower:
        raise LanceCdfError(
            "endingVersion names one table's version: a database read takes startingVersion "
            "(earliest, latest, snapshot) or startingTimestamp; read one table with option path"
        )
    starting = lower.get("startingversion", "").strip().lower()
    if streaming and "startingtimestamp" in lower:
        raise LanceCdfError(
            "a database stream takes startingVersion (a number, latest, earliest or snapshot), "
            "not startingTimestamp; a batch read (spark.read) takes startingTimestamp"
        )
    if not streaming and starting and starting not in ("earliest", "latest", "snapshot"):
        raise LanceCdfError(
            f"startingVersion={starting} names one table's version: a database batch read takes "
            "earliest, latest, snapshot or startingTimestamp; read one table with option path"
        )
    from lance_cdf.spark.source.options import SourceOptions

    SourceOptions.parse({**options.table_options, "path": options.database}, streaming=False)
    return options  # (each table's options are checked: unknown ones, bad values)


@dataclass(frozen=True)
class TableSlice(InputPartition):
    """One partition `part` of table `name` (at `uri`) whose columns are `columns` (its
    Arrow read schema, serialized): Spark pickles the reader to the executors once, at the
    query's start, so what a table taken up later needs travels with its partitions. No
    option: storage options stay the reader's options."""

    name: str
    uri: str
    columns: bytes
    part: SourcePartition


def table_slices(
    name: str, reading: TableReading, parts: Sequence[InputPartition]
) -> list[TableSlice]:
    """Table `name`'s own partitions, planned on the driver by its one-table reader (whose
    `TableReading` is `reading`), as slices of the database read."""
    columns = reading.read_schema.serialize().to_pybytes()
    return [TableSlice(name, reading.opts.path, columns, p) for p in parts]  # type: ignore[arg-type]


class _SliceReading:
    """Reads `TableSlice`s on an executor: each table's `TableReading` made from the slice and
    the reader's options (cached per table, URI and columns), its events widened to the
    read's schema."""

    options: DatabaseOptions
    schema: StructType
    target: pa.Schema

    def _read_slice(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TableSlice):
            raise TypeError(f"not a database read's partition: {type(partition).__name__}")
        cache: dict[tuple[str, str, bytes], TableReading] = self.__dict__.setdefault(
            "_readings", {}
        )
        key = (partition.name, partition.uri, partition.columns)
        reading = cache.get(key)
        if reading is None:
            from lance_cdf.spark.source.options import SourceOptions

            columns = pa.ipc.read_schema(pa.py_buffer(partition.columns))
            have = {f.name: f for f in self.schema.fields}
            declared = StructType(
                [have[n] for n in columns.names]
                + [f for f in self.schema.fields if f.name in _TAIL]
            )
            opts = SourceOptions.parse({**self.options.table_options, "path": partition.uri}, True)
            reading = cache[key] = TableReading(opts, columns, declared)
        # a table dropped and created again at the same path (LanceDB reuses `<name>.lance`)
        # is another table whose versions 1, 2, ... are not the cached ones: the feed this
        # process kept is read on only while its manifests are still the table's own (as
        # `SlotWork.events` does for publish --database)
        keep_feed_if_same(partition.uri, reading.opts.storage_options)
        for batch in reading.read(partition.part):
            yield widen(batch, partition.name, self.target)


def _matching(options: DatabaseOptions) -> dict[str, str]:
    """Qualified name -> URI of the matching tables."""
    listed = list_tables(options.database, options.storage_options)
    return {r.qualified_name: r.uri for r in listed if options.matches(r.qualified_name)}


def _resolved(options: DatabaseOptions, uri: str, start: str | None, streaming: bool) -> Resolved:
    table = dict(options.table_options)
    if start is not None:  # else the start the options give
        table = {k: v for k, v in table.items() if k.lower() != "startingversion"}
        table["startingVersion"] = start
    return resolve({**table, "path": uri}, streaming=streaming)


def database_schema(raw: Mapping[str, str]) -> StructType:
    """The schema of a database read (see the module's doc): at `load()`."""
    options = parse(raw, streaming="startingtimestamp" not in {k.lower() for k in raw})
    structs: dict[str, StructType] = {}
    for name, uri in sorted(_matching(options).items()):
        try:  # every version from the start given (none given: every version present)
            resolved = _resolved(options, uri, None if _has_start(options) else "earliest", True)
        except StableRowIdsRequiredError:
            log.warning("table %s is not read: %s", name, why_not_read(StableRowIdsRequiredError()))
            continue
        except LanceCdfError as exc:
            raise type(exc)(f"table {name}: {exc}") from None
        structs[name] = event_struct(resolved)
    return union(structs)


def _has_start(options: DatabaseOptions) -> bool:
    return any(k.lower() in ("startingversion", "startingtimestamp") for k in options.table_options)


def union(structs: Mapping[str, StructType]) -> StructType:
    """The tables' event columns by name (each nullable), then the columns every table's
    events have alike, then `_table`; a column of two types is refused."""
    fields: dict[str, StructField] = {}
    owner: dict[str, str] = {}
    tail: list[StructField] = []
    for name, struct in structs.items():
        for f in struct.fields:
            if f.name == TABLE_COLUMN:
                raise DatabaseSchemaError(
                    f"table {name} has a column named {TABLE_COLUMN}, the column a database "
                    "read names each event's table in; leave it out with option exclude, or "
                    "read it alone with option path"
                )
            if f.name in _TAIL:
                if f.name not in [t.name for t in tail]:
                    tail.append(f)
            elif f.name not in fields:
                fields[f.name] = StructField(f.name, f.dataType, True)
                owner[f.name] = name
            elif fields[f.name].dataType.simpleString() != f.dataType.simpleString():
                raise DatabaseSchemaError(
                    f"column {f.name} is {fields[f.name].dataType.simpleString()} in table "
                    f"{owner[f.name]} and {f.dataType.simpleString()} in table {name}: one "
                    "stream cannot hold both; leave one table out (option include / exclude) "
                    "or read each table in its own stream (option path)"
                )
    if not tail:  # no table yet: the metadata columns of any table's events
        from lance_cdf.spark.source.types import spark_schema

        tail = list(spark_schema(pa.schema([])).fields)
    return StructType([*fields.values(), *tail, StructField(TABLE_COLUMN, StringType(), False)])


def fitted(name: str, struct: StructType, schema: StructType) -> StructType:
    """Table `name`'s event columns as the stream's schema has them, or DatabaseSchemaError
    if it has a column the stream lacks (or of another type)."""
    have = {f.name: f for f in schema.fields}
    missing = [f.name for f in struct.fields if f.name not in have]
    retyped = [
        f"{f.name} {f.dataType.simpleString()} (the stream: {have[f.name].dataType.simpleString()})"
        for f in struct.fields
        if f.name in have and have[f.name].dataType.simpleString() != f.dataType.simpleString()
    ]
    if missing or retyped:
        what = "; ".join(
            ([f"column(s) {missing} the stream lacks"] if missing else [])
            + ([f"retyped {retyped}"] if retyped else [])
        )
        raise DatabaseSchemaError(
            f"table {name} has {what}: the stream's columns were fixed when the query started; "
            "restart the query to take them in (or leave the table out with option exclude)"
        )
    return StructType([have[f.name] for f in struct.fields])


def widen(batch: pa.RecordBatch, name: str, target: pa.Schema) -> pa.RecordBatch:
    """A table's events (in its columns, as the stream types them) in the stream's columns:
    the columns it lacks null, `_table` its name."""
    n = batch.num_rows
    names = set(batch.schema.names)
    arrays = []
    for field in target:
        if field.name == TABLE_COLUMN:
            arrays.append(pa.repeat(pa.scalar(name, field.type), n))
        elif field.name in names:
            column = batch.column(field.name)
            arrays.append(column if column.type == field.type else column.cast(field.type))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


class DatabaseEventReader(_SliceReading, DatabaseReader):
    """`spark.readStream.format("lance-cdf").option("database", uri)`: every matching
    table's events, with `_table` (see the module's doc)."""

    EVENTS = True

    def __init__(self, options: Mapping[str, str], schema: StructType):
        parse(options, streaming=True)
        super().__init__(options)
        self.schema = schema
        self.target = arrow_target(schema)

    def __getstate__(self) -> dict[str, object]:
        # executors need the options and the schema (the partitions name the tables)
        return {**super().__getstate__(), "schema": self.schema, "target": self.target}

    def _check(self, start: Offset) -> None:
        held = start.get("from")
        given = self.options.starting
        if given is not None and held is not None and held != given:
            raise CheckpointMismatchError(
                f"the checkpoint was started with startingVersion {held}; startingVersion "
                f"{given} applies to a new checkpoint only. Leave it out (or give the same) "
                "to resume, or give a new checkpointLocation"
            )

    def getDefaultReadLimit(self) -> ReadLimit:
        # each table's limit, as a one-table stream of it has (a version is never split)
        table = self.options.table
        if table.max_rows_per_trigger:
            return ReadMaxRows(table.max_rows_per_trigger)
        if table.max_versions_per_trigger:
            return ReadMaxFiles(table.max_versions_per_trigger)
        return ReadAllAvailable()

    def _not_followable(self, name: str, names: set[str]) -> str | None:
        return None  # any name can be a `_table` value (topics are publish's concern)

    def _stops_on(self, exc: Exception, followed: bool) -> bool:
        # A followed table's error (a schema change, versions cleaned up before they were
        # read) stops the query as it stops a one-table stream; a table's columns that do
        # not fit stop it too. Tables it cannot take up (no stable row IDs), and a table
        # that is another table than the checkpoint's, are left out with one line; a fault
        # that passes by itself (the object store throttles) sets the table aside for a while.
        if isinstance(exc, DatabaseSchemaError):
            return True
        return followed and not isinstance(exc, CheckpointMismatchError) and not is_transient(exc)

    def _make_reader(self, name: str, resolved: Resolved) -> LanceCdfStreamReader:
        fitted(name, event_struct(resolved), self.schema)  # what it reads from now on
        # A table resumed from the checkpoint is resolved at its latest version; the versions
        # after the checkpoint's may hold columns dropped since, which the stream has: read
        # them too (null where a version lacks them), never leave their values out: the
        # table's columns as read over all its versions (the columns' origins in that union).
        history = _resolved(self.options, resolved.opts.path, "earliest", True).user_schema
        have = set(resolved.user_schema.names)
        wanted = have | set(self.schema.fieldNames())
        if have <= set(history.names) and not set(history.names) & wanted <= have:
            resolved = replace(
                resolved, user_schema=pa.schema([f for f in history if f.name in wanted])
            )
        return LanceCdfStreamReader(resolved, fitted(name, event_struct(resolved), self.schema))

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for name, reader, parts in self.table_partitions(start, end):
            out.extend(table_slices(name, reader.reading, parts))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read_slice(partition)


class DatabaseBatchReader(_SliceReading, DataSourceReader):
    """`spark.read.format("lance-cdf").option("database", uri)`: the events of every
    matching table (each from its start to its latest version), with `_table`."""

    def __init__(self, options: Mapping[str, str], schema: StructType):
        self.options = parse(options, streaming=False)
        self.schema = schema
        self.target = arrow_target(schema)
        self.readers: dict[str, LanceCdfBatchReader] = {}
        for name, uri in sorted(_matching(self.options).items()):
            try:
                resolved = _resolved(self.options, uri, None, streaming=False)
            except StableRowIdsRequiredError:
                why = why_not_read(StableRowIdsRequiredError())
                log.warning("table %s is not read: %s", name, why)
                continue
            except NoVersionSinceError:
                continue  # nothing committed since startingTimestamp: no events
            except LanceCdfError as exc:
                raise type(exc)(f"table {name}: {exc}") from None
            declared = fitted(name, event_struct(resolved), schema)
            self.readers[name] = LanceCdfBatchReader(resolved, declared)

    def __getstate__(self) -> dict[str, object]:
        # executors need the options and the schema (the partitions name the tables)
        return {
            "options": self.options,
            "schema": self.schema,
            "target": self.target,
            "readers": {},
        }

    def partitions(self) -> Sequence[InputPartition]:
        return [
            s for n, r in self.readers.items() for s in table_slices(n, r.reading, r.partitions())
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read_slice(partition)
