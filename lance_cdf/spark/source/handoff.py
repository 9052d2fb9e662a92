"""Work items: what a `lance-cdf` stream read with option writerSlots carries instead of
its events, one row per writer slot of each micro-batch (the `lance-cdf-kafka` sink's
task for that slot reads the slot's share of the events itself: `SlotWork`).

A work item is plain data in four columns, never code:

- `_writer_slot` (int): the slot;
- `_events` (long): the events the micro-batch planned, on slot 0's row (0 on the others;
  Spark counts the work items as the input rows, `runner.hand_off` observes this);
- `_work` (string): JSON, `{"format": 1, "table": digest, "slots": n, "kafkaPartitions":
  p, "keyHash": [columns], "dropUnchangedUpdates": bool, "failOnDataLoss": bool, "parts":
  [...]}` with the micro-batch's source partitions as `partitions.part_json` writes them,
  and in a database stream (`DatabaseReader`) `"name"`: the table's qualified name;
- `_read_schema` (binary): the Arrow schema (IPC) of the columns the events carry, with
  their Lance field ids, as fixed when the query started (`load()`).

No option of the source is in it: where the table is and its storage options
(credentials) reach the sink through the sink's own options (`table`, `storage.<key>`),
so a work-item stream printed by a console sink or collected shows no secret.
`WorkItem.of` takes only the exact shapes `to_batch` writes and raises `WorkItemError`
for anything else.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructType

from lance_cdf.core.stream_columns import WORK_COLUMN, WORK_EVENTS, WORK_SCHEMA, WORK_SLOT
from lance_cdf.errors import WorkItemError
from lance_cdf.spark.source.partitions import (
    SourcePartition,
    fields,
    listed,
    part_json,
    part_of,
    whole,
)

if TYPE_CHECKING:  # (imported where used: `LanceCdfKafkaSink.streamWriter`, in the sink's
    import pyarrow as pa  # commit process, checks a work-item stream's columns without it)

# The version of the `_work` document; a reader takes only its own.
WORK_FORMAT = 1
_KEYS = {
    "format",
    "table",
    "slots",
    "kafkaPartitions",
    "keyHash",
    "dropUnchangedUpdates",
    "failOnDataLoss",
    "parts",
}
_NAMED = _KEYS | {"name"}  # a database stream's items name their table
_FIX = (
    'write only the stream of readStream.format("lance-cdf") with option writerSlots to this sink'
)


def work_struct() -> StructType:
    """The Spark schema of a work-item stream."""
    return (
        StructType()
        .add(WORK_SLOT, IntegerType())
        .add(WORK_EVENTS, LongType())
        .add(WORK_COLUMN, StringType())
        .add(WORK_SCHEMA, BinaryType())
    )


def check_work_columns(schema: StructType) -> None:
    """`WorkItemError` unless `schema` has the work-item columns, in their types."""
    have = {f.name: f.dataType for f in schema.fields}
    wrong = [
        f"{f.name} {have[f.name].simpleString() if f.name in have else 'missing'}"
        for f in work_struct().fields
        if have.get(f.name) != f.dataType
    ]
    if wrong:
        want = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in work_struct().fields)
        raise WorkItemError(
            f"the stream's work-item columns are not lance-cdf's ({', '.join(wrong)}; "
            f"expected {want}): {_FIX}"
        )


@dataclass(frozen=True)
class WriterSlot(InputPartition):
    """Option writerSlots: writer slot `slot` of `slots` of a micro-batch made of `parts`
    (the partitions the stream would otherwise read)."""

    parts: tuple[SourcePartition, ...]
    slot: int
    slots: int
    planned: int  # the micro-batch's events as planned (slot 0; 0 in the others)


@dataclass(frozen=True)
class WorkItem:
    """One writer slot's work of a micro-batch: read `parts` as the stream would (the
    columns of `read_schema`, `_key_hash` of `key_hash`, the two read options), keep the
    events whose Kafka partition `_key_hash % kafka_partitions` belongs to `slot` of
    `slots` (`SlotWork`)."""

    slot: int
    slots: int
    planned: int
    kafka_partitions: int
    key_hash: tuple[str, ...]
    drop_unchanged_updates: bool
    fail_on_data_loss: bool
    parts: tuple[SourcePartition, ...]
    read_schema: pa.Schema
    table: str  # table_digest() of the source's path: the sink checks its own against it
    name: str | None = None  # a database stream's: the table's qualified name (sales.orders)

    def to_batch(self) -> pa.RecordBatch:
        """The item as one row of `work_struct()`."""
        import pyarrow as pa

        document = {
            "format": WORK_FORMAT,
            "table": self.table,
            "slots": self.slots,
            "kafkaPartitions": self.kafka_partitions,
            "keyHash": list(self.key_hash),
            "dropUnchangedUpdates": self.drop_unchanged_updates,
            "failOnDataLoss": self.fail_on_data_loss,
            "parts": [part_json(p) for p in self.parts],
        }
        if self.name is not None:
            document["name"] = self.name
        return pa.RecordBatch.from_arrays(
            [
                pa.array([self.slot], pa.int32()),
                pa.array([self.planned], pa.int64()),
                pa.array([json.dumps(document, separators=(",", ":"))], pa.string()),
                pa.array([self.read_schema.serialize().to_pybytes()], pa.binary()),
            ],
            names=[WORK_SLOT, WORK_EVENTS, WORK_COLUMN, WORK_SCHEMA],
        )

    @classmethod
    def of(cls, slot: object, planned: object, work: object, schema: object) -> WorkItem:
        """The item of one row's values (`to_batch`'s columns, as Python values); anything
        else: `WorkItemError` saying what is wrong and what to write to the sink instead."""
        try:
            document = _document(work)
        except WorkItemError as exc:
            raise _foreign(exc) from None
        version = document.get("format") if isinstance(document, dict) else None
        if type(version) is int and version != WORK_FORMAT:
            raise WorkItemError(
                f"a work item of format {version}; this lance-cdf reads format {WORK_FORMAT}: "
                "run the same lance-cdf release on the driver and the executors"
            )
        try:
            keys = _NAMED if isinstance(document, dict) and "name" in document else _KEYS
            return cls._of(slot, planned, fields(document, WORK_COLUMN, keys), schema)
        except WorkItemError as exc:
            raise _foreign(exc) from None

    @classmethod
    def _of(
        cls, slot: object, planned: object, document: dict[str, Any], schema: object
    ) -> WorkItem:
        import pyarrow as pa

        if type(document["format"]) is not int:  # (another whole number is refused in `of`)
            raise WorkItemError(f"format is {document['format']!r}, not {WORK_FORMAT}")
        slots = whole(document["slots"], "slots", 1)
        slot = whole(slot, WORK_SLOT)
        if slot >= slots:
            raise WorkItemError(f"{WORK_SLOT} {slot} of {slots} slots")
        named = listed(document["keyHash"], "keyHash")
        key_hash = tuple(c for c in named if isinstance(c, str) and c)
        if not key_hash or len(key_hash) != len(named):
            raise WorkItemError(f"keyHash is {named!r}, not a list of column names")
        flags = [document[k] for k in ("dropUnchangedUpdates", "failOnDataLoss")]
        if not all(type(f) is bool for f in flags):
            raise WorkItemError(f"dropUnchangedUpdates, failOnDataLoss are {flags}, not booleans")
        parts = listed(document["parts"], "parts")
        if not isinstance(schema, bytes):
            raise WorkItemError(f"{WORK_SCHEMA} is {type(schema).__name__}, not bytes")
        try:
            read_schema = pa.ipc.read_schema(pa.py_buffer(schema))
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise WorkItemError(f"{WORK_SCHEMA} is not an Arrow schema ({exc})") from None
        table = document["table"]
        if not isinstance(table, str) or len(table) != 16:
            raise WorkItemError(f"table is {table!r}, not a table digest")
        name = document.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise WorkItemError(f"name is {name!r}, not a table's qualified name")
        unknown = [c for c in key_hash if c != "_rowid" and c not in read_schema.names]
        if unknown:
            raise WorkItemError(f"keyHash names {unknown}, not columns of {WORK_SCHEMA}")
        return cls(
            slot=slot,
            slots=slots,
            planned=whole(planned, WORK_EVENTS),
            kafka_partitions=whole(document["kafkaPartitions"], "kafkaPartitions", 1),
            key_hash=key_hash,
            drop_unchanged_updates=flags[0],
            fail_on_data_loss=flags[1],
            parts=tuple(part_of(p, f"parts[{i}]") for i, p in enumerate(parts)),
            read_schema=read_schema,
            table=table,
            name=name,
        )


def table_digest(path: str) -> str:
    """A short digest of a table's path (not the path: it may hold credentials), so the
    sink can tell that its `table` option names the table the work items are of."""
    return hashlib.sha256(path.rstrip("/").encode()).hexdigest()[:16]


def _document(work: object) -> object:
    if not isinstance(work, str):
        raise WorkItemError(f"{WORK_COLUMN} is {type(work).__name__}, not a string")
    try:
        return json.loads(work)
    except (ValueError, RecursionError):
        raise WorkItemError(f"{WORK_COLUMN} is not JSON: {work!r:.60}") from None


def _foreign(why: WorkItemError) -> WorkItemError:
    return WorkItemError(f"no lance-cdf work item ({why}): {_FIX}")
