"""The Kafka clients of a replicator (one table's, or a database's shared by its tables):
the consumer of the change topics, the schema decoder and the dead-letter producer, their
settings built by `clientconfig.KafkaConnection` from `--consumer-config`; where a
batch's undecodable records go (`DeadLetters`); and the bound on consumers renewed after a
fatal consumer error (`Renewals`, kept for `status` in `<replica>/_lance_cdf/consumer.json`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient

from lance_cdf.errors import ConsumerFatalError, ReplicateError, in_words
from lance_cdf.format.io import local_path
from lance_cdf.kafka.endpoints import check_broker, check_registry
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.kafka.topics import KNOWN
from lance_cdf.ops.clientconfig import KafkaConnection, registry_config, scrub
from lance_cdf.ops.lease import LeaseKeeper
from lance_cdf.ops.state_files import read_json, write_atomic
from lance_cdf.replicate.counters import Counters
from lance_cdf.replicate.writer_schemas import SchemaDecoder

if TYPE_CHECKING:
    from confluent_kafka import Message

    from lance_cdf.replicate.replicate_settings import KafkaSettings

log = logging.getLogger("lance_cdf.replicate")

OnCommit = Callable[[KafkaError | None, list[TopicPartition]], None]

# a replicator's consumer is renewed after a fatal error at most MAX_RENEWALS times within
# RENEW_WINDOW_S: more is another consumer fencing it each time (the same group.instance.id
# given to two replicators), which no new consumer cures
MAX_RENEWALS = 5
RENEW_WINDOW_S = 300.0
RENEWALS_FILE = "consumer.json"  # (in the replica's `_lance_cdf` directory)


def replica_instance_id(group_id: str, target: str) -> str:
    """The static group member id (`group.instance.id`) of the replicator of replica
    `target` in group `group_id`: the same for every process that writes that replica.

    The replica's lease already makes one process its writer, so the group need not
    find out by itself that a killed one is gone: its replacement joins as the same
    static member and is handed the partitions at once, instead of after the dead
    member's session timeout (librdkafka's 45 s)."""
    root = local_path(target)
    where = os.path.abspath(root) if root is not None else target.rstrip("/")
    digest = hashlib.blake2b(f"{group_id}\0{where}".encode(), digest_size=10).hexdigest()
    return f"lance-cdf-replica-{digest}"


def replica_consumer_config(
    connection: KafkaConnection,
    group_id: str,
    on_commit: OnCommit,
    instance_id: str | None = None,
) -> dict[str, Any]:
    """A replicator's consumer: committed transactions only, offsets committed by the
    replicator with the replica's own record of its position; a static member
    `instance_id` of its group where given (`replica_instance_id`; the user's
    `group.instance.id` wins, an empty one makes it a dynamic member)."""
    # a static member stays in its group for its session after it stopped (tools that
    # need the group empty, an offset reset, wait that long): 10 s rather than 45
    static = {"group.instance.id": instance_id, "session.timeout.ms": 10_000} if instance_id else {}
    config = connection.consumer(
        defaults={
            "auto.offset.reset": "earliest",
            # fetches of up to 16 MB per partition: with librdkafka's 1 MB a large
            # batch took markedly longer per record to consume
            "max.partition.fetch.bytes": 16 << 20,
            "fetch.max.bytes": 64 << 20,
            **static,
        },
        fixed={
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "on_commit": on_commit,
        },
    )
    if config.get("group.instance.id") == "":  # (given empty: dynamic membership)
        del config["group.instance.id"]
    return config


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
    kafka: KafkaSettings,
    group_id: str,
    on_commit: OnCommit,
    shared: bool = False,
    instance_id: str | None = None,
) -> ReplicaClients:
    """The clients of `kafka` (the endpoints checked by the caller first): the consumer of
    group `group_id` (static member `instance_id`, if given), the registry (a request
    timeout: the client has none, and a hung registry would hang the replicator for good;
    no retries of its own: an outage is retried, and logged, by SchemaDecoder) and the
    dead-letter producer, if any."""
    connection = KafkaConnection(kafka.bootstrap_servers, kafka.consumer_config or {}, "consumer")
    registry = SchemaRegistryClient(
        registry_config(
            kafka.schema_registry, kafka.registry_config, defaults={"timeout": 10, "max.retries": 0}
        )
    )
    schemas = SchemaDecoder(registry, outage_s=kafka.registry_outage_s)
    consumer = Consumer(replica_consumer_config(connection, group_id, on_commit, instance_id))
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


class Renewals:
    """The consumers a replicator of `target` renewed after a fatal consumer error
    (`ConsumerFatalError`: librdkafka fences a static member whose coordinator moved, and
    the fenced consumer is unusable): counted in `counters`, each said in one line and kept
    for `status`; refused past the bound."""

    def __init__(self, target: str, counters: Counters):
        self.target, self.counters = target, counters
        self._times: list[float] = []

    def allow(self, exc: ConsumerFatalError, prefix: str = "") -> None:
        """Count a renewal after `exc`, or raise it (with why) past the bound."""
        now = time.monotonic()
        self._times = [t for t in self._times if now - t < RENEW_WINDOW_S]
        if len(self._times) >= MAX_RENEWALS:
            raise ConsumerFatalError(
                f"{exc}; {MAX_RENEWALS} new consumers failed so within {RENEW_WINDOW_S:.0f} s "
                "(is another consumer of the group running with the same group.instance.id?)"
            ) from exc
        self._times.append(now)
        self.counters.consumer_restarts += 1
        self.counters.last_error = time.time()
        log.warning(
            "%s%s; a new consumer resumes from the replica's position (nothing lost or "
            "applied twice; consumer restart %d)",
            prefix,
            scrub(str(exc)),
            self.counters.consumer_restarts,
        )
        record_renewals(self.target, self.counters.consumer_restarts, scrub(str(exc)))


def renewals_path(target: str) -> str | None:
    """Where a local replica keeps its renewals (None: a replica on object storage)."""
    root = local_path(target)
    return None if root is None else os.path.join(root, "_lance_cdf", RENEWALS_FILE)


def record_renewals(target: str, restarts: int, error: str) -> None:
    """Keep the last run's consumer restarts for `status` (best effort)."""
    path = renewals_path(target)
    if path is None:
        return
    with contextlib.suppress(OSError):
        document = {"restarts": restarts, "at": time.time(), "error": error}
        write_atomic(path, json.dumps(document), parents=True)


def read_renewals(target: str) -> dict[str, Any] | None:
    """What `record_renewals` kept (None: no consumer was renewed, or not known)."""
    path = renewals_path(target)
    return None if path is None else read_json(path)
