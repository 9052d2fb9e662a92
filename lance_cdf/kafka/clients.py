"""The Kafka and schema-registry clients one process shares across tables.

A database publisher writes a topic per table, and a writer task or the driver's commit
meets tables one after another. Creating a producer, a consumer, an admin client or a
registry client per table cost every table's first use its connections (and kept up to 32
producers with their threads and buffers per process): here one of each per setting, for
the process's life. A table's own state (its schemas, its partitions' high-water marks,
its counts) stays with its `KafkaChangePublisher` / `TransactionWriter`.

Sharing keeps every guarantee: the idempotent producer numbers records per partition
(a topic's partitions are as ordered through a shared producer as through their own),
and a Python worker runs one task or one commit at a time, each table's records flushed
(every one acknowledged, or the micro-batch fails) before the next table's are sent, so a
delivery failure collected by the shared callback is always the current table's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from lance_cdf.format.cache import LruCache
from lance_cdf.ops.clientconfig import Setting

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.schema_registry import SchemaRegistryClient

# A client's key: its settings, sorted (values as strings; callbacks are not settings)
Key = tuple[tuple[str, str], ...]
_Client = TypeVar("_Client")


def _key(config: Mapping[str, Setting]) -> Key:
    return tuple(sorted((str(k), str(v)) for k, v in config.items()))


@dataclass
class SharedProducer:
    """A producer and the delivery failures its callback collected since they were last
    taken (one callback for the producer: none per record)."""

    producer: Producer
    failures: list[str] = field(default_factory=list)


# Clients kept per kind, least recently used out: one per distinct setting, so a few in
# practice (a client dropped here stays with whoever holds it, until they let it go).
KEPT = 32
_PRODUCERS: LruCache[Key, SharedProducer] = LruCache(KEPT)
_CONSUMERS: LruCache[Key, Consumer] = LruCache(KEPT)
_ADMINS: LruCache[Key, AdminClient] = LruCache(KEPT)
_REGISTRIES: LruCache[Key, SchemaRegistryClient] = LruCache(KEPT)
_LOCK = threading.Lock()  # (one client made per setting, whichever thread asks first)


def producer(config: Mapping[str, Setting]) -> SharedProducer:
    """This process's producer with `config` (created on first use)."""

    def make(settings: dict[str, Setting]) -> SharedProducer:
        from confluent_kafka import KafkaError, Message, Producer

        failures: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(f"{err} (topic {msg.topic()} partition {msg.partition()})")

        return SharedProducer(Producer({**settings, "on_delivery": on_delivery}), failures)

    return _made(_PRODUCERS, config, make)


def _made(
    cache: LruCache[Key, _Client],
    config: Mapping[str, Setting],
    make: Callable[[dict[str, Setting]], _Client],
) -> _Client:
    key = _key(config)
    with _LOCK:
        made = cache.get(key)
        if made is None:
            made = make(dict(config))
        return cache.put(key, made)


def consumer(config: Mapping[str, Setting]) -> Consumer:
    """This process's consumer with `config`: assigned partitions only (never subscribed,
    no offsets committed), for reading a partition's last record."""
    from confluent_kafka import Consumer

    return _made(_CONSUMERS, config, Consumer)


def admin(config: Mapping[str, Setting]) -> AdminClient:
    """This process's admin client with `config`."""
    from confluent_kafka.admin import AdminClient

    return _made(_ADMINS, config, AdminClient)


def registry(config: Mapping[str, Setting]) -> SchemaRegistryClient:
    """This process's schema-registry client with `config` (`url` and its settings)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return _made(_REGISTRIES, config, SchemaRegistryClient)


def close_all(timeout: float = 60.0) -> None:
    """Flush and forget every shared client (the driver's, after a head start)."""
    with _LOCK:
        producers, consumers = list(_PRODUCERS.values()), list(_CONSUMERS.values())
        for cache in (_PRODUCERS, _CONSUMERS, _ADMINS, _REGISTRIES):
            cache.clear()
    for shared in producers:
        shared.producer.flush(timeout)
    for consumer in consumers:
        consumer.close()
