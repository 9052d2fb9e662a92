"""Transaction metadata: a `BEGIN` and an `END` record per published commit version on the
transaction topic (`<topic>.transaction`, one partition), in Debezium's shape
(`io.debezium.connector.common.TransactionMetadataValue`: `status`, `id`, `event_count`,
`data_collections`, `ts_ms`; key `{id}`), Avro in the Confluent wire format.

`id` is `<prefix>.<table>:<version>` (the records' namespace, e.g. `lancecdf.orders:42`);
`data_collections` has the one table. lance-cdf adds two optional fields Debezium readers
ignore: `lance_cdf_version` (the commit version, a number) and `lance_cdf_partitions`
(per Kafka partition of the change topic: the version's change events there and its
records, tombstones included), which let a consumer (the replicator) know where each
version ends in each partition.

Written exactly once by the Spark sink's driver-side commit, after every writer task of
the micro-batch succeeded: the topic's last record says how far an earlier attempt got
(`TransactionWriter.write`). A commit version with no change event (compaction, an index)
gets no BEGIN/END, except the last version of a micro-batch where the table's definition
changed: the END of that version carries `lance_cdf_table` (`TableDefinition`; which
one and where: `definition_sync.TableDefinitions.change`), with `event_count` 0 and
`lance_cdf_partitions` [] when the version has no events.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from confluent_kafka.schema_registry import SchemaRegistryClient

from lance_cdf.avro.avsc import load_avsc
from lance_cdf.avro.wire import WireWriter, WriterSchemas
from lance_cdf.errors import PublishError, TransactionMetadataError
from lance_cdf.format.definitions import IndexDefinition, TableDefinition
from lance_cdf.kafka import clients
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.kafka.topics import KNOWN
from lance_cdf.ops.clientconfig import KafkaConnection, Setting
from lance_cdf.ops.clientconfig import registry_config as registry_settings

if TYPE_CHECKING:
    from lance_cdf.avro.schema import AvroRecord, AvroSchema

SUFFIX = ".transaction"
# the flags that name another transaction topic, or none (for the messages)
OTHER_TOPIC = "--transaction-topic (or --no-transaction-metadata)"
# The transaction records' schemas: schemas/transaction_key.avsc and transaction.avsc (the
# value; on an END where the table's definition changed, `lance_cdf_table` carries it:
# `TableDefinition`), Debezium's TransactionMetadataKey / Value with lance-cdf's fields
KEY_SCHEMA: AvroSchema = load_avsc("transaction_key")
VALUE_SCHEMA: AvroSchema = load_avsc("transaction")


# given the transaction topic's last record (None: empty), the table's definition to send
# on the END of the micro-batch's last version, or None when its consumers have it already
DefinitionChange = Callable[["TransactionRecord | None"], TableDefinition | None]


def default_topic(topic: str) -> str:
    return topic + SUFFIX


@dataclass
class VersionCounts:
    """One commit version's records on the change topic, per Kafka partition: (change
    events, records with tombstones). Partition -1: the producer chose (unrouted)."""

    version: int
    partitions: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def events(self) -> int:
        return sum(e for e, _ in self.partitions.values())

    def add(self, other: VersionCounts) -> None:
        for p, (e, r) in other.partitions.items():
            e0, r0 = self.partitions.get(p, (0, 0))
            self.partitions[p] = (e0 + e, r0 + r)


class TransactionStatus(StrEnum):
    """A transaction record's `status`: the BEGIN or the END of a commit version."""

    BEGIN = "BEGIN"
    END = "END"


@dataclass(frozen=True)
class TransactionRecord:
    """A decoded BEGIN or END record."""

    status: TransactionStatus
    id: str
    version: int
    event_count: int | None
    # partition -> (events, records); None: not known (unrouted publishing)
    partitions: dict[int, tuple[int, int]] | None
    # the table's definition at this version, on an END where it changed
    definition: TableDefinition | None = None


def merge(counts: list[dict[int, VersionCounts]]) -> list[VersionCounts]:
    """Writer tasks' counts (each a version -> counts map) added up, by version."""
    out: dict[int, VersionCounts] = {}
    for task in counts:
        for v, c in task.items():
            out.setdefault(v, VersionCounts(v)).add(c)
    return [out[v] for v in sorted(out)]


