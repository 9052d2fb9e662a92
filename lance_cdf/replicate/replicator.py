"""Replicator: consume a lance-cdf Kafka topic and keep a Lance table equal to the source.

    Kafka records -> decode (Avro, schema from the registry) -> one Arrow table per batch
    -> last state per key (Arrow group-by) -> ReplicaTable.apply (deletes, upserts)
    -> Kafka offsets committed

Exactly once in effect: each batch's Kafka position (next offset per partition)
is stored in the same Lance commit as the rows it describes (see replica.py);
Kafka offsets are committed only after that commit; on start and on every
partition assignment the consumer is positioned from the replica itself, and
records below the replica's position are skipped. A crash anywhere therefore
replays at most the one batch that was not committed to Lance, and replaying
it is idempotent.

New rows need no lookup. Keyed by `_source_rowid` (the default), in a replica the
replicator created (every row came from a record), an upserted key cannot be in the
replica when
  * it is above the highest `_source_rowid` ever upserted (recorded in every commit
    as `lance-cdf.max-source-rowid`): Lance hands out row IDs in increasing order
    and never reuses one, so a source insert's row ID usually is; or
  * its first record in the batch is an insert (op "c") at a source version above
    the one the replica recorded before the batch: an insert carries a row ID the
    source did not hold at the version before, and a row that comes back (a
    `restore`) was deleted first, by a delete record earlier in the same partition.
Such keys are written without a key-index probe. A re-published range or a replay
has keys and versions at or below the recorded ones and is looked up as before; so
is everything with a user key (a user key can come back with a new row ID) and
everything in a replica the replicator did not create.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import io
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from lance_cdf.avro.decode import (
    OK,
    REASONS,
    WIRE,
    AvroDecodeDeclined,
    BatchDecoder,
    Frames,
)
from lance_cdf.avro.schema import row_arrow_schema
from lance_cdf.avro.wire import split
from lance_cdf.errors import (
    ForeignReplicaError,
    LanceCdfError,
    RegistryRefusedError,
    RegistryUnavailableError,
    ReplicaPositionError,
    ReplicateError,
)
from lance_cdf.kafka.endpoints import (
    DENIED,
    check_broker,
    check_consumer_access,
    check_registry,
    denied,
)
from lance_cdf.kafka.transactions import TransactionDecoder, default_topic
from lance_cdf.ops import malloc
from lance_cdf.ops.clientconfig import KafkaConnection, scrub
from lance_cdf.ops.clientconfig import registry_config as registry_settings
from lance_cdf.ops.lease import Lease, LeaseKeeper
from lance_cdf.replicate.consumers import dead_letter_producer, replica_consumer_config
from lance_cdf.replicate.replica import (
    INSIDE_VERSION_PROPERTY,
    MAX_ROWID_PROPERTY,
    OFFSETS_PROPERTY,
    ORIGIN_PROPERTY,
    RECORDS_THROUGH_PROPERTY,
    SOURCE_ROWID,
    SOURCE_TABLE_PROPERTY,
    SOURCE_VERSION_PROPERTY,
    TOPIC_PROPERTY,
    TRANSACTION_OFFSET_PROPERTY,
    VERSION_OFFSETS_PROPERTY,
    ReplicaTable,
    crash_point,
    offsets_of,
    source_table_of,
    source_version_of,
    topics_of,
)
from lance_cdf.replicate.wholeversions import Take, VersionGate

if TYPE_CHECKING:
    from confluent_kafka import Message
    from fastavro.types import Schema as ParsedSchema

log = logging.getLogger("lance_cdf.replicate")
OPS = ("c", "u", "d", "r")
# The replica's lease (one writer per replica) lives inside the replica table's
# directory: it moves and is deleted with the table, needs no location or permissions
# of its own, and Lance leaves a directory it does not know alone (reads, writes,
# cleanup_old_versions).
LEASE_DIR = "_lance_cdf"
# How records name their source table (`source.name`, `source.table`, `source.db`).
SOURCE_FIELDS = ("name", "table", "db")

# (s) a batch's drain: what the fetcher already holds is handed out within it (a zero
# timeout never hands it out); a record arriving later than this after the last one
# starts the next batch
DRAIN_S = 0.01
# (s) while records wait for their version's END, the transaction topic is read again
# after at most this long without new records
END_LOOK_S = 0.05


def consume_ready(
    consumer: Consumer, limit: int, wait: float, window: float, stop: threading.Event
) -> list[Message]:
    """Up to `limit` records (and error events) as soon as they are there: waits up to
    `wait` s for the first, then takes what keeps arriving (DRAIN_S apart) for at most
    `window` s from the first. librdkafka's consume(n, t) returns only when n records
    have come or t has passed, so a batch asked with consume(100_000, 1 s) held every
    record of a quiet topic for the whole second, where consume(1, 1 s) returns with the
    first record (docs/benchmarks.md, "Latency under load")."""
    got = consumer.consume(1, wait) if wait > 0 else []
    if not got:
        return []
    out = list(got)
    deadline = time.monotonic() + window
    while len(out) < limit and not stop.is_set() and time.monotonic() < deadline:
        more = consumer.consume(min(100_000, limit - len(out)), DRAIN_S)
        if not more:
            break
        out.extend(more)
    return out


class FinalStates(NamedTuple):
    """What a batch of records leaves behind: the last state of each key."""

    upserts: pa.Table | None  # the rows to write (one per key)
    deletes: pa.Table | None  # the keys to delete
    tombstones: int  # Kafka tombstones in the batch (nothing to apply)
    version: int  # the highest source commit version among the records (0: none)
    new_rows: np.ndarray | None  # per upsert row: a key that needs no lookup (module doc)


@dataclass
class Counters:
    """Progress since start; `Replicator.counters` is updated after every batch."""

    batches: int = 0
    records: int = 0
    upserts: int = 0
    deletes: int = 0
    tombstones: int = 0
    skipped: int = 0
    dead_letters: int = 0
    source_version: int = 0
    lag: int = 0
    delivery_failures: int = 0  # offset commits and dead-letter writes that failed
    registry_retries: int = 0  # schema fetches asked again while the registry was down
    last_error: float = 0.0  # unix time of the last of those (0: none)
    started: float = field(default_factory=time.time)
    # where the time went (seconds since start): waiting for / fetching records,
    # decoding them to final row states, the Lance apply (lookup, write, commit),
    # the Kafka offset commit, replica upkeep (index delta, compaction)
    poll_s: float = 0.0
    decode_s: float = 0.0
    apply_s: float = 0.0
    offset_commit_s: float = 0.0
    upkeep_s: float = 0.0
    fresh_upserts: int = 0  # upserts written without a key lookup (new source rows)

    def failed(self) -> None:
        self.delivery_failures += 1
        self.last_error = time.time()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Decoder:
    """Confluent wire format -> Python dict (one record) or Arrow (many records of one
    schema, vectorized); writer schemas fetched once per schema id."""

    def __init__(self, registry: SchemaRegistryClient, outage_s: float = 120.0):
        self.registry = registry
        self.outage_s = outage_s
        self.outages = 0  # fetches retried because the registry did not answer
        self.parsed: dict[int, ParsedSchema] = {}
        self.rows: dict[int, pa.Schema] = {}
        self.batch: dict[int, BatchDecoder | None] = {}

    def _schema(self, schema_id: int) -> Schema:
        """The writer schema of an id. An id the registry answers it does not know (a 4xx
        other than 429) is the record's fault: raised as is, and the record stops the
        replicator or goes to the dead-letter topic. An outage (`_registry_outage`: the
        registry unreachable, timing out, failing with a 5xx or 429) is never the
        record's fault: retried with backoff for up to `outage_s` seconds, each retry
        logged, then RegistryUnavailableError, which no dead-letter path takes."""
        deadline = time.monotonic() + self.outage_s
        delay = 0.5
        while True:
            try:
                return self.registry.get_schema(schema_id)
            except Exception as exc:  # noqa: BLE001 - sorted just below
                if _registry_refused(exc):
                    raise RegistryRefusedError(
                        f"the schema registry refused schema id {schema_id} ({str(exc)[:200]})"
                        ": not an answer about the record, so it is not set aside. Check "
                        "--schema-registry (the URL, with its API path) and --registry-config "
                        "(credentials), then start again; nothing of the batch was applied."
                    ) from None
                if not _registry_outage(exc):
                    raise
                why: Exception = exc
            left = deadline - time.monotonic()
            if left <= 0:
                raise RegistryUnavailableError(
                    f"the schema registry did not give schema id {schema_id} for "
                    f"{self.outage_s:.0f} s ({type(why).__name__}: {str(why)[:200]}). Nothing of "
                    "the batch was applied and no offset moved: start the replicator again "
                    "once the registry answers; no record is lost."
                ) from None
            self.outages += 1
            log.warning(
                "schema registry unavailable (%s); schema id %d asked again in %.1f s "
                "(giving up after %.0f s)",
                type(why).__name__,
                schema_id,
                min(delay, left),
                self.outage_s,
            )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 10.0)

    def _load(self, schema_id: int) -> None:
        if schema_id not in self.parsed:
            schema_str = self._schema(schema_id).schema_str
            if schema_str is None:
                raise ReplicateError(f"the schema registry has no schema text for id {schema_id}")
            envelope = json.loads(schema_str)
            self.rows[schema_id] = row_arrow_schema(envelope)
            self.parsed[schema_id] = fastavro.parse_schema(envelope)
            self.batch[schema_id] = _batch_decoder(envelope)

    def decode(self, payload: bytes) -> tuple[int, dict[str, Any]]:
        schema_id, body = split(payload)
        self._load(schema_id)
        record = fastavro.schemaless_reader(io.BytesIO(body), self.parsed[schema_id], None)
        if not isinstance(record, dict):  # an envelope is an Avro record: always a dict
            raise ReplicateError(f"schema id {schema_id} is not a change-event envelope")
        return schema_id, record

    def batch_decoder(self, schema_id: int) -> BatchDecoder | None:
        """The vectorized decoder of a schema id; None when only fastavro reads it."""
        self._load(schema_id)
        return self.batch[schema_id]


def _registry_refused(exc: Exception) -> bool:
    """Whether a failed schema fetch is a refusal that says nothing of the record (a
    wrong URL or missing credentials: any 4xx but 429 other than "schema not found",
    SR code 40403), which would otherwise send every record to the dead-letter topic."""
    if not isinstance(exc, SchemaRegistryError):
        return False
    status = exc.http_status_code
    return (
        status is not None and 400 <= status < 500 and status != 429 and (exc.error_code != 40403)
    )


def _registry_outage(exc: Exception) -> bool:
    """Whether a failed schema fetch is the registry's outage rather than the record's
    fault: no answer (a transport error or timeout of the client's HTTP library, an
    OSError) or an answer of a 5xx or 429; not an answer that the id is unknown (4xx)."""
    if isinstance(exc, SchemaRegistryError):
        status = exc.http_status_code
        return status is None or status >= 500 or status == 429
    if isinstance(exc, OSError):  # TimeoutError, ConnectionError, ...
        return True
    # httpx's (the client's) TransportError / TimeoutException, without importing it
    return any(c.__name__ in ("TransportError", "TimeoutException") for c in type(exc).__mro__)


# the group coordinator is moving or loading: a committed-offsets request is asked again
_COORDINATOR_MOVING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError._TIMED_OUT,
)


def _table_identity(source: dict[str, str | None]) -> dict[str, str | None]:
    """A source table as records name it (`source.name`, `.table`, `.db`) -> its dotted
    name and URI (None: not named). Records of releases before `source.db` carried the
    URI in `source.table` and no name."""
    name, table, db = (source.get(f) for f in SOURCE_FIELDS)
    if name is None and db is None:
        return {"table": None, "uri": table or None}
    return {"table": f"{name}.{table}" if name else table, "uri": db or None}


def _describe(source: dict[str, str | None]) -> str:
    return f"{source.get('table') or '(unnamed)'} at {source.get('uri') or '(no URI)'}"


def _distinct_sources(
    source: pa.StructArray, good: np.ndarray
) -> list[tuple[dict[str, str | None], int]]:
    """The distinct source tables ({name, table, db}) of the good records of a decoded
    batch, each with the index (among the good ones) of its first record: no Python per
    record (a batch of one table, the rule: one comparison per column; else one Arrow
    group-by)."""
    fields = {source.type.field(i).name for i in range(source.type.num_fields)}
    n = int(good.sum())
    if n == 0:
        return []
    mask = None if n == len(good) else pa.array(good)
    columns = []
    for f in SOURCE_FIELDS:
        if f not in fields:
            columns.append(pa.nulls(n, pa.string()))
            continue
        col = source.field(f)
        columns.append((col if mask is None else col.filter(mask)).cast(pa.string()))
    first = {f: c[0].as_py() for f, c in zip(SOURCE_FIELDS, columns, strict=True)}
    if all(
        c.null_count == n
        if first[f] is None
        else c.null_count == 0 and pc.all(pc.equal(c, first[f])).as_py()
        for f, c in zip(SOURCE_FIELDS, columns, strict=True)
    ):
        return [(first, 0)]
    table = pa.Table.from_arrays([*columns, pa.array(np.arange(n))], [*SOURCE_FIELDS, "_i"])
    groups = table.group_by(list(SOURCE_FIELDS), use_threads=False).aggregate([("_i", "min")])
    return [({f: row[f] for f in SOURCE_FIELDS}, int(row["_i_min"])) for row in groups.to_pylist()]


def _offset(m: Message) -> int:
    """A consumed record's offset (librdkafka gives every record it hands out one)."""
    offset = m.offset()
    if offset is None:
        raise LanceCdfError(f"Kafka handed out a record of {m.topic()!r} without an offset")
    return offset


