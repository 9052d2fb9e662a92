"""Publish change events to Kafka as Avro (Confluent wire format, schema registry).

`KafkaChangePublisher` turns Arrow event batches into Debezium-style records
and produces them with an idempotent producer, waiting for every delivery
report: a batch returns only when all its records are acknowledged, and raises
otherwise, so the caller (a Spark task) fails and is retried. Records are
deterministic for a given commit, so a retried micro-batch produces the same
records again: duplicates are possible, gaps and per-key reordering are not.

The Spark sink (`format("lance-cdf-kafka")`, `LanceCdfKafkaSink`) calls it from the executors, so
serialisation happens next to the data, in bulk per Arrow batch, never row by row on
the driver.
"""

from __future__ import annotations

import operator
import time
from collections import deque
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException

from lance_cdf import __version__
from lance_cdf.avro.encode import EncodedChanges, RecordShape, can_encode, encode_changes
from lance_cdf.avro.names import TableName
from lance_cdf.avro.schema import (
    OPS,
    TOTAL_ORDER,
    change_records,
    envelope_schema,
    key_schema,
)
from lance_cdf.avro.wire import WireWriter
from lance_cdf.core.change_types import ChangeType
from lance_cdf.core.events import META_COLUMNS
from lance_cdf.core.stream_columns import EVENT_ORDER, PARTITION_COLUMN
from lance_cdf.errors import (
    AvroEncodeDeclined,
    KafkaUnavailableError,
    LanceCdfError,
    PublishError,
    in_words,
)
from lance_cdf.kafka import clients
from lance_cdf.kafka.marks import POSITION_HEADER, PartitionMarks, Position
from lance_cdf.kafka.outage import FLUSH_TIMEOUT_S, RIDE_OUT_S, RideOut
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.kafka.topics import KNOWN
from lance_cdf.kafka.transactions import VersionCounts
from lance_cdf.ops.clientconfig import KafkaConnection
from lance_cdf.ops.clientconfig import registry_config as registry_settings

DEFAULT_PRODUCER = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": 20,
    "batch.num.messages": 10000,
    "queue.buffering.max.messages": 500000,
    # a delivery callback per failed record only: a Python call per acknowledged record
    # costs CPU on the writer's one core, and only failures are acted on
    # (docs/benchmarks.md, "Inside the publisher")
    "delivery.report.only.error": True,
}
# Record headers a consumer can filter on without decoding Avro: the commit version (decimal
# ASCII) and the Debezium op ("c", "u", "d", "r"; "tombstone" on a delete's tombstone).
VERSION_HEADER = "lance-cdf.commit-version"
OP_HEADER = "lance-cdf.op"
# a record's headers as the producer takes them (values: bytes here), in this order:
# version, op, then (routed streams) position
Headers = dict[str, str | bytes | None]
# the change types that make a record, an index into it per record (`BatchRecords.ops`)
OP_KINDS = list(OPS)
# each op's group in a record's position: 0 deletes, 1 updates, 2 inserts and snapshot reads
_GROUPS = np.array(
    [0 if k == ChangeType.DELETE else 1 if k == ChangeType.UPDATE_POST else 2 for k in OP_KINDS]
)


def _record_rows(events: pa.Table) -> pa.Array:
    """True for the events that make a record (all but update preimages)."""
    kinds = events["_change_type"]
    if pa.types.is_dictionary(kinds.type):
        kinds = kinds.cast(pa.string())
    return pc.invert(pc.equal(kinds, ChangeType.UPDATE_PRE).fill_null(False))


def commit_order(events: pa.Table) -> pa.Table:
    """A routed writer task's events (runs from several source partitions, in the order
    the shuffle delivered them) in commit order: commit version; deletes, updates, inserts;
    then `_event_order`. An update's two images are adjacent in `_event_order` and stay so."""
    if EVENT_ORDER not in events.column_names or not events.num_rows:
        return events
    kinds = events["_change_type"]
    if pa.types.is_dictionary(kinds.type):
        kinds = kinds.cast(pa.string())
    group = np.full(events.num_rows, 2, np.int8)
    group[pc.equal(kinds, ChangeType.DELETE).fill_null(False).to_numpy(zero_copy_only=False)] = 0
    group[pc.starts_with(kinds, "update").fill_null(False).to_numpy(zero_copy_only=False)] = 1
    version = events["_commit_version"].to_numpy()
    order = events[EVENT_ORDER].to_numpy()
    idx = np.lexsort((order, group, version))
    if (idx[1:] > idx[:-1]).all():
        return events  # already in order (one run)
    return events.take(idx)


