"""The `lance-cdf-kafka` sink in database mode (`lance-cdf publish --database`): the work
items of a database stream (`DatabaseReader`) name their table; a writer task
resolves each name to the table's URI (the sink's own `database` and `storage.<key>`
options: the items hold no location and no secret), its topic `<topic.prefix>.<name>`
(created on first use if missing, with the sink's `topic.*` settings (`ensure_topic`),
and its transaction topic `<topic>.transaction`), and its record names `<topic.prefix>.<name>.*`.
Everything else is the single-table path, per table (`KafkaStreamWriter`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from lance_cdf.errors import KafkaUnavailableError, in_words
from lance_cdf.format.cache import LruCache
from lance_cdf.format.namespace import TableRef, list_tables
from lance_cdf.kafka.outage import RideOut
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.kafka.topics import KNOWN
from lance_cdf.ops.clientconfig import KafkaConnection
from lance_cdf.ops.takeup import DEFAULT, is_transient
from lance_cdf.retry import retry
from lance_cdf.spark.sink.work import SlotWork, slot_works
from lance_cdf.spark.source.handoff import table_digest

log = logging.getLogger("lance_cdf.kafka")

# this process's view: qualified name -> table URI (per database), topic -> partitions
_URIS: LruCache[tuple[str, str], str] = LruCache(16384)
_URIS_LOCK = threading.Lock()


@dataclass
class TableWork:
    """One table's work items of a writer task."""

    name: str  # qualified name
    uri: str | None  # None: the table is gone from the database
    works: list[SlotWork] = field(default_factory=list)


def table_works(rows: Any, database: str, storage_options: dict[str, str]) -> dict[str, TableWork]:
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


def table_uri(database: str, name: str, digest: str, storage_options: dict[str, str]) -> str | None:
    """The URI of table `name` whose path has digest `digest` (the one the work item was
    planned for): from this process's cache, else from a fresh listing; None if the
    database no longer has it. A table of that name elsewhere (dropped and created again)
    is left to the work item's own check (it refuses another table's items)."""
    key = (database, name)
    with _URIS_LOCK:
        cached = _URIS.get(key)
    if cached is not None and table_digest(cached) == digest:
        return cached
    return _listed_uri(database, name, storage_options)


def uri_of(database: str, name: str, storage_options: dict[str, str]) -> str | None:
    """The URI of table `name` (this process's cache, else a fresh listing); None if the
    database does not have it."""
    with _URIS_LOCK:
        cached = _URIS.get((database, name))
    if cached is not None:
        return cached
    return _listed_uri(database, name, storage_options)


def _listed_uri(database: str, name: str, storage_options: dict[str, str]) -> str | None:
    """Table `name`'s URI from a fresh listing, which refreshes the cache of every table."""
    refs = _listed(database, storage_options)
    with _URIS_LOCK:
        for ref in refs:
            _URIS.put((database, ref.qualified_name), ref.uri)
    return next((r.uri for r in refs if r.qualified_name == name), None)


def _listed(database: str, storage_options: dict[str, str]) -> list[TableRef]:
    """The database's tables; a listing that fails with a fault that passes (the object
    store throttles or does not answer) is retried with backoff, up to the writer's budget
    (`TakeUpSettings.writer_retry`), then raised."""

    def retrying(exc: BaseException, retries: int, pause: float) -> None:
        if retries == 0:
            log.warning(
                "listing the database failed (%s); retrying for up to %.0f s",
                in_words(exc),
                DEFAULT.writer_budget_s,
            )

    return retry(
        lambda: list_tables(database, storage_options),
        DEFAULT.writer_retry,
        is_transient,
        retrying,
    )


def table_topic(
    connection: KafkaConnection,
    topic: str,
    settings: TopicSettings,
    transaction_topic: str | None,
    ride_out: RideOut,
) -> int:
    """The partition count of a table's topic, created with `settings` if it does not
    exist (and its transaction topic, before any record: a replicator finding records
    finds the topic that completes their versions); brokers that do not answer are
    waited for as `ride_out` says."""

    def ensure() -> int:
        count = KNOWN.ensure(connection, topic, settings, other="--topic-prefix")
        if transaction_topic is not None:
            KNOWN.ensure(
                connection,
                transaction_topic,
                settings.for_transactions(),
                one_partition=True,
                other="--no-transaction-metadata",
            )
        return count

    return ride_out.call("making sure of the table's topics", ensure, (KafkaUnavailableError,))


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
