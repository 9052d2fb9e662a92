"""Publish change events to Kafka as Avro (Confluent wire format, schema registry).

`KafkaChangePublisher` turns Arrow event batches into Debezium-style records
and produces them with an idempotent producer, waiting for every delivery
report: a batch returns only when all its records are acknowledged, and raises
otherwise, so the caller (a Spark task) fails and is retried. Records are
deterministic for a given commit, so a retried micro-batch produces the same
records again: duplicates are possible, gaps and per-key reordering are not.

The Spark sink (`format("lance-cdf-kafka")`, sink.py) calls it from the executors, so
serialisation happens next to the data, in bulk per Arrow batch, never row by row on
the driver.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import pyarrow as pa
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from lance_cdf import __version__
from lance_cdf.avro.encode import Unsupported, can_encode, encode_changes
from lance_cdf.avro.schema import TableName, change_records, envelope_schema, key_schema
from lance_cdf.avro.wire import WireWriter
from lance_cdf.errors import LanceCdfError
from lance_cdf.kafka.endpoints import PublishError
from lance_cdf.read import META_COLUMNS

DEFAULT_PRODUCER = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": 20,
    "batch.num.messages": 10000,
    "queue.buffering.max.messages": 500000,
}


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
        producer_config: dict | None = None,
        registry_config: dict | None = None,
        flush_timeout: float = 60.0,
    ):
        self.topic = topic
        self.user_schema = user_schema
        self.user_columns = list(user_schema.names)
        self.vectorised = can_encode(user_schema)
        self.table_name = TableName.of(table_name)  # record names, source.name/db/table
        self.key_columns = key_columns
        self.tombstones = tombstones
        self.flush_timeout = flush_timeout
        self.registry = SchemaRegistryClient({"url": schema_registry, **(registry_config or {})})
        self.value_writer = WireWriter(
            self.registry, f"{topic}-value", envelope_schema(user_schema, table_name)
        )
        self.key_writer = WireWriter(
            self.registry, f"{topic}-key", key_schema(user_schema, key_columns, table_name)
        )
        self.producer = Producer(
            {"bootstrap.servers": bootstrap_servers, **DEFAULT_PRODUCER, **(producer_config or {})}
        )
        self._failures: list[str] = []  # delivery errors since the last flush

    def publish(self, events: pa.Table, operations: dict[int, str]) -> int:
        """Produce one record per change (plus tombstones) and wait for all acks."""
        sent = self.send(events, operations)
        self.flush()
        return sent

    def send(self, events: pa.Table, operations: dict[int, str]) -> int:
        """Hand the batch's records to the producer without waiting for acks; `flush()`
        waits for them (a micro-batch sends all its Arrow batches, then flushes once)."""
        now_ms = int(time.time() * 1000)
        failures = self._failures

        def on_delivery(err, msg):
            if err is not None:
                failures.append(f"{err} (partition {msg.partition()})")

        sent = 0
        try:
            encoded = self._encode(events, operations, now_ms)
            if encoded is not None:  # vectorised: the wire-format bytes of every record
                keys, values = encoded.keys.to_pylist(), encoded.values.to_pylist()
                tombstones = (encoded.tombstone & self.tombstones).tolist()
                for key_bytes, value_bytes, tombstone in zip(keys, values, tombstones, strict=True):
                    self._produce(key_bytes, value_bytes, on_delivery)
                    sent += 1
                    if tombstone:
                        self._produce(key_bytes, None, on_delivery)
                        sent += 1
            else:
                records = change_records(
                    events, self.user_columns, operations, self.table_name,
                    self.key_columns, __version__, now_ms,
                )  # fmt: skip
                for key, value, meta in records:
                    key_bytes = self.key_writer.encode(key)
                    self._produce(key_bytes, self.value_writer.encode(value), on_delivery)
                    sent += 1
                    if meta["tombstone"] and self.tombstones:
                        self._produce(key_bytes, None, on_delivery)
                        sent += 1
        except Exception as exc:
            if isinstance(exc, LanceCdfError):
                raise
            raise PublishError(
                f"could not publish to {self.topic!r}: {type(exc).__name__}: {exc}. If the "
                "registry rejected the schema, the table's schema changed in a way its "
                "compatibility rules forbid; publish to a new topic or relax the subject's "
                "compatibility."
            ) from exc
        return sent

    def begin(self) -> None:
        """Start a micro-batch: let records of an earlier, failed attempt drain and forget
        their errors (the whole micro-batch is sent again)."""
        self.producer.flush(self.flush_timeout)
        self._failures.clear()

    def flush(self) -> None:
        """Wait until every record sent is acknowledged; any failure or a timeout raises
        (the micro-batch fails and Spark retries it)."""
        left = self.producer.flush(self.flush_timeout)
        failures, self._failures[:] = list(self._failures), []
        if left or failures:
            raise PublishError(
                f"{left} record(s) unacknowledged after {self.flush_timeout:.0f}s and "
                f"{len(failures)} delivery failure(s) on {self.topic!r}"
                f"{': ' + failures[0] if failures else ''}; the micro-batch fails and is retried."
            )

    def _encode(self, events: pa.Table, operations: dict[int, str], now_ms: int):
        """Keys and values of the batch in the wire format, vectorised; None when the
        batch needs the fastavro path (a column type or value it does not handle)."""
        if not self.vectorised or not events.num_rows:
            return None
        try:
            return encode_changes(
                events, self.user_schema, operations, self.table_name, self.key_columns,
                __version__, now_ms, key_prefix=self.key_writer.wire_header(),
                value_prefix=self.value_writer.wire_header(),
            )  # fmt: skip
        except Unsupported:
            return None

    def _produce(self, key: bytes, value: bytes | None, on_delivery) -> None:
        while True:
            try:
                self.producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self.producer.poll(0.5)


def user_schema_of(events_schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in events_schema if f.name not in META_COLUMNS])


def carry_update_pairs(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """Re-chunk batches so an update's preimage and postimage are never split."""
    carry: pa.Table | None = None
    for batch in batches:
        table = pa.Table.from_batches([batch])
        if carry is not None:
            table = pa.concat_tables([carry, table])
            carry = None
        if table.num_rows and table["_change_type"][-1].as_py() == "update_preimage":
            carry, table = table.slice(table.num_rows - 1), table.slice(0, table.num_rows - 1)
        if table.num_rows:
            yield table
    if carry is not None:
        yield carry