@dataclass(frozen=True)
class BatchRecords:
    """What the publisher needs of a batch's records (one per event, an update's two images
    together) besides their Avro, each taken from the events' columns once: commit version,
    op (an index into `OP_KINDS`; an unknown change type counts as an insert here, and the
    encoder refuses it), Kafka partition (-1: the producer's choice) and, on a routed
    stream, position (version, group, `_event_order`; int64 (n, 3))."""

    versions: np.ndarray
    ops: np.ndarray
    partitions: np.ndarray
    positions: np.ndarray | None

    @classmethod
    def of(cls, events: pa.Table) -> BatchRecords:
        rows = _record_rows(events)
        kinds = events["_change_type"]
        if pa.types.is_dictionary(kinds.type):
            kinds = kinds.cast(pa.string())
        kinds = pc.filter(kinds, rows)
        ops = pc.index_in(kinds, value_set=pa.array(OP_KINDS)).fill_null(0).to_numpy()
        versions = pc.filter(events["_commit_version"], rows).to_numpy().astype(np.int64)
        if PARTITION_COLUMN in events.column_names:
            parts = pc.filter(events[PARTITION_COLUMN], rows).fill_null(-1).to_numpy()
            partitions = parts.astype(np.int64)
        else:
            partitions = np.full(len(versions), -1, np.int64)
        positions = None
        if EVENT_ORDER in events.column_names:
            positions = np.empty((len(versions), 3), np.int64)
            positions[:, 0] = versions
            positions[:, 1] = _GROUPS[ops]
            positions[:, 2] = pc.filter(events[EVENT_ORDER], rows).to_numpy()
        return cls(versions, ops, partitions, positions)

    def __len__(self) -> int:
        return len(self.versions)


def _after(positions: np.ndarray, sub: int, marks: np.ndarray) -> np.ndarray:
    """Lexicographically (positions, sub) > marks, row by row (marks (n, 4); -1: none)."""
    v, g, o = positions[:, 0], positions[:, 1], positions[:, 2]
    mv, mg, mo, ms = marks[:, 0], marks[:, 1], marks[:, 2], marks[:, 3]
    return cast(
        np.ndarray,
        (v > mv) | (v == mv) & ((g > mg) | (g == mg) & ((o > mo) | (o == mo) & (sub > ms))),
    )


def _objects(items: Iterable[Any], n: int) -> np.ndarray:
    """`items` as a 1-d object array (a tuple or list item stays one element)."""
    return np.fromiter(items, dtype=object, count=n)


def record_headers(records: BatchRecords, tombstone: bool = False) -> list[Headers]:
    """The headers of each record (`tombstone`: of its tombstone), in record order, with no
    Python code run per record: one shared dict per (version, op), taken per record by an
    array index, merged (`map` over `|`) with a dict of the record's position, its value built
    in Arrow. A dict holding only strings and bytes is not tracked by the garbage collector:
    a list or tuple per record is, and making them sets off collections over the whole heap
    (docs/benchmarks.md, "Inside the publisher")."""
    uniq, inverse = np.unique(records.versions, return_inverse=True)
    ops = [b"tombstone"] if tombstone else [OPS[kind].encode() for kind in OP_KINDS]
    shared = [{VERSION_HEADER: str(v).encode(), OP_HEADER: op} for v in uniq.tolist() for op in ops]
    which = inverse.reshape(-1) * len(ops) + (0 if tombstone else records.ops)
    heads: list[Headers] = _objects(shared, len(shared))[which].tolist()
    if records.positions is None:
        return heads
    values = position_values(records.positions, 1 if tombstone else 0)
    return list(map(operator.or_, heads, map(dict.fromkeys, repeat((POSITION_HEADER,)), values)))


def position_values(positions: np.ndarray, sub: int) -> list[bytes]:
    """The `POSITION_HEADER` value ("v.g.o.sub", ASCII) of each record (sub 0) or of its
    tombstone (sub 1), built in Arrow rather than one Python string per record."""
    digits = [pa.array(positions[:, i]).cast(pa.string()) for i in range(3)]
    joined = pc.binary_join_element_wise(*digits, pa.scalar(str(sub)), ".")
    values: list[bytes] = joined.cast(pa.binary()).to_pylist()
    return values


@dataclass(frozen=True)
class PublisherSettings:
    """A publisher's client settings: the producer's and the schema registry client's
    (passed through; `clients.producer` and `clients.registry` share those of equal
    settings), how its topic is made if missing (`TopicSettings`), how long a flush or a
    read of the partitions' last records waits, how long a broker outage is ridden out and
    the checkpoint its state goes to (`RideOut`; None: none kept)."""

    producer_config: dict[str, Any] = field(default_factory=dict)
    registry_config: dict[str, Any] = field(default_factory=dict)
    topic_settings: TopicSettings = field(default_factory=TopicSettings)
    flush_timeout_s: float = FLUSH_TIMEOUT_S
    checkpoint: str | None = None
    ride_out_s: float = RIDE_OUT_S