@dataclass
class SharedClients:
    """Kafka and registry clients a database replicator (database.py) shares among its
    tables' `Replicator`s: the one consumer (its group, assigned partitions of every
    table's topics; polled by the caller), the schema decoder and the dead-letter producer."""

    consumer: Consumer
    group_id: str
    decoder: _Decoder
    dlq: Producer | None = None
    leases: LeaseKeeper | None = None  # one keep-alive thread for every table's lease


class _Positions(NamedTuple):
    """Where a batch's records lie (`Replicator._positions`)."""

    parts: np.ndarray  # per record: its partition
    offsets: np.ndarray  # per record: its offset, or a rank ordering a partition's records
    keep: np.ndarray  # per record: at or above the replica's position
    next_offsets: dict[int, int]  # per partition: the next offset after the batch


@contextlib.contextmanager
def _gc_paused(pause: bool) -> Iterator[None]:
    """With `pause`, Python's cyclic garbage collector off for the block (as it was
    after): a process-wide setting, so only where the process is the replicator's own
    (`lance-cdf replicate`)."""
    if not pause:
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# shared by a database replicator's tables (database.py)
SchemaDecoder = _Decoder
gc_paused = _gc_paused


def _batch_decoder(envelope: dict[str, Any]) -> BatchDecoder | None:
    try:
        decoder = BatchDecoder(envelope)
    except (AvroDecodeDeclined, KeyError, TypeError, ValueError):
        return None
    t = decoder.arrow
    names = {t.field(i).name for i in range(t.num_fields)}
    if not {"before", "after", "op", "source"} <= names:
        return None
    source, row = t.field("source").type, t.field("after").type
    if (
        not pa.types.is_struct(source)
        or not {"commit_version", "rowid"}
        <= {source.field(i).name for i in range(source.num_fields)}
        or t.field("op").type != pa.string()
        or not pa.types.is_struct(row)
        or t.field("before").type != row
    ):
        return None
    return decoder


