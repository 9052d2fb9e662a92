"""The Kafka clients of a replicator (one table's, or a database's shared by its tables):
the consumer of the change topics, the schema decoder and the dead-letter producer, their
settings built by `clientconfig.KafkaConnection` from `--consumer-config`; and where a
batch's undecodable records go (`DeadLetters`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient

from lance_cdf.errors import ReplicateError, in_words
from lance_cdf.kafka.endpoints import check_broker, check_registry
from lance_cdf.kafka.topics import KNOWN, TopicSettings
from lance_cdf.ops.clientconfig import KafkaConnection, registry_config, scrub
from lance_cdf.ops.lease import LeaseKeeper
from lance_cdf.replicate.counters import Counters
from lance_cdf.replicate.writer_schemas import SchemaDecoder

if TYPE_CHECKING:
    from confluent_kafka import Message

    from lance_cdf.replicate.replicate_settings import KafkaSettings

log = logging.getLogger("lance_cdf.replicate")

OnCommit = Callable[[KafkaError | None, list[TopicPartition]], None]


def replica_consumer_config(
    connection: KafkaConnection, group_id: str, on_commit: OnCommit
) -> dict[str, Any]:
    """A replicator's consumer: committed transactions only, offsets committed by the
    replicator with the replica's own record of its position."""
    return connection.consumer(
        defaults={
            "auto.offset.reset": "earliest",
            # fetches of up to 16 MB per partition: with librdkafka's 1 MB a large
            # batch took markedly longer per record to consume
            "max.partition.fetch.bytes": 16 << 20,
            "fetch.max.bytes": 64 << 20,
        },
        fixed={
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "on_commit": on_commit,
        },
    )


def dead_letter_producer(connection: KafkaConnection, topic: str) -> Producer:
    """The producer of undecodable records, its topic made first if missing (the
    broker's partitions and replication factor)."""
    KNOWN.ensure(connection, topic, TopicSettings(), other="--dead-letter-topic")
    return Producer(connection.producer(fixed={"acks": "all"}))


def check_endpoints(kafka: KafkaSettings) -> None:
    """The broker and the registry answer these settings (else an error naming why)."""
    check_broker(kafka.bootstrap_servers, kafka.consumer_config, flag="consumer")
    check_registry(kafka.schema_registry, kafka.registry_config)


@dataclass
class ReplicaClients:
    """The Kafka and registry clients of a replicator: one table's own, or a database
    replicator's shared by its tables' `Replicator`s (`shared`: its one consumer is assigned
    partitions of every table's topics and polled by the database replicator)."""

    connection: KafkaConnection
    consumer: Consumer
    schemas: SchemaDecoder
    dead_letters: Producer | None = None
    leases: LeaseKeeper | None = None  # (shared) one keep-alive thread for every table's lease
    shared: bool = False


def open_clients(
    kafka: KafkaSettings, group_id: str, on_commit: OnCommit, shared: bool = False
) -> ReplicaClients:
    """The clients of `kafka` (the endpoints checked by the caller first): the consumer of
    group `group_id`, the registry (a request timeout: the client has none, and a hung
    registry would hang the replicator for good; no retries of its own: an outage is
    retried, and logged, by SchemaDecoder) and the dead-letter producer, if any."""
    connection = KafkaConnection(kafka.bootstrap_servers, kafka.consumer_config or {}, "consumer")
    registry = SchemaRegistryClient(
        registry_config(
            kafka.schema_registry, kafka.registry_config, defaults={"timeout": 10, "max.retries": 0}
        )
    )
    schemas = SchemaDecoder(registry, outage_s=kafka.registry_outage_s)
    consumer = Consumer(replica_consumer_config(connection, group_id, on_commit))
    topic = kafka.dead_letter_topic
    producer = dead_letter_producer(connection, topic) if topic else None
    return ReplicaClients(
        connection, consumer, schemas, producer, LeaseKeeper() if shared else None, shared
    )


class DeadLetters:
    """Where a topic's undecodable records go: copied to the dead-letter `topic` with the
    error in a header, or (no topic) nowhere: the first stops the replicator."""

    def __init__(
        self, source: str, topic: str | None, producer: Producer | None, counters: Counters
    ):
        self.source, self.counters = source, counters
        self.topic: str | None = topic if producer is not None else None  # (set together)
        self.producer: Producer | None = producer if topic else None

    def send(self, m: Message, exc: Exception) -> None:
        where = f"partition {m.partition()} offset {m.offset()} of {self.source!r}"
        error = scrub(in_words(exc))  # (a record header: no secret in it)
        if self.producer is None or self.topic is None:
            raise ReplicateError(
                f"cannot decode the record at {where}: {error}. Nothing of its batch was "
                "applied. Fix the producer; or run with --dead-letter-topic to set such "
                "records aside and go on (they are then not applied: the replica lacks them "
                "until they are replayed)."
            ) from exc
        headers: list[tuple[str, str | bytes | None]] = [
            ("lance-cdf.error", error.encode()),
            ("lance-cdf.source", where.encode()),
        ]
        self.producer.produce(self.topic, key=m.key(), value=m.value(), headers=headers)
        if self.producer.flush(30):
            self.counters.failed()
            raise ReplicateError(
                f"could not write the record at {where} to the dead-letter topic "
                f"{self.topic!r}; nothing of its batch was applied"
            )
        self.counters.dead_letters += 1
        log.warning("record at %s sent to %s: %s", where, self.topic, error)