def table_value(d: TableDefinition) -> AvroRecord:
    return {
        "indexes": [
            {
                "name": i.name,
                "index_type": i.index_type,
                "columns": list(i.columns),
                "params": i.params,
            }
            for i in d.indexes
        ],
        "config": dict(d.config),
        "schema_metadata": dict(d.schema_metadata),
        "field_metadata": {k: dict(v) for k, v in d.field_metadata},
    }


def table_definition(rec: AvroRecord) -> TableDefinition:
    return TableDefinition.of(
        [
            IndexDefinition(i["name"], i["index_type"], tuple(i["columns"]), i["params"])
            for i in rec["indexes"]
        ],
        rec["config"],
        rec["schema_metadata"],
        rec["field_metadata"],
    )


def transaction_value(
    status: TransactionStatus,
    namespace: str,
    counts: VersionCounts,
    ts_ms: int,
    definition: TableDefinition | None = None,
) -> AvroRecord:
    """The value record (fastavro's dict) of a BEGIN or an END (`definition`: on an END,
    the table's definition at the version, when it changed)."""
    end = status == TransactionStatus.END
    routed = -1 not in counts.partitions
    return {
        "status": str(status),  # the plain string, as fastavro writes it
        "id": f"{namespace}:{counts.version}",
        "event_count": counts.events if end else None,
        "data_collections": [{"data_collection": namespace, "event_count": counts.events}]
        if end
        else None,
        "ts_ms": ts_ms,
        "lance_cdf_version": counts.version,
        "lance_cdf_partitions": [
            {"partition": p, "event_count": e, "record_count": r}
            for p, (e, r) in sorted(counts.partitions.items())
        ]
        if end and routed
        else None,
        "lance_cdf_table": table_value(definition) if end and definition is not None else None,
    }


class TransactionDecoder:
    """Wire-format transaction values -> `TransactionRecord` (writer schema from the registry)."""

    def __init__(self, registry: SchemaRegistryClient):
        self.registry = registry
        self.writer_schemas = WriterSchemas(self._load)

    def _load(self, schema_id: int) -> Any:
        return json.loads(self.registry.get_schema(schema_id).schema_str or "null")

    def decode(self, payload: bytes) -> TransactionRecord:
        schema_id, rec = self.writer_schemas.read(payload)
        if not isinstance(rec, dict) or rec.get("status") not in tuple(TransactionStatus):
            raise TransactionMetadataError(
                f"a transaction-topic record with schema id {schema_id} is not a BEGIN/END "
                "record; point --transaction-topic at lance-cdf's transaction topic"
            )
        version = rec.get("lance_cdf_version")
        if version is None:  # a writer without the extension: the id's number
            version = int(str(rec["id"]).rsplit(":", 1)[-1])
        parts = rec.get("lance_cdf_partitions")
        table = rec.get("lance_cdf_table")
        return TransactionRecord(
            TransactionStatus(rec["status"]),
            rec["id"],
            int(version),
            rec.get("event_count"),
            None
            if parts is None
            else {
                int(p["partition"]): (int(p["event_count"]), int(p["record_count"])) for p in parts
            },
            None if table is None else table_definition(table),
        )


