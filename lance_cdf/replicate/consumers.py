"""The Kafka clients of a replicator (one table's, or a database's shared by its tables):
the consumer of the change topics and the dead-letter producer, their settings built by
`clientconfig.KafkaConnection` from `--consumer-config`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Producer, TopicPartition

from lance_cdf.kafka.topics import KNOWN, TopicSettings
from lance_cdf.ops.clientconfig import KafkaConnection


def replica_consumer_config(
    connection: KafkaConnection,
    group_id: str,
    on_commit: Callable[[KafkaError | None, list[TopicPartition]], None],
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
