"""The `lance-cdf-kafka` sink in database mode (`lance-cdf publish --database`): the work
items of a database stream (streaming/database.py) name their table; a writer task
resolves each name to the table's URI (the sink's own `database` and `storage.<key>`
options: the items hold no location and no secret), its topic `<topic.prefix>.<name>`
(created on first use with `topic.partitions` partitions if missing, with its
transaction topic `<topic>.transaction`), and its record names `<topic.prefix>.<name>.*`.
Everything else is the single-table path, per table (kafka/sink.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from lance_cdf.errors import PublishError, TableNotFoundError
from lance_cdf.kafka.work import SlotWork, slot_works
from lance_cdf.namespace import list_tables
from lance_cdf.streaming.handoff import table_digest

log = logging.getLogger("lance_cdf.kafka")

# this process's view: qualified name -> table URI (per database), topic -> partitions
_URIS: dict[tuple[str, str], str] = {}
_TOPICS: dict[tuple[str, str], int] = {}


@dataclass
class TableWork:
    """One table's work items of a writer task."""

    name: str  # qualified name
    uri: str | None  # None: the table is gone from the database
    works: list[SlotWork] = field(default_factory=list)


def table_works(
    rows: Any, database: str, storage_options: dict[str, str]
) -> dict[str, TableWork]:
    """The work items of a database stream's rows by table (every row checked first:
    `WorkItemError` if one is not lance-cdf's, or names no table)."""
    out: dict[str, TableWork] = {}
    for batch in rows:
        for work in slot_works(batch, "", storage_options):
            name = work.item.name
            if name is None:
                from lance_cdf.errors import WorkItemError

                raise WorkItemError(
                    "a work item that names no table reached a database sink: write the "
                    'stream of readStream.format("lance-cdf").option("database", ...) to it'
                )
            entry = out.get(name)
            if entry is None:
                uri = table_uri(database, name, work.item.table, storage_options)
                entry = out[name] = TableWork(name, uri)
            if entry.uri is not None:
                entry.works.append(replace(work, table=entry.uri))
    return out


def table_uri(
    database: str, name: str, digest: str, storage_options: dict[str, str]
) -> str | None:
    """The URI of table `name` whose path has digest `digest` (the one the work item was
    planned for): from this process's cache, else from a fresh listing; None if the
    database no longer has it. A table of that name elsewhere (dropped and created again)
    is left to the work item's own check (it refuses another table's items)."""
    key = (database, name)
    cached = _URIS.get(key)
    if cached is not None and table_digest(cached) == digest:
        return cached
    try:
        refs = list_tables(database, storage_options)
    except TableNotFoundError:
        raise
    for ref in refs:
        _URIS[(database, ref.qualified_name)] = ref.uri
    return _URIS.get(key) if any(r.qualified_name == name for r in refs) else None


def table_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    config: dict[str, str],
    transaction_topic: str | None,
) -> int:
    """The partition count of a table's topic, created with `partitions` partitions if it
    does not exist (and its transaction topic, before any record: a replicator finding
    records finds the topic that completes their versions)."""
    key = (bootstrap_servers, topic)
    count = _TOPICS.get(key)
    if count is not None:
        return count
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    from lance_cdf.kafka import clients
    from lance_cdf.kafka.transactions import ensure_topic

    admin = clients.admin({"bootstrap.servers": bootstrap_servers, "log_level": 0, **config})
    found = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    if found is None or found.error is not None:
        try:
            admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
        except Exception as exc:  # noqa: BLE001 (created meanwhile is fine)
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise PublishError(
                    f"could not create topic {topic!r}: {exc}; create it, or grant the "
                    "producer's principal Create on it"
                ) from None
        found = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise PublishError(f"topic {topic!r} was created but cannot be described; retry")
    if transaction_topic is not None:
        ensure_topic(bootstrap_servers, transaction_topic, config)
    count = _TOPICS[key] = len(found.partitions)
    return count


def with_partitions(works: list[SlotWork], partitions: int) -> list[SlotWork]:
    """The works with their topic's partition count (the source planned without Kafka)."""
    return [replace(w, item=replace(w.item, kafka_partitions=partitions)) for w in works]


def is_gone(database: str, name: str, storage_options: dict[str, str]) -> bool:
    """Whether the database no longer has table `name` (a failed read of it is then the
    drop, not a fault)."""
    try:
        return all(r.qualified_name != name for r in list_tables(database, storage_options))
    except Exception:  # noqa: BLE001 (the database unreadable: not "gone")
        return False
