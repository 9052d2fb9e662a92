"""What a replicator is told, as one frozen value: where the records come from (Kafka and
the schema registry), which topic into which replica, how records are batched, and how the
replica is applied and kept up. `lance-cdf replicate` builds one from its flags and hands
it to a `Replicator` (one table) or a `DatabaseReplicator` (every table of a database).

Each field is named as the keyword `Replicator` took, with the same default, so
`ReplicateSettings.of(bootstrap_servers, topic, schema_registry, target, key=["id"],
max_batch_rows=50_000)` (and `Replicator(...)` with those arguments) reads as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from lance_cdf.format.definitions import IndexDefinition


@dataclass(frozen=True)
class KafkaSettings:
    """Where records come from: the broker and schema registry, the consumer group, their
    clients' settings, and where undecodable records go."""

    bootstrap_servers: str
    schema_registry: str
    # default lance-cdf-replicate-<topic>; a database replicator's lance-cdf-replicate-db-<prefix>
    group_id: str | None = None
    consumer_config: dict[str, Any] | None = None  # librdkafka settings (--consumer-config)
    registry_config: dict[str, Any] | None = None  # registry client settings (--registry-config)
    # how long a registry that does not answer is waited out before the replicator stops
    registry_outage_s: float = 120.0
    # undecodable records set aside there (None: the first one stops the replicator)
    dead_letter_topic: str | None = None


@dataclass(frozen=True)
class BatchSettings:
    """How polled records become batches: their size and pace, and whole source versions
    (the transaction topic; `VersionGate`)."""

    max_batch_rows: int = 100_000  # records per batch (one replica commit)
    max_batch_interval: float = 1.0  # (s) longest a batch keeps taking records that keep coming
    # read the transaction topic and apply whole source versions (False: records as they come)
    transaction_metadata: bool = True
    transaction_topic: str | None = None  # default <topic>.transaction
    max_pending_records: int = 200_000  # records of unfinished versions held in memory
    # Python's cyclic garbage collector off while a batch is consumed, decoded and applied:
    # a process-wide switch, so only `lance-cdf replicate` (its own process) sets it
    pause_gc: bool = False


@dataclass(frozen=True)
class ReplicaSettings:
    """The replica table: its key and storage, how a batch is applied, upkeep, and who may
    write it (`ReplicaTable`, `KeyLookup`)."""

    key: tuple[str, ...] | None = None  # default ("_source_rowid",): the source's row ID
    storage_options: dict[str, str] | None = None
    # compact when the replica's shape calls for it (None, `compaction_due`), or every N
    # batches instead (0: never)
    compact_every: int | None = None
    # add new fragments to the key index once they hold more rows than this (None: 100,000)
    index_rows_max: int | None = None
    keep_row_ids: bool = False  # an updated row keeps its replica row ID (O(replica) commits)
    preload_index: bool = True  # load the key index into memory when first met
    key_map: bool = True  # look integer keys up in an in-memory key -> row address map
    # start a missing or empty replica from the topic's beginning although the consumer
    # group has committed offsets
    rebuild: bool = False
    lease_ttl_s: float = 30.0  # the replica's one-writer lease expires this long after renewal
    # build, rebuild and drop the source's indexes as its definition says (False:
    # --no-indexes; config and metadata still follow the source)
    source_indexes: bool = True
    # replica-only indexes (--index), built once and kept current, never dropped by a
    # definition
    replica_indexes: tuple[IndexDefinition, ...] = ()

    def __post_init__(self) -> None:
        if self.key is not None:  # (a list given: kept as a tuple, the value stays frozen)
            object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "replica_indexes", tuple(self.replica_indexes))


@dataclass(frozen=True)
class DatabaseSettings:
    """A database replicator's tables: the topics `<topic prefix>.<qualified name>` whose
    qualified name fully matches `include` (if given) and not `exclude` (regexes)."""

    include: str | None = None
    exclude: str | None = None
    refresh_s: float = 5.0  # (s) how often the topic list is read for new and deleted topics
    # (s) a replicator of the group that stops heartbeating leaves it after this long, and
    # its tables are shared out among the others (`share_tables`). The broker's smallest
    # session timeout by default (group.min.session.timeout.ms): a killed replicator's
    # replacement joins the group and applies within about this long, and a shorter
    # session risks nothing but a rebalance, since each table's lease keeps one writer
    member_timeout_s: float = 6.0


@dataclass(frozen=True)
class ReplicateSettings:
    """Everything a replicator is told. `topic`: the change topic (a database replicator:
    the publisher's topic prefix); `target`: the replica table (a database replicator: the
    replica database)."""

    kafka: KafkaSettings
    topic: str
    target: str
    batching: BatchSettings = field(default_factory=BatchSettings)
    replica: ReplicaSettings = field(default_factory=ReplicaSettings)
    database: DatabaseSettings = field(default_factory=DatabaseSettings)

    @classmethod
    def of(
        cls, bootstrap_servers: str, topic: str, schema_registry: str, target: str, **options: Any
    ) -> ReplicateSettings:
        """From the keyword form `Replicator` and `DatabaseReplicator` take
        (`key=["id"], max_batch_rows=50_000, ...`): each keyword to its group."""
        groups: dict[str, dict[str, Any]] = {name: {} for name in _GROUP_OF.values()}
        for name, value in options.items():
            if name not in _GROUP_OF:
                raise TypeError(f"unknown replicator setting {name!r}")
            groups[_GROUP_OF[name]][name] = value
        return cls(
            KafkaSettings(bootstrap_servers, schema_registry, **groups["kafka"]),
            topic,
            target,
            BatchSettings(**groups["batching"]),
            ReplicaSettings(**groups["replica"]),
            DatabaseSettings(**groups["database"]),
        )

    @classmethod
    def given(
        cls, first: ReplicateSettings | str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ReplicateSettings:
        """A replicator's arguments as settings: a `ReplicateSettings` alone, or the
        keyword form (`of`)."""
        if not isinstance(first, ReplicateSettings):
            return cls.of(first, *args, **kwargs)
        if args or kwargs:
            raise TypeError("give a ReplicateSettings alone, or the keyword form without one")
        return first


# keyword -> the group it belongs to (the positional four excepted)
_GROUP_OF = {
    f.name: group
    for group, kind in (
        ("kafka", KafkaSettings),
        ("batching", BatchSettings),
        ("replica", ReplicaSettings),
        ("database", DatabaseSettings),
    )
    for f in fields(kind)
    if f.name not in ("bootstrap_servers", "schema_registry")
}