class KafkaChangePublisher:
    """Produces the change events of one table to one topic."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        schema_registry: str,
        user_schema: pa.Schema,
        table_name: str | TableName,
        key_columns: list[str] | None = None,
        tombstones: bool = True,
        settings: PublisherSettings | None = None,
    ):
        settings = settings or PublisherSettings()
        self.topic = topic
        # how the topic is made if missing, before the first record (`TopicSettings`);
        # `topic_ready`: known to exist (set once made sure of, or by a caller that knows)
        self.topic_settings = settings.topic_settings
        self.topic_ready = False
        self.user_schema = user_schema
        self.user_columns = list(user_schema.names)
        self.vectorised = can_encode(user_schema)
        self.table_name = TableName.of(table_name)  # record names, source.name/db/table
        self.key_columns = key_columns
        self.tombstones = tombstones
        self.flush_timeout = settings.flush_timeout_s
        # a broker outage is ridden out (`RideOut`); its state goes to the checkpoint
        self.ride_out = RideOut.of(bootstrap_servers, settings)
        # the registry client, the producer and the marks consumer are the process's, shared
        # by every table's publisher with the same settings (`clients.registry`,
        # `clients.producer`, `clients.consumer`)
        self.registry = clients.registry(
            registry_settings(schema_registry, settings.registry_config)
        )
        self.value_writer = WireWriter(
            self.registry, f"{topic}-value", envelope_schema(user_schema, table_name)
        )
        self.key_writer = WireWriter(
            self.registry, f"{topic}-key", key_schema(user_schema, key_columns, table_name)
        )
        self.connection = KafkaConnection(bootstrap_servers, settings.producer_config)
        shared = clients.producer(self.connection.producer(defaults=DEFAULT_PRODUCER))
        self.producer = shared.producer
        # delivery errors since the last flush (producer-wide: no callback object per record)
        self._failures: list[str] = shared.failures
        # exactly-once bookkeeping (routed streams): the last position sent to each partition
        # since the last flush, and each partition's high-water mark as known after this
        # publisher's last successful flush (`PartitionMarks`)
        self._sent_last: dict[int, Position] = {}
        self.marks = PartitionMarks(topic, self.connection, self.flush_timeout)
        # per commit version: its records per partition since `begin()`, sent or (on a
        # replay) skipped, for the transaction metadata (`TransactionWriter`)
        self.version_counts: dict[int, VersionCounts] = {}

    def publish(self, events: pa.Table, operations: dict[int, str]) -> int:
        """Produce one record per change (plus tombstones) and wait for all acks."""
        sent = self.send(events, operations)
        self.flush()
        return sent

    def send(
        self,
        events: pa.Table,
        operations: dict[int, str],
        marks: dict[int, Position | None] | None = None,
    ) -> int:
        """Hand the batch's records to the producer without waiting for acks; `flush()`
        waits for them (a micro-batch sends all its Arrow batches, then flushes once).

        `marks` (routed streams): partition -> the position of its last record
        (`high_water_marks`); records at or below their partition's mark are not sent
        again, and `flush()` remembers where each partition ends. None: at least once."""
        now_ms = int(time.time() * 1000)
        self.ensure_topic()
        try:
            records = BatchRecords.of(events) if events.num_rows else None
            if not records:
                return 0
            n, positions = len(records), records.positions
            send_record = send_tomb = np.ones(n, bool)
            if positions is not None and marks:
                m = np.full((n, 4), -1, np.int64)
                for p, mark in marks.items():
                    if mark is not None:
                        m[records.partitions == p] = mark
                send_record, send_tomb = _after(positions, 0, m), _after(positions, 1, m)
            keys, values, tombstones = self._keys_values(events, operations, now_ms, send_record)
            self._count(records, tombstones)
            tombs = tombstones & send_tomb
            self._send(keys, values, records, send_record, tombs)
            if positions is not None and marks is not None:  # exactly once: see flush()
                self._remember_last(records, send_record, tombs)
            return int(send_record.sum() + tombs.sum())
        except Exception as exc:
            if isinstance(exc, LanceCdfError):
                raise
            raise PublishError(
                f"could not publish to {self.topic!r}: {in_words(exc)}. If the "
                "registry rejected the schema, the table's schema changed in a way its "
                "compatibility rules forbid; publish to a new topic or relax the subject's "
                "compatibility."
            ) from exc

    def _keys_values(
        self,
        events: pa.Table,
        operations: dict[int, str],
        now_ms: int,
        send_record: np.ndarray,
    ) -> tuple[list[bytes], list[bytes | None], np.ndarray]:
        """Each record's key and value in the wire format, and whether a tombstone follows
        it: vectorised (`_encode`), or through fastavro for a batch it declines (values
        encoded only where `send_record`)."""
        encoded = self._encode(events, operations, now_ms)
        if encoded is not None:
            keys: list[bytes] = encoded.keys.to_pylist()
            values: list[bytes | None] = encoded.values.to_pylist()
            return keys, values, encoded.tombstone & self.tombstones
        records = list(
            change_records(
                events,
                self.user_columns,
                operations,
                self.table_name,
                self.key_columns,
                __version__,
                now_ms,
            )
        )
        keys = [self.key_writer.encode(key) for key, _, _ in records]
        values = [
            self.value_writer.encode(value) if rec else None
            for (_, value, _), rec in zip(records, send_record.tolist(), strict=True)
        ]
        tombstones = np.array([meta["tombstone"] for _, _, meta in records], bool)
        return keys, values, tombstones & self.tombstones

    def _count(self, records: BatchRecords, tombstones: np.ndarray) -> None:
        """Add the batch's records (and tombstones) per (version, partition) to
        `version_counts`, whether sent or skipped as already held."""
        # one 1-d key per (version, partition): partitions (and -1) below 2**20
        pairs, inverse, events_n = np.unique(
            records.versions * (1 << 20) + records.partitions + 1,
            return_inverse=True,
            return_counts=True,
        )
        tombs = np.bincount(inverse.reshape(-1), weights=tombstones, minlength=len(pairs))
        for pair, e, t in zip(pairs.tolist(), events_n.tolist(), tombs.tolist(), strict=True):
            version, part = pair >> 20, (pair & ((1 << 20) - 1)) - 1
            counts = self.version_counts.setdefault(version, VersionCounts(version))
            counts.add(VersionCounts(version, {part: (e, e + int(t))}))

    def _send(
        self,
        keys: list[bytes],
        values: list[bytes | None],
        records: BatchRecords,
        send_record: np.ndarray,
        tombs: np.ndarray,
    ) -> None:
        """Produce each record (where `send_record`) and its tombstone (where `tombs`), in
        record order: the records and tombstones are interleaved with array operations,
        then `_produce_all` queues them."""
        headers = record_headers(records)
        if send_record.all() and not tombs.any():  # the common case: every record, no tombstone
            self._produce_all(keys, values, records.partitions.tolist(), headers)
            return
        n = len(records)
        # slot 2i: record i, 2i + 1: its tombstone
        slots = np.flatnonzero(np.column_stack((send_record, tombs)).reshape(-1))
        row, tomb = slots // 2, slots % 2 == 1
        heads = _objects(headers, n)[row]
        heads[tomb] = _objects(record_headers(records, tombstone=True), n)[row[tomb]]
        out_values = _objects(values, n)[row]
        out_values[tomb] = None
        self._produce_all(
            _objects(keys, n)[row].tolist(),
            out_values.tolist(),
            records.partitions[row].tolist(),
            heads.tolist(),
        )

    def _produce_all(
        self,
        keys: list[bytes],
        values: list[bytes | None],
        partitions: list[int],
        headers: list[Headers],
    ) -> None:
        """Queue the records in order, `produce` called by `map` with positional arguments
        (topic, value, key, partition, callback, on_delivery, timestamp, headers): no Python
        code runs per record. Delivery errors come to the producer-wide callback. When the
        local queue is full, the record refused is the one before what remains of the
        iterators; it is queued once deliveries drained (`_produce`), and the rest follow."""
        produce, topic = self.producer.produce, self.topic
        rest = iter(keys)
        args = (iter(values), rest, iter(partitions), repeat(None), repeat(None), repeat(0))
        heads = iter(headers)
        while True:
            try:
                deque(map(produce, repeat(topic), *args, heads), maxlen=0)
                return
            except BufferError:
                i = len(keys) - operator.length_hint(rest) - 1
                self._produce(keys[i], values[i], headers[i], partitions[i])

    def _remember_last(
        self, records: BatchRecords, send_record: np.ndarray, tombs: np.ndarray
    ) -> None:
        """The position of the last record sent to each partition (its tombstone's when it
        has one), for `flush()`."""
        sent = np.flatnonzero(send_record | tombs)
        if not len(sent) or records.positions is None:
            return
        parts = records.partitions[sent]
        # the last index per partition: unique over the reversed order
        uniq, first = np.unique(parts[::-1], return_index=True)
        for part, i in zip(uniq.tolist(), sent[::-1][first].tolist(), strict=True):
            self._sent_last[part] = (*records.positions[i].tolist(), 1 if tombs[i] else 0)

    def ensure_topic(self) -> None:
        """Create the topic first if it does not exist (once per process and topic)."""
        if self.topic_ready:
            return
        self.ride_out.call(
            "making sure of the topic",
            lambda: KNOWN.ensure(self.connection, self.topic, self.topic_settings),
            (KafkaUnavailableError,),
        )
        self.topic_ready = True

    def high_water_marks(self, partitions: Collection[int]) -> dict[int, Position | None]:
        """Each partition's high-water mark (`PartitionMarks.read`), retried while the
        broker does not answer (`RideOut.call`)."""
        self.ensure_topic()
        return self.ride_out.call(
            "reading the partitions' last records",
            lambda: self.marks.read(partitions),
            (KafkaException, PublishError),
        )

    def close(self) -> None:
        """Forget this publisher's view of its partitions; its clients are the process's
        (`clients.close_all`)."""
        self.marks.forget()

    def begin(self) -> None:
        """Start a micro-batch: let records of an earlier, failed attempt drain and forget
        their errors (the whole micro-batch is sent again)."""
        self.producer.flush(self.flush_timeout)
        self._failures.clear()
        self._sent_last.clear()
        self.version_counts.clear()

    def flush(self) -> None:
        """Wait until every record sent is acknowledged; any failure raises (the micro-batch
        fails). Records still queued (not failed) after `flush_timeout` are waited for as
        long as an outage is ridden out (`RideOut`): the idempotent producer delivers
        them in order once the broker answers, or fails them after message.timeout.ms."""
        left = self.producer.flush(self.flush_timeout)
        while left and not self._failures:
            try:
                self.ride_out.waiting(f"{left} record(s) not acknowledged", self.flush_timeout)
            except PublishError:  # past the budget: what the partitions hold is unknown
                self.marks.forget()
                raise
            left = self.producer.flush(self.flush_timeout)
        if not left:
            self.ride_out.answered()
        failures, self._failures[:] = list(self._failures), []
        sent_last, self._sent_last = self._sent_last, {}
        if left or failures:
            self.marks.forget()  # what the partitions hold is unknown: read them again
            raise PublishError(
                f"{left} record(s) unacknowledged after {self.flush_timeout:.0f}s and "
                f"{len(failures)} delivery failure(s) on {self.topic!r}"
                f"{': ' + failures[0] if failures else ''}; the micro-batch fails and is retried."
            )
        self.marks.settle(sent_last)  # every record is in: each partition written ends there

    def _encode(
        self, events: pa.Table, operations: dict[int, str], now_ms: int
    ) -> EncodedChanges | None:
        """Keys and values of the batch in the wire format, vectorised; None when the
        batch needs the fastavro path (a column type or value it does not handle)."""
        if not self.vectorised or not events.num_rows:
            return None
        try:
            shape = RecordShape(
                self.user_schema,
                self.table_name,
                self.key_columns,
                __version__,
                key_prefix=self.key_writer.wire_header(),
                value_prefix=self.value_writer.wire_header(),
            )
            return encode_changes(events, shape, operations, now_ms)
        except AvroEncodeDeclined:
            return None

    def _produce(
        self,
        key: bytes,
        value: bytes | None,
        headers: Headers | None = None,
        partition: int = -1,
    ) -> None:
        while True:
            try:
                self.producer.produce(
                    self.topic, key=key, value=value, partition=partition, headers=headers
                )
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self.producer.poll(0.5)


def user_schema_of(events_schema: pa.Schema) -> pa.Schema:
    return pa.schema(
        [
            f
            for f in events_schema
            if f.name not in META_COLUMNS + [PARTITION_COLUMN, EVENT_ORDER, TOTAL_ORDER]
        ]
    )


def carry_update_pairs(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """Re-chunk batches so an update's preimage and postimage are never split."""
    carry: pa.Table | None = None
    for batch in batches:
        table = pa.Table.from_batches([batch])
        if carry is not None:
            table = pa.concat_tables([carry, table])
            carry = None
        if table.num_rows and table["_change_type"][-1].as_py() == ChangeType.UPDATE_PRE:
            carry, table = table.slice(table.num_rows - 1), table.slice(0, table.num_rows - 1)
        if table.num_rows:
            yield table
    if carry is not None:
        yield carry