class TransactionWriter:
    """Writes BEGIN/END records for whole micro-batches, exactly once."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        schema_registry: str,
        namespace: str,
        producer_config: dict[str, Setting] | None = None,
        registry_config: dict[str, Setting] | None = None,
        timeout: float = 60.0,
        topic_settings: TopicSettings | None = None,
    ):
        self.topic, self.namespace, self.timeout = topic, namespace, timeout
        self.connection = KafkaConnection(bootstrap_servers, producer_config or {})
        # made with the change topic's replication factor and settings if missing
        self.topic_settings = (topic_settings or TopicSettings()).for_transactions()
        # the registry client, producer and consumer are the process's, shared by the
        # writers of every table with the same settings (`clients.registry`,
        # `clients.producer`, `clients.consumer`): the commit of a database publisher
        # writes a transaction topic per table
        registry = clients.registry(registry_settings(schema_registry, registry_config))
        self.key_writer = WireWriter(registry, f"{topic}-key", KEY_SCHEMA)
        self.value_writer = WireWriter(registry, f"{topic}-value", VALUE_SCHEMA)
        self.decoder = TransactionDecoder(registry)
        made = clients.producer(
            self.connection.producer(defaults={"enable.idempotence": True, "acks": "all"})
        )
        self.producer = made.producer
        self._failures: list[str] = made.failures
        self._ready = False

    def last(self) -> TransactionRecord | None:
        """The topic's last record (None: empty)."""
        from confluent_kafka import KafkaException, TopicPartition

        consumer = clients.consumer(
            self.connection.consumer(
                fixed={
                    "group.id": "lance-cdf-transaction-writer",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 10,
                }
            )
        )
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, 0), timeout=self.timeout, cached=False
            )
        except KafkaException:
            # as in `PartitionMarks.watermarks`: the shared consumer is never subscribed,
            # so librdkafka does not refresh the topic's metadata by itself; after the
            # partition's leader died it kept answering "Unknown partition" / "Timed out"
            # while another broker led it. The retry (`RideOut`) asks with fresh metadata.
            with contextlib.suppress(KafkaException):
                consumer.list_topics(self.topic, timeout=min(5.0, self.timeout))
            raise
        if high <= low:
            return None
        consumer.assign([TopicPartition(self.topic, 0, high - 1)])
        try:
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is None or m.error() is not None or m.topic() != self.topic:
                    continue  # (a shared consumer: skip what an earlier assignment fetched)
                value = m.value()
                if value is not None:
                    return self.decoder.decode(value)
            with contextlib.suppress(KafkaException):  # the retry fetches with fresh metadata
                consumer.list_topics(self.topic, timeout=min(5.0, self.timeout))
            raise PublishError(
                f"could not read the last record of {self.topic!r} within {self.timeout:.0f}s; "
                "the micro-batch fails and is retried"
            )
        finally:
            consumer.unassign()

    def write(
        self,
        versions: list[VersionCounts],
        definition: DefinitionChange | None = None,
        end: int | None = None,
    ) -> int:
        """BEGIN and END of each version (ascending), skipping what the topic holds; the
        number of records written. Raises when any is not acknowledged.

        `definition` (with `end`, the micro-batch's last version): given the topic's last
        record, the table's definition at `end` if it differs from what the topic's
        consumers know (None: unchanged); it goes on the END of version `end`, a BEGIN/END
        with no events (`lance_cdf_partitions` = []) if that version has no changes."""
        if not versions and (definition is None or end is None):
            return 0
        if not self._ready:
            KNOWN.ensure(
                self.connection,
                self.topic,
                self.topic_settings,
                one_partition=True,
                other=OTHER_TOPIC,
            )
            self._ready = True
        last = self.last()
        table = definition(last) if definition is not None and end is not None else None
        if table is not None and all(c.version != end for c in versions):
            versions = [*versions, VersionCounts(int(end or 0))]  # routed, no events
        now = int(time.time() * 1000)
        sent = 0
        for counts in sorted(versions, key=lambda c: c.version):
            statuses = [TransactionStatus.BEGIN, TransactionStatus.END]
            if last is not None and counts.version <= last.version:
                if counts.version < last.version or last.status == TransactionStatus.END:
                    continue
                statuses = [TransactionStatus.END]  # an earlier attempt stopped between the two
            key = self.key_writer.encode({"id": f"{self.namespace}:{counts.version}"})
            for status in statuses:
                carried = table if counts.version == end else None
                value = self.value_writer.encode(
                    transaction_value(status, self.namespace, counts, now, carried)
                )
                self.producer.produce(self.topic, key=key, value=value, partition=0)
                sent += 1
        left = self.producer.flush(self.timeout)
        failures, self._failures[:] = list(self._failures), []
        if left or failures:
            raise PublishError(
                f"{left} transaction record(s) unacknowledged and {len(failures)} failed on "
                f"{self.topic!r}{': ' + failures[0] if failures else ''}; the micro-batch "
                "fails and is retried"
            )
        return sent