def _aligned(table: pa.Table, schema: pa.Schema) -> pa.Table | None:
    """`table` in `schema` (an older writer schema's rows in the newest one: missing
    nullable columns null, others cast); None when that is not clearly possible."""
    if table.schema == schema:
        return table
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            if not f.nullable:
                return None
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        col = table[f.name]
        try:
            columns.append(col if col.type == f.type else col.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        if not f.nullable and columns[-1].null_count:
            return None
    return pa.Table.from_arrays(columns, schema=schema)


def consume_error(
    err: KafkaError, topic: str, group_id: str, bootstrap_servers: str, topic_flag: str
) -> LanceCdfError:
    """What a consumer's error while polling `topic` stops the replicator with: an ACL
    denial on the group or the topic named in one line (`topic_flag`: the flag that names
    another topic), anything else as Kafka said it."""
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return denied(
            "consumer group", group_id, "Read", bootstrap_servers, "consumer", err, "--group-id"
        )
    if err.code() in DENIED:
        return denied(
            "topic", topic, "Describe and Read", bootstrap_servers, "consumer", err, topic_flag
        )
    return LanceCdfError(f"Kafka error while consuming {topic!r}: {err}")


class Replicator:
    """Consume `topic` (records published by `lance-cdf publish`) and apply them to the
    Lance table at `target`.

    `key`: the replica's key columns; default `_source_rowid` (the source's stable row
    ID, stored as an ordinary column). `compact_every`: compact the replica's small
    fragments every that many batches (0: never); `index_rows_max`: add new fragments to
    the key index once they hold more rows than this; `keep_row_ids`: an updated row
    keeps its replica row ID (the commit then costs O(replica); see replica.py);
    `preload_index`: load the key index into memory when it is first met (default; only
    when the key map does not serve); `key_map`: look integer keys up in an in-memory
    map of key -> row address (~16 bytes per replica row, built from one scan of the
    key column at the first batch and after each compaction; default). Run
    with `run()`; `stop()` (or SIGTERM / Ctrl-C when run in the main thread) ends it
    after the current batch.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        schema_registry: str,
        target: str,
        key: list[str] | None = None,
        group_id: str | None = None,
        max_batch_rows: int = 100_000,
        max_batch_interval: float = 1.0,
        dead_letter_topic: str | None = None,
        consumer_config: dict[str, Any] | None = None,
        registry_config: dict[str, Any] | None = None,
        storage_options: dict[str, str] | None = None,
        compact_every: int = 100,
        index_rows_max: int | None = None,
        keep_row_ids: bool = False,
        preload_index: bool = True,
        key_map: bool = True,
        registry_outage_s: float = 120.0,
        rebuild: bool = False,
        lease_ttl_s: float = 30.0,
        transaction_topic: str | None = None,
        transaction_metadata: bool = True,
        max_pending_records: int = 200_000,
        shared: SharedClients | None = None,
        pause_gc: bool = False,
    ):
        self.topic = topic
        self.shared = shared
        # the cyclic garbage collector off while a batch is consumed, decoded and applied:
        # a batch's many live Message objects made every full collection walk them
        # (docs/benchmarks.md, "Inside the replicator"); a process-wide switch, so
        # `lance-cdf replicate` turns it on for its own process only
        self.pause_gc = pause_gc
        self.target, self.storage_options = target, storage_options
        self.rebuild, self.lease_ttl_s = rebuild, lease_ttl_s
        self.group_id = (
            shared.group_id if shared is not None else (group_id or f"lance-cdf-replicate-{topic}")
        )
        # whole versions (wholeversions.py): the transaction topic read beside `topic`
        # (None: records applied as they come, no source version recorded)
        self.transaction_topic = (
            (transaction_topic or default_topic(topic)) if transaction_metadata else None
        )
        self.max_pending_records = max_pending_records
        self.compact_every = compact_every
        self.key = list(key) if key else [SOURCE_ROWID]
        self.max_batch_rows, self.max_batch_interval = max_batch_rows, max_batch_interval
        self.dead_letter_topic = dead_letter_topic
        connection = KafkaConnection(bootstrap_servers, consumer_config or {}, "consumer")
        if shared is None:  # (a shared consumer's owner checked the broker and registry;
            # a denial on one table's topics is named by the poll loop)
            check_broker(bootstrap_servers, consumer_config, flag="consumer")
            check_registry(schema_registry, registry_config)
            # the topics' and the group's ACLs, named before anything is applied
            check_consumer_access(
                bootstrap_servers, topic, self.group_id, consumer_config, self.transaction_topic
            )
        self._bootstrap_servers = bootstrap_servers
        self.replica = ReplicaTable(
            target,
            self.key,
            storage_options,
            keep_row_ids=keep_row_ids,
            prewarm=preload_index,
            key_map=key_map,
            **({} if index_rows_max is None else {"index_rows_max": index_rows_max}),
        )
        self.decoder = (
            shared.decoder
            if shared is not None
            else _Decoder(
                # a request timeout (the client has none: a hung registry would hang the
                # replicator for good), and no retries of its own: an outage is retried, and
                # logged, by _Decoder._schema
                SchemaRegistryClient(
                    registry_settings(
                        schema_registry, registry_config, defaults={"timeout": 10, "max.retries": 0}
                    )
                ),
                outage_s=registry_outage_s,
            )
        )
        self.consumer = (
            shared.consumer
            if shared is not None
            else Consumer(replica_consumer_config(connection, self.group_id, self._on_commit))
        )
        dlq = None
        if dead_letter_topic and not shared:
            dlq = dead_letter_producer(connection, dead_letter_topic)
        self.dlq = shared.dlq if shared is not None else dlq
        self._connection = connection  # (for the topic's configuration: is it compacted?)
        self._lease: Lease | None = None
        # the source table this replica follows ({name, table, db} as records name it):
        # recorded in the replica, else taken from the first records applied
        self._source: dict[str, str | None] | None = None
        # "versions" (through `_gate`) or "records"; None: decided at the first records
        # after an assignment (the transaction topic exists once records do)
        self._mode: str | None = None
        self._gate: VersionGate | None = None
        self._position: dict[str, str] = {}
        self._through = 0  # the highest source version of any record applied
        self._paused: set[int] = set()  # partitions paused by _pace
        self.counters = Counters()
        self._stop = threading.Event()
        self._applied: dict[int, int] = {}
        self._assigned: float | None = None
        # assignments so far and the partitions of the last: a batch polled within one
        # assignment of one partition holds that partition's records in offset order
        # (see _positions)
        self._assignments = 0
        self._partitions: list[int] = []
        self._batch_partition: int | None = None
        self._waiting_for_topic = False
        self._since_compaction = 0
        # (source version, highest _source_rowid) the replica holds: above them a key
        # cannot be there (None: unknown, look every upsert up); read from the replica
        # on assignment, advanced per batch
        self._fresh: tuple[int, int] | None = None

    # -- position -------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(self.positioned(partitions))

    def positioned(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The topic's partitions (about to be assigned) at the replica's position; the
        replicator's state reset to it."""
        self._assigned = time.monotonic()
        self._assignments += 1
        self._partitions = [tp.partition for tp in partitions]
        position = self.replica.position()
        self._position, self._mode = position, None
        self._paused = set()  # (a new assignment starts unpaused)
        through = position.get(RECORDS_THROUGH_PROPERTY)
        self._through = int(through) if through is not None else (source_version_of(position) or 0)
        self._applied = offsets_of(position, self.topic)
        self._fresh = self.replica.fresh_bounds(position) if self.key == [SOURCE_ROWID] else None
        self.counters.source_version = max(
            self.counters.source_version, int(position.get(SOURCE_VERSION_PROPERTY, 0))
        )
        for tp in partitions:
            # the replica's own position, never the group's committed offsets (which a
            # deleted or replaced replica does not hold): a partition the replica holds
            # nothing of starts at the beginning (_check_start refused a start where that
            # would not be the whole history)
            tp.offset = self._applied.get(tp.partition, OFFSET_BEGINNING)
        return partitions

    # -- running --------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self, idle_timeout: float | None = None) -> Counters:
        """Apply batches until stop() (`lance-cdf replicate` calls it on SIGTERM / SIGINT),
        or until no record has arrived for `idle_timeout` seconds since partitions were
        assigned. The batch in progress is finished (its Lance commit and offset commit)
        before returning; nothing is half-applied."""
        started = time.monotonic()
        try:
            lease = self.start()
        except BaseException:
            self.consumer.close()
            raise
        self.consumer.subscribe([self.topic], on_assign=self._on_assign)
        last_data = 0.0
        try:
            while not self._stop.is_set():
                # (the batch holds no reference cycles: reference counts free it)
                with _gc_paused(self.pause_gc):
                    t0 = time.perf_counter()
                    msgs = self._poll_batch()
                    self.counters.poll_s += time.perf_counter() - t0
                    lease.check()  # still ours (LeaseLostError: stop, apply nothing more)
                    if msgs:
                        last_data = time.monotonic()
                    self._take(msgs)
                    got = bool(msgs)
                    del msgs
                if (
                    not got
                    and idle_timeout is not None
                    and self._idle(idle_timeout, last_data, started)
                ):
                    break
        finally:
            try:
                if self._assigned is not None:  # the last position, waited for
                    self._commit_offsets(self._applied, asynchronous=False)
                self.consumer.close()
                if self._gate is not None:
                    self._gate.close()
                if self.dlq is not None:
                    self.dlq.flush(30)
            finally:
                self._release(lease)
        return self.counters

    def start(self) -> Lease:
        """One writer per replica (its lease, renewed from a thread), then whose replica it
        is and where it resumes: all refused before anything is applied."""
        try:
            self._lease = lease = self._acquire_lease()
            self._check_start()
        except BaseException:
            if self._lease is not None:
                self._release(self._lease)
            raise
        return lease

    def finish(self, commit: bool = True) -> None:
        """(A shared consumer's replicator) the last position committed to the consumer
        group (`commit`: the topic still exists), the transaction partition let go and
        the lease given up."""
        try:
            if commit and self._assigned is not None:
                self._commit_offsets(self._applied, asynchronous=False)
            if self._gate is not None:
                self._gate.close()
        finally:
            if self._lease is not None:
                self._release(self._lease)

    # (a shared consumer's replicator: its owner polls, these take what it polled)
    def take(self, msgs: list[Message]) -> None:
        """Apply what may be applied of the topic's records polled so far (`_take`), the
        lease checked first (LeaseLostError: nothing more is applied)."""
        if self._lease is not None:
            self._lease.check()
        self._take(msgs)

    def feed_transactions(self, msgs: list[Message]) -> bool:
        """Records of the transaction topic polled by the shared consumer, for the gate;
        False: no gate reads them (yet)."""
        if self._gate is None:
            return False
        self._gate.feed(msgs)
        return True

    def added_partitions(self, partitions: list[int]) -> list[TopicPartition]:
        """Partitions the topic gained since assigned (of `partitions`, its partitions
        now), at the replica's position (from the beginning: they are new)."""
        new = sorted(set(partitions) - set(self._partitions))
        self._partitions = sorted([*self._partitions, *new])
        return [TopicPartition(self.topic, p, self._applied.get(p, OFFSET_BEGINNING)) for p in new]

    def topic_partitions(self) -> list[int] | None:
        """The topic's partitions (None: no such topic)."""
        return self._topic_partitions()

    def _idle(self, idle_timeout: float, last_data: float, started: float) -> bool:
        """Whether `idle_timeout` has passed without a record: counted from the partition
        assignment (a restart may wait for a rebalance), or from start while the topic
        does not exist (it may never come)."""
        now = time.monotonic()
        if self._assigned is not None:
            return now - max(last_data, self._assigned) > idle_timeout
        if self._waiting_for_topic and now - started > idle_timeout:
            log.warning(
                "topic %r still does not exist %.0f s after start: --idle-timeout reached, "
                "stopping (nothing applied)",
                self.topic,
                now - started,
            )
            return True
        return False

    # -- start-up: one writer, whose replica, where it resumes ------------------------
    def _acquire_lease(self) -> Lease:
        """The replica's lease (LeaseHeldError naming the holder when another replicator
        writes it), renewed from a thread until `run` ends (a shared consumer's replicator:
        from its owner's one keep-alive thread for every table)."""
        location = f"{self.target.rstrip('/')}/{LEASE_DIR}"
        lease = Lease.acquire(
            location,
            "replica",
            self.storage_options,
            ttl_s=self.lease_ttl_s,
            command=f"lance-cdf replicate --topic {self.topic} --group-id {self.group_id}",
            target=self.target,
        )
        lease.keep_alive(self.shared.leases if self.shared is not None else None)
        return lease

    def _release(self, lease: Lease) -> None:
        """Give the lease up; a local target directory that holds nothing after that (no
        record applied: the lease's directory was all there was) is removed."""
        lease.release()
        parsed = urlparse(self.target)
        if parsed.scheme in ("", "file"):
            with contextlib.suppress(OSError):  # not empty, or gone: leave it
                os.rmdir(parsed.path if parsed.scheme == "file" else self.target)

    def _check_start(self) -> None:
        """Refuse, before anything is applied, a replica of another topic, and a start
        that would fill the replica from the middle of the topic: the replica holds no
        position while the consumer group has committed offsets (a deleted or replaced
        replica; `rebuild` accepts starting it from the beginning), or the topic no
        longer holds the records from the replica's position on (retention)."""
        position = self.replica.position()
        others = topics_of(position) - {self.topic}
        if others:
            raise ForeignReplicaError(
                f"the replica {self.target} follows topic {sorted(others)[0]!r}, not "
                f"{self.topic!r}: a replica follows one topic. Replicate {self.topic!r} into "
                "a new --target."
            )
        self._source = source_table_of(position)
        applied = offsets_of(position, self.topic)
        partitions = self._topic_partitions()
        if partitions is None:  # no topic yet: nothing to resume from, nothing lost
            self._waiting_for_topic = True
            log.warning(
                "topic %r does not exist yet; waiting for it (--idle-timeout, if given, "
                "counts from start)",
                self.topic,
            )
            return
        if not applied and not self.rebuild:
            moved = self._committed(partitions)
            if moved:
                what = "does not exist" if self.replica.open() is None else "holds no position"
                raise ReplicaPositionError(
                    f"the replica {self.target} {what}, but consumer group {self.group_id!r} "
                    f"has consumed {sum(moved.values())} records of {self.topic!r}: the "
                    "replica was deleted or replaced, and resuming from the group's offsets "
                    "would fill it from the middle. To build it again from the beginning of "
                    "the topic, run the same command with --rebuild."
                )
        if self.rebuild and applied:
            log.info("--rebuild: the replica holds a position already; resuming from it")
        self._check_history(applied, partitions)

    def _committed(self, partitions: list[int]) -> dict[int, int]:
        """The consumer group's committed offsets of the topic's partitions (those it has
        committed); a coordinator that is moving or loading is asked again, for up to a
        minute (the check is not skipped: a start it guards must not be guessed)."""
        deadline, delay = time.monotonic() + 60, 0.2
        while True:
            try:
                got = self.consumer.committed(
                    [TopicPartition(self.topic, p) for p in partitions], timeout=10
                )
                return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is None or not (err.retriable() or err.code() in _COORDINATOR_MOVING):
                    why: KafkaException = exc
                    break
                why = exc
            if time.monotonic() > deadline:
                break
            log.info("consumer group %r: %s; asked again", self.group_id, why)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise LanceCdfError(
            f"cannot read the committed offsets of consumer group {self.group_id!r} in "
            f"{self.topic!r} ({why}); check the broker and start again"
        ) from None

    def _topic_partitions(self) -> list[int] | None:
        """The topic's partitions (None: no such topic)."""
        try:
            meta = self.consumer.list_topics(self.topic, timeout=10)
        except KafkaException as exc:
            raise LanceCdfError(f"cannot read the partitions of {self.topic!r}: {exc}") from None
        t = meta.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            return None
        return sorted(t.partitions)

    def _check_history(self, applied: dict[int, int], partitions: list[int]) -> None:
        """Each partition must still hold every record from where the replica resumes
        (its position, or the beginning): a low watermark above that means records were
        deleted (retention) before being applied. Only a compacted topic may start
        later than offset 0 for a new replica (it keeps the last record of every key)."""
        for p in partitions:
            start = applied.get(p, 0)
            try:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=10
                )
            except KafkaException as exc:
                raise LanceCdfError(
                    f"cannot read the offsets of {self.topic!r} partition {p}: {exc}"
                ) from None
            if high < start:  # fewer records than applied: not the topic the replica read
                raise ReplicaPositionError(
                    f"the replica {self.target} applied {self.topic!r} partition {p} up to "
                    f"offset {start}, but the partition ends at offset {high}: the topic was "
                    "deleted and created again since. Replicate it into a new --target."
                )
            if low <= start:
                continue
            policy = self._cleanup_policy()
            if start == 0 and policy == "compact":
                continue
            held = "holds nothing of it" if start == 0 else f"resumes at offset {start}"
            raise ReplicaPositionError(
                f"the replica {self.target} cannot be built from topic {self.topic!r}: its "
                f"partition {p} now starts at offset {low} (cleanup.policy={policy}: older "
                f"records deleted) and the replica {held}, so it would lack changes. Publish "
                "the source into a new topic from a snapshot (lance-cdf publish --snapshot) "
                "and replicate that into a new --target."
            )

    def _cleanup_policy(self) -> str:
        from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

        resource = ConfigResource(ResourceType.TOPIC, self.topic)
        try:
            admin = AdminClient(self._connection.admin())  # (held: its futures die with it)
            configs = admin.describe_configs([resource])
            entry = configs[resource].result(timeout=10).get("cleanup.policy")
        except KafkaException as exc:
            log.warning("cannot read the configuration of %r: %s", self.topic, exc)
            return "unknown"
        return "unknown" if entry is None or entry.value is None else str(entry.value)

    # -- whose replica: the records' source table ---------------------------------------
    def _check_sources(self, found: list[tuple[dict[str, str | None], Message]]) -> None:
        """Each distinct source table of a batch's records (with its first record) must
        be the one the replica follows; what the first records say of it becomes it.
        Compared by the table's URI and name where both sides carry them (records of an
        earlier release name the URI only; a publisher may not know the URI)."""
        for raw, m in found:
            source = _table_identity(raw)
            known = self._source or {}
            clash = [k for k, v in source.items() if v and known.get(k) and known[k] != v]
            if clash:
                raise ForeignReplicaError(
                    f"the record at partition {m.partition()} offset {m.offset()} of "
                    f"{self.topic!r} comes from source table {_describe(source)}, but the "
                    f"replica {self.target} follows {_describe(known)}: a replica "
                    "follows one table. Nothing of the batch was applied; publish each table "
                    "into a topic of its own and replicate it into its own --target."
                )
            self._source = {k: known.get(k) or source.get(k) for k in ("table", "uri")}

    def _identity(self) -> dict[str, str]:
        """The properties that say whose replica it is (every commit carries them)."""
        props = {TOPIC_PROPERTY: self.topic}
        if self._source is not None:
            props[SOURCE_TABLE_PROPERTY] = json.dumps(self._source, sort_keys=True)
        return props

    def _poll_batch(self) -> list[Message]:
        batch: list[Message] = []
        assignments, self._batch_partition = self._assignments, None
        wait = self.max_batch_interval
        if self._gate is not None and self._gate.waiting():
            # records wait for their version's END, read from the transaction topic
            # between polls: look again soon rather than after a quiet topic's wait
            wait = min(wait, END_LOOK_S)
        for m in consume_ready(
            self.consumer, self.max_batch_rows, wait, self.max_batch_interval, self._stop
        ):
            err = m.error()
            if err is None:
                batch.append(m)
            elif err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                if not self._waiting_for_topic:  # the publisher has not created it yet
                    log.warning("topic %r does not exist yet; waiting for it", self.topic)
                self._waiting_for_topic = True
            elif err.code() != KafkaError._PARTITION_EOF:
                raise consume_error(
                    err, self.topic, self.group_id, self._bootstrap_servers, "--topic"
                )
        if assignments == self._assignments and len(self._partitions) == 1:
            self._batch_partition = self._partitions[0]
        return batch

    def _positions(self, msgs: list[Message]) -> _Positions:
        """(partition, rank, keep) per message and the next offset per partition: `rank`
        orders a partition's records as their offsets do, `keep` marks those at or
        above the replica's position. A batch polled from one partition within one
        assignment (librdkafka hands a partition's records over in offset order) reads
        just the offsets at its ends and, when it starts below the position, a binary
        search's worth; any other batch reads every record's partition and offset."""
        one, self._batch_partition = self._batch_partition, None
        n, next_offsets = len(msgs), dict(self._applied)
        if one is None or not n:
            parts = np.fromiter((m.partition() for m in msgs), np.int64, n)
            offsets = np.fromiter((m.offset() for m in msgs), np.int64, n)
            keep = np.ones(n, bool)
            for p in np.unique(parts).tolist():
                in_p = parts == p
                keep[in_p] = offsets[in_p] >= self._applied.get(p, 0)
                next_offsets[p] = max(next_offsets.get(p, 0), int(offsets[in_p].max()) + 1)
            return _Positions(parts, offsets, keep, next_offsets)
        first, last, held = _offset(msgs[0]), _offset(msgs[-1]), self._applied.get(one, 0)
        if last < first:  # not in offset order after all: read them all
            return self._positions(msgs)
        next_offsets[one] = max(next_offsets.get(one, 0), last + 1)
        keep = np.ones(n, bool)
        if first < held:
            keep[: bisect.bisect_left(msgs, held, key=_offset)] = False
        ranks = np.arange(n, dtype=np.int64)
        return _Positions(np.full(n, one, np.int64), ranks, keep, next_offsets)

    def _commit_offsets(self, offsets: dict[int, int], asynchronous: bool) -> None:
        if not offsets:
            return
        try:
            # confluent-kafka's stub overloads commit() on Literal[True] / Literal[False]
            # only, with no overload for a plain bool
            self.consumer.commit(  # type: ignore[call-overload]
                offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                asynchronous=asynchronous,
            )
        except KafkaException as exc:  # the replica holds the position: safe to go on
            self._on_commit(exc, [])

    def _on_commit(
        self, err: KafkaError | KafkaException | None, partitions: list[TopicPartition]
    ) -> None:
        """Offset commit results (librdkafka calls this from consume / close)."""
        failed = [tp for tp in partitions if tp.error is not None]
        if err is None and not failed:
            return
        self.counters.failed()
        log.warning(
            "offset commit failed (the replica's position is kept): %s", err or failed[0].error
        )

    # -- whole versions -------------------------------------------------------------
    def _take(self, msgs: list[Message]) -> None:
        """Apply what may be applied of the records polled so far: all of them without
        transaction metadata, else whole versions only (wholeversions.py)."""
        if self._mode is None:
            if not msgs:
                return
            self._mode = self._start_mode()
        if self._mode == "records" or self._gate is None:
            if msgs:
                self._apply(msgs)
            return
        gate = self._gate
        gate.add(msgs)
        while not self._stop.is_set():
            take = gate.take(self.max_batch_rows)
            if take is None:
                break
            self._batch_partition = None  # (records of several polls)
            self._apply(take.msgs, take)
            gate.done(take)
        self._pace(gate)

    def _pace(self, gate: VersionGate) -> None:
        """Pause the partitions that hold a batch's worth of waiting records while another
        holds less: librdkafka hands a backlog over partition by partition (a whole fetch
        of one first), and a version needs its records from every partition. Never all of
        them, so the bound on waiting records (a piece) is still reached."""
        ahead = {p for p, held in gate.pending.items() if len(held) >= self.max_batch_rows}
        if len(ahead) >= len(self._partitions):
            ahead = set()
        if ahead == self._paused:
            return
        pause, resume = ahead - self._paused, self._paused - ahead
        if pause:
            self.consumer.pause([TopicPartition(self.topic, p) for p in sorted(pause)])
        if resume:
            self.consumer.resume([TopicPartition(self.topic, p) for p in sorted(resume)])
        self._paused = ahead

    def _start_mode(self) -> str:
        """ "versions" when the transaction topic exists (the gate positioned from the
        replica), else "records"."""
        txn = self.transaction_topic
        found = None
        if txn is not None:
            found = self.consumer.list_topics(txn, timeout=10).topics.get(txn)
            if found is not None and found.error is not None and found.error.code() in DENIED:
                # not "no transaction topic": applying records as they come would be a guess
                raise denied(
                    "topic",
                    txn,
                    "Describe and Read",
                    self._bootstrap_servers,
                    "consumer",
                    found.error,
                    "--transaction-topic (or --no-transaction-topic)",
                )
        if txn is None or found is None or found.error is not None:
            log.warning(
                "no transaction topic%s: records are applied as they come and the replica "
                "records no source version (it cannot tell a complete one); it records the "
                "highest version applied as %s",
                f" {txn!r}" if txn else "",
                RECORDS_THROUGH_PROPERTY,
            )
            return "records"
        if self._gate is None:
            self._gate = VersionGate(
                self._connection,
                self.topic,
                txn,
                TransactionDecoder(self.decoder.registry),
                self.max_pending_records,
                consumer=self.consumer if self.shared is not None else None,
            )
        position = self._position
        bounds = json.loads(position.get(VERSION_OFFSETS_PROPERTY, "{}")).get(self.topic)
        self._gate.reset(
            source_version_of(position) or 0,
            int(position.get(TRANSACTION_OFFSET_PROPERTY, 0)),
            {int(p): int(o) for p, o in bounds.items()}
            if bounds is not None
            else dict(self._applied),
            self._applied,
        )
        log.info("applying whole source versions (transaction topic %r)", txn)
        return "versions"

    # -- one batch ------------------------------------------------------------------
    def _apply(self, msgs: list[Message], take: Take | None = None) -> None:
        t0 = time.perf_counter()
        # `offsets` may be ranks (only their order within a partition is used below)
        parts, offsets, keep, next_offsets = self._positions(msgs)
        if keep.all():
            unapplied = msgs
        else:
            unapplied = [msgs[i] for i in np.flatnonzero(keep).tolist()]
            parts, offsets = parts[keep], offsets[keep]
        skipped = len(msgs) - len(unapplied)
        upserts, deletes, tombstones, version, new_rows = self._final_states(
            unapplied, parts, offsets
        )
        self.counters.registry_retries = self.decoder.outages
        t1 = time.perf_counter()
        props = {OFFSETS_PROPERTY: json.dumps({self.topic: next_offsets}), **self._identity()}
        if take is not None:  # whole versions: the last whole one, never a later one
            held = take.version
            if held:
                props[SOURCE_VERSION_PROPERTY] = str(held)
            props[TRANSACTION_OFFSET_PROPERTY] = str(take.transaction_offset)
            props[VERSION_OFFSETS_PROPERTY] = json.dumps({self.topic: take.version_offsets})
            if take.inside is not None:
                props[INSIDE_VERSION_PROPERTY] = str(take.inside)
        else:  # no transaction metadata: no version is known to be complete
            held = max(self.counters.source_version, version)
        self._through = max(self._through, version)
        props[RECORDS_THROUGH_PROPERTY] = str(self._through)
        fresh = self._fresh
        if fresh is not None:
            top = pc.max(upserts[SOURCE_ROWID]).as_py() if upserts is not None else None
            fresh = (max(fresh[0], version), max(fresh[1], -1 if top is None else top))
            props[MAX_ROWID_PROPERTY] = str(fresh[1])
            props[ORIGIN_PROPERTY] = "records"  # created here, or carried forward
        self.replica.apply(upserts, deletes, props, fresh=new_rows)
        self._applied = next_offsets
        self._fresh = fresh
        crash_point("after-lance-commit")
        t2 = time.perf_counter()
        # asynchronous: the replica's commit holds the position (a restart reads it from
        # there), Kafka's committed offsets only follow it for tools that watch the group;
        # a synchronous commit waited a broker round trip per batch. Failures arrive in
        # _on_commit; run() commits synchronously at the end.
        self._commit_offsets(next_offsets, asynchronous=True)
        c = self.counters
        c.decode_s += t1 - t0
        c.apply_s += t2 - t1
        c.offset_commit_s += time.perf_counter() - t2
        c.fresh_upserts += 0 if new_rows is None else int(new_rows.sum())
        c.batches += 1
        c.records += len(msgs)
        c.skipped += skipped
        c.tombstones += tombstones
        c.upserts += 0 if upserts is None else upserts.num_rows
        c.deletes += 0 if deletes is None else deletes.num_rows
        c.source_version = held if take is not None else max(c.source_version, version)
        c.lag = self._lag(next_offsets)
        log.info(
            "%sbatch %d: %d records (%d skipped), %d upserts, %d deletes, source version %d, "
            "lag %d",
            f"{self.topic}: " if self.shared is not None else "",
            c.batches,
            len(msgs),
            skipped,
            0 if upserts is None else upserts.num_rows,
            0 if deletes is None else deletes.num_rows,
            c.source_version,
            c.lag,
        )
        t3 = time.perf_counter()
        self._maintain()
        c.upkeep_s += time.perf_counter() - t3

    def _maintain(self) -> None:
        """Replica upkeep after a batch (its Lance and offset commits are done, so a
        crash here loses nothing): every `compact_every` batches the small fragments
        are compacted and the key index brought up to date; in between, the index
        takes in new fragments once they hold more than `index_rows_max` rows."""
        self._since_compaction += 1
        compact = 0 < self.compact_every <= self._since_compaction
        done = self.replica.maintain(compact=compact)
        if compact:
            self._since_compaction = 0
            # what the compaction's threads freed, back to the kernel (in `lance-cdf
            # replicate`, whose process holds glibc to two arenas; lance_cdf.ops.malloc)
            malloc.release_freed_memory()
        if done:
            crash_point("after-maintenance")
            log.info("replica upkeep: %s", done)

    def _final_states(
        self,
        msgs: list[Message],
        parts: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
    ) -> FinalStates:
        """(upsert rows, deleted keys, tombstones, highest source version, new-row flags)
        of a batch: the last state of each key in source commit order; the flags (one
        per upsert row, or None) mark keys that need no lookup (see the module doc).
        Decoded vectorized (all records of a schema at once) when every schema of the
        batch allows it, else record by record with fastavro."""
        fast = self._final_states_vectorized(msgs, parts, offsets)
        return fast if fast is not None else self._final_states_fastavro(msgs)

    def _final_states_vectorized(
        self,
        msgs: list[Message],
        parts: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
    ) -> FinalStates | None:
        """`_final_states` with avro_decode; None (nothing done, nothing sent to the
        dead-letter topic) when some schema of the batch needs the fastavro path.
        `parts`, `offsets`: each message's partition and offset (or a rank ordering a
        partition's records as their offsets do), when known."""
        if parts is None or offsets is None:  # (given together or not at all)
            parts = np.fromiter((m.partition() for m in msgs), np.int64, len(msgs))
            offsets = np.fromiter((m.offset() for m in msgs), np.int64, len(msgs))
        values = [m.value() for m in msgs]
        tombstones = values.count(None)
        if tombstones == len(values):
            return FinalStates(None, None, tombstones, 0, None)
        bodies = [v for v in values if v is not None]  # the records, tombstones dropped
        if tombstones:
            live = [i for i, v in enumerate(values) if v is not None]
            msgs = [msgs[i] for i in live]
            parts, offsets = parts[live], offsets[live]
        frames = Frames.of(bodies)
        schema_ids, wire = frames.confluent()
        errors: dict[int, Exception] = {}  # record index -> why it is set aside
        for i in np.flatnonzero(wire != OK):
            errors[int(i)] = ValueError(REASONS[WIRE])
        decoders: dict[int, BatchDecoder] = {}
        for sid in np.unique(schema_ids[wire == OK]).tolist():
            try:
                decoder = self.decoder.batch_decoder(sid)
            except RegistryUnavailableError:
                raise  # an outage: nothing is set aside
            except Exception as exc:  # an id the registry does not know: like fastavro's path
                for i in np.flatnonzero(schema_ids == sid):
                    errors[int(i)] = exc
                continue
            if decoder is None:
                return None
            decoders[sid] = decoder
        newest = self.decoder.rows[max(decoders)] if decoders else None
        tables: list[pa.Table] = []
        meta: list[tuple[np.ndarray, ...]] = []  # per schema: per-record columns, as below
        for sid, decoder in decoders.items():
            rows_idx = np.flatnonzero((wire == OK) & (schema_ids == sid))
            env, err = decoder.decode(frames, rows_idx)
            good, image, is_delete = self._checked(env, err, rows_idx, errors)
            if not good.all():
                image, is_delete = image.filter(pa.array(good)), is_delete[good]
            fields = image.type
            table = pa.Table.from_arrays(
                image.flatten(), names=[fields.field(i).name for i in range(fields.num_fields)]
            )
            table = _aligned(table, newest)
            if table is None:
                return None
            source = env.field("source")
            kept = rows_idx[good]
            self._check_sources([(s, msgs[kept[i]]) for s, i in _distinct_sources(source, good)])
            tables.append(table)
            op = env.field("op").to_numpy(zero_copy_only=False)[good]
            meta.append(
                (
                    source.field("commit_version").to_numpy()[good],
                    is_delete,
                    parts[kept],
                    offsets[kept],
                    source.field("rowid").to_numpy()[good],
                    op == "c",
                )
            )
        for at in sorted(errors):  # in Kafka order: without a dead-letter topic the first stops
            self._dead_letter(msgs[at], errors[at])
        rows = [t for t in tables if t.num_rows]
        if not rows:
            return FinalStates(None, None, tombstones, 0, None)
        rows = pa.concat_tables(rows) if len(rows) > 1 else rows[0]
        versions, is_delete, parts, offsets, rowids, is_insert = (
            np.concatenate(x) for x in zip(*meta, strict=True)
        )
        return self._last_states(
            rows, versions, is_delete, parts, offsets, rowids, tombstones, is_insert
        )

    def _checked(
        self,
        env: pa.StructArray,
        err: np.ndarray,
        rows_idx: np.ndarray,
        errors: dict[int, Exception],
    ) -> tuple[np.ndarray, pa.Array, np.ndarray]:
        """(good mask, row image, is-delete) of decoded envelopes; the errors of the
        others into `errors` (the fastavro path's checks, in its order)."""
        bad = err != OK
        for i in np.flatnonzero(bad):
            errors[int(rows_idx[i])] = ValueError(REASONS[int(err[i])])
        op = env.field("op")
        known = pc.fill_null(pc.is_in(op, pa.array(OPS)), False).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(~known & ~bad):
            errors[int(rows_idx[i])] = ValueError(f"unknown op {op[int(i)].as_py()!r}")
        bad |= ~known
        is_delete = pc.fill_null(pc.equal(op, "d"), False).to_numpy(zero_copy_only=False)
        if not is_delete.any():
            image = env.field("after")
        elif is_delete.all():
            image = env.field("before")
        else:
            image = pc.if_else(pa.array(is_delete), env.field("before"), env.field("after"))
        missing = image.is_null().to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(missing & ~bad):
            errors[int(rows_idx[i])] = ValueError(
                f"op {op[int(i)].as_py()!r} without its row image"
            )
        bad |= missing
        names = {image.type.field(i).name for i in range(image.type.num_fields)}
        key_nulls = {
            c: (
                image.field(c).is_null().to_numpy(zero_copy_only=False)
                if c in names
                else np.ones(len(image), bool)
            )
            for c in self.key
            if c != SOURCE_ROWID
        }
        if key_nulls:
            any_null = np.logical_or.reduce(list(key_nulls.values()))
            for i in np.flatnonzero(any_null & ~bad):
                nulls = [c for c, null in key_nulls.items() if null[i]]
                errors[int(rows_idx[i])] = ValueError(f"key column(s) {nulls} missing or null")
            bad |= any_null
        return ~bad, image, is_delete

    def _final_states_fastavro(self, msgs: list[Message]) -> FinalStates:
        images: list[dict[str, Any]] = []
        kept: list[Message] = []
        # per record: source version, delete?, partition, offset, source row ID, insert?
        meta: list[tuple[int, bool, int | None, int | None, int, bool]] = []
        schema_id: int | None = None
        tombstones = 0
        sources: dict[tuple[Any, ...], Message] = {}  # distinct source tables, first record
        for m in msgs:
            value = m.value()
            if value is None:
                tombstones += 1  # compaction marker after a delete: nothing to apply
                continue
            try:
                sid, rec = self.decoder.decode(value)
                op = rec.get("op")
                if op not in OPS:
                    raise ValueError(f"unknown op {op!r}")
                image = rec["before"] if op == "d" else rec["after"]
                if image is None:
                    raise ValueError(f"op {op!r} without its row image")
                nulls = [c for c in self.key if c != SOURCE_ROWID and image.get(c) is None]
                if nulls:
                    raise ValueError(f"key column(s) {nulls} missing or null")
                source = rec["source"]
                sources.setdefault(tuple(source.get(f) for f in SOURCE_FIELDS), m)
                meta.append(
                    (
                        source["commit_version"],
                        op == "d",
                        m.partition(),
                        m.offset(),
                        source["rowid"],
                        op == "c",
                    )
                )
            except RegistryUnavailableError:
                raise  # an outage, not the record's fault: never a dead letter
            except Exception as exc:  # a record that does not decode with its schema
                self._dead_letter(m, exc)
                continue
            images.append(image)
            kept.append(m)
            schema_id = sid if schema_id is None else max(schema_id, sid)
        self._check_sources(
            [(dict(zip(SOURCE_FIELDS, s, strict=True)), m) for s, m in sources.items()]
        )
        if not images or schema_id is None:  # (no image: no schema id either)
            return FinalStates(None, None, tombstones, 0, None)
        rows, bad = self._to_arrow(images, self.decoder.rows[schema_id], kept)
        if bad:
            meta = [x for i, x in enumerate(meta) if i not in bad]
            if not meta:
                return FinalStates(None, None, tombstones, 0, None)
        versions, is_delete, parts, offsets, rowids, is_insert = np.array(meta, np.int64).T
        return self._last_states(
            rows,
            versions,
            is_delete.astype(bool),
            parts,
            offsets,
            rowids,
            tombstones,
            is_insert.astype(bool),
        )

    def _last_states(
        self,
        rows: pa.Table,
        versions: np.ndarray,
        is_delete: np.ndarray,
        parts: np.ndarray,
        offsets: np.ndarray,
        rowids: np.ndarray,
        tombstones: int,
        is_insert: np.ndarray,
    ) -> FinalStates:
        """The last state of each key of `rows` (one row per record, with its source
        commit version, delete flag, Kafka partition and offset, source row ID, insert
        flag), and which of the upserted keys need no lookup."""
        if self.key == [SOURCE_ROWID]:
            rows = rows.append_column(pa.field(SOURCE_ROWID, pa.int64(), False), pa.array(rowids))
        missing = [c for c in self.key if c not in rows.column_names]
        if missing:
            raise ReplicateError(
                f"key column(s) {missing} are not in the records of {self.topic!r} "
                f"(columns: {rows.column_names}); pick --key from those columns"
            )
        # commit order; within a commit deletes first (a key deleted and re-inserted by
        # one commit under another row ID ends inserted), then Kafka order
        order = np.lexsort((offsets, parts, ~is_delete, versions))
        if (order != np.arange(order.size)).any():
            rows = rows.take(pa.array(order))
            is_delete, is_insert, versions = is_delete[order], is_insert[order], versions[order]
        groups = (
            rows.select(self.key)
            .append_column("_i", pa.array(np.arange(rows.num_rows)))
            .group_by(self.key, use_threads=False)
            .aggregate([("_i", "max"), ("_i", "min")])
        )
        last, first = groups["_i_max"].to_numpy(), groups["_i_min"].to_numpy()
        by_last = np.argsort(last)
        last, first = last[by_last], first[by_last]
        final = rows if last.size == rows.num_rows else rows.take(pa.array(last))
        final_delete = is_delete[last]
        upserts = final.filter(pa.array(~final_delete))
        deletes = final.filter(pa.array(final_delete)).select(self.key)
        new_rows = None
        if self.key == [SOURCE_ROWID] and self._fresh is not None:
            held_version, held_rowid = self._fresh
            # above every row ID the replica ever held, or first inserted here above the
            # source version the replica held (see the module doc)
            key = rows[SOURCE_ROWID].to_numpy()
            new = (key[last] > held_rowid) | (is_insert[first] & (versions[first] > held_version))
            new_rows = new[~final_delete]
        return FinalStates(upserts, deletes, tombstones, int(versions.max()), new_rows)

    def _to_arrow(
        self, images: list[dict[str, Any]], schema: pa.Schema, msgs: list[Message]
    ) -> tuple[pa.Table, set[int]]:
        """The images as one Arrow table in the newest writer schema of the batch; if
        that fails, the records that do not fit are found one by one and set aside."""
        try:
            return pa.Table.from_pylist(images, schema=schema), set()
        except (pa.ArrowException, TypeError, ValueError):
            pass
        bad: set[int] = set()
        for i, (image, m) in enumerate(zip(images, msgs, strict=True)):
            try:
                pa.Table.from_pylist([image], schema=schema)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                bad.add(i)
                self._dead_letter(m, exc)
        good = [image for i, image in enumerate(images) if i not in bad]
        return pa.Table.from_pylist(good, schema=schema), bad

    def _dead_letter(self, m: Message, exc: Exception) -> None:
        where = f"partition {m.partition()} offset {m.offset()} of {self.topic!r}"
        error = scrub(f"{type(exc).__name__}: {exc}")  # (a record header: no secret in it)
        if self.dlq is None or self.dead_letter_topic is None:  # (set together)
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
        self.dlq.produce(self.dead_letter_topic, key=m.key(), value=m.value(), headers=headers)
        if self.dlq.flush(30):
            self.counters.failed()
            raise ReplicateError(
                f"could not write the record at {where} to the dead-letter topic "
                f"{self.dead_letter_topic!r}; nothing of its batch was applied"
            )
        self.counters.dead_letters += 1
        log.warning("record at %s sent to %s: %s", where, self.dead_letter_topic, error)

    def _lag(self, next_offsets: dict[int, int]) -> int:
        """Records behind the partitions' high watermarks, as of the consumer's last
        fetch responses (cached): asking the broker would wait behind the consumer's
        pending long-poll fetch (docs/benchmarks.md, "Inside the replicator")."""
        lag = 0
        for p, o in next_offsets.items():
            try:
                _, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), cached=True
                )
            except KafkaException:
                continue
            if high is not None and high >= 0:  # negative: no fetch response yet
                lag += max(0, high - o)
        return lag


def replicate(
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    target: str,
    idle_timeout: float | None = None,
    **options: Any,
) -> Counters:
    """Run a `Replicator` until stopped (or idle for `idle_timeout` seconds)."""
    return Replicator(bootstrap_servers, topic, schema_registry, target, **options).run(
        idle_timeout
    )
