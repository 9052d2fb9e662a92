"""Options of the `lance-cdf-kafka` Spark sink, parsed and checked once (`SinkOptions.parse`)
where Spark hands them over (`LanceCdfKafkaSink.streamWriter`) and written back as Spark
options (`SinkOptions.to_options`) by `lance-cdf publish`, which builds them from its
settings. Every option is in the Spark options reference (docs/reference/spark-options.md;
`test_docs` checks that each one known here is there)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from lance_cdf.errors import LanceCdfError
from lance_cdf.kafka.outage import FLUSH_TIMEOUT_S, RIDE_OUT_S
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.spark.source.options import option_bool

KAFKA, REGISTRY, STORAGE, TOPIC_CONFIG = "kafka.", "registry.", "storage.", "topic.config."
BOOTSTRAP = "kafka.bootstrap.servers"
# the options taken whole (lower-cased); the prefixes above carry settings of their own
KNOWN = frozenset(
    {
        BOOTSTRAP,
        "schema.registry.url",
        "topic",
        "table",
        "table.name",
        "database",
        "topic.prefix",
        "key",
        "tombstones",
        "exactlyonce",
        "transactionmetadata",
        "tabledefinitions",
        "transaction.topic",
        "topic.partitions",
        "topic.replicationfactor",
        "flushtimeout",
        "rideout",
        "checkpointlocation",
        "handover",  # publish's head start hands over to the writer tasks through it
    }
)
PREFIXES = (KAFKA, REGISTRY, STORAGE, TOPIC_CONFIG)


def _settings(raw: Mapping[str, str], prefix: str) -> tuple[tuple[str, str], ...]:
    """The options under `prefix` (any case), the prefix stripped and the rest kept as
    given: client settings are case-sensitive."""
    return tuple(
        sorted((k[len(prefix) :], v) for k, v in raw.items() if k.lower().startswith(prefix))
    )


def key_columns(text: str | None) -> tuple[str, ...]:
    """Comma-separated key columns (option `key`, `--key`); `_rowid` is the default key, so
    () stands for it."""
    named = (c.strip() for c in (text or "").split(","))
    return tuple(c for c in named if c and c != "_rowid")


def _seconds(raw: str | None, key: str, default: float) -> float:
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise LanceCdfError(f"option {key}={raw!r} must be a number of seconds above 0")
    return value


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options (names case-insensitive, as Spark's). One table (`table`, `topic`)
    or a database (`database`, `topic.prefix`: a topic `<prefix>.<name>` per table, see
    `for_table`). `parse` raises `LanceCdfError` naming an unknown option, a bad value or a
    missing required one. Hashable: a process keeps its publishers per `SinkOptions`."""

    bootstrap_servers: str
    registry_url: str
    table: str | None = None  # the source table's URI
    topic: str | None = None
    # `prefix.table`: the records' Avro names and `source.name` / `source.table`
    table_name: str | None = None
    database: str | None = None
    topic_prefix: str | None = None
    key: tuple[str, ...] = ()  # the key columns; () keys by `_rowid`
    tombstones: bool = True
    exactly_once: bool = True
    transaction_metadata: bool = True
    table_definitions: bool = True
    transaction_topic: str | None = None  # None: `<topic>.transaction`
    topics: TopicSettings = field(default_factory=TopicSettings)
    flush_timeout_s: float = FLUSH_TIMEOUT_S
    ride_out_s: float = RIDE_OUT_S  # how long a broker outage is ridden out (`RideOut`)
    checkpoint: str | None = None  # where an outage's state goes
    hand_over: str | None = None
    producer: tuple[tuple[str, str], ...] = ()  # `kafka.*` but the bootstrap servers
    registry: tuple[tuple[str, str], ...] = ()  # `registry.*`
    storage: tuple[tuple[str, str], ...] = ()  # `storage.*`: the table's storage options

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SinkOptions:
        given = {str(k): str(v) for k, v in raw.items()}
        lower = {k.lower(): v for k, v in given.items()}
        unknown = sorted(
            k for k in given if k.lower() not in KNOWN and not k.lower().startswith(PREFIXES)
        )
        if unknown:
            raise LanceCdfError(
                f"unknown option(s) {unknown} for lance-cdf-kafka; known: {sorted(KNOWN)} and "
                f"{', '.join(p + '<key>' for p in PREFIXES)}"
            )
        database = lower.get("database") or None
        target = ("database", "topic.prefix") if database else ("topic", "table")
        for required in (BOOTSTRAP, "schema.registry.url", *target):
            if not lower.get(required):
                raise LanceCdfError(f'the lance-cdf-kafka sink needs option "{required}"')
        return cls(
            bootstrap_servers=lower[BOOTSTRAP],
            registry_url=lower["schema.registry.url"],
            table=None if database else lower["table"],
            topic=None if database else lower["topic"],
            table_name=None if database else lower.get("table.name") or None,
            database=database,
            topic_prefix=lower["topic.prefix"] if database else None,
            key=key_columns(lower.get("key")),
            tombstones=option_bool(lower, "tombstones", True),
            exactly_once=option_bool(lower, "exactlyOnce", True),
            transaction_metadata=option_bool(lower, "transactionMetadata", True),
            table_definitions=option_bool(lower, "tableDefinitions", True),
            transaction_topic=lower.get("transaction.topic") or None,
            topics=TopicSettings.from_options(given),
            flush_timeout_s=_seconds(lower.get("flushtimeout"), "flushTimeout", FLUSH_TIMEOUT_S),
            ride_out_s=_seconds(lower.get("rideout"), "rideOut", RIDE_OUT_S),
            checkpoint=lower.get("checkpointlocation") or None,
            hand_over=lower.get("handover") or None,
            producer=tuple(kv for kv in _settings(given, KAFKA) if kv[0] != "bootstrap.servers"),
            registry=_settings(given, REGISTRY),
            storage=_settings(given, STORAGE),
        )

    def to_options(self) -> dict[str, str]:
        """The Spark options that `parse` reads back as these (`parse(o.to_options()) == o`)."""
        out = {BOOTSTRAP: self.bootstrap_servers, "schema.registry.url": self.registry_url}
        named = {
            "table": self.table,
            "topic": self.topic,
            "table.name": self.table_name,
            "database": self.database,
            "topic.prefix": self.topic_prefix,
            "key": ",".join(self.key) or None,
            "transaction.topic": self.transaction_topic,
            "checkpointLocation": self.checkpoint,
            "handOver": self.hand_over,
        }
        out.update({k: v for k, v in named.items() if v is not None})
        out.update(
            {
                "tombstones": str(self.tombstones).lower(),
                "exactlyOnce": str(self.exactly_once).lower(),
                "transactionMetadata": str(self.transaction_metadata).lower(),
                "tableDefinitions": str(self.table_definitions).lower(),
                "flushTimeout": repr(self.flush_timeout_s),
                "rideOut": repr(self.ride_out_s),
            }
        )
        out.update(self.topics.options())
        for prefix, pairs in ((KAFKA, self.producer), (REGISTRY, self.registry)):
            out.update({prefix + k: v for k, v in pairs})
        out.update({STORAGE + k: v for k, v in self.storage})
        return out

    def for_table(self, table: str, name: str) -> SinkOptions:
        """A database sink's options for its table `name` at URI `table`: the table's
        topic `<topic.prefix>.<name>`, as a single-table sink's."""
        return replace(self, table=table, topic=f"{self.topic_prefix}.{name}")

    @property
    def producer_config(self) -> dict[str, str]:
        return dict(self.producer)

    @property
    def registry_config(self) -> dict[str, str]:
        return dict(self.registry)

    @property
    def storage_options(self) -> dict[str, str]:
        return dict(self.storage)
