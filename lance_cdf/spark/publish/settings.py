"""What `lance-cdf publish` is asked to do, as types: built once (by the CLI from its flags)
and passed down to the runner, which gives Spark's source and sink their options from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from lance_cdf.errors import LanceCdfError
from lance_cdf.kafka.topic_settings import TopicSettings

# A commit waits for the next trigger, then for the micro-batch: commits land at any phase
# of it, so the wait's tail is the whole interval: 500 ms keeps the p99 to Kafka and to the
# replica short (docs/benchmarks.md, "Latency under load"). An idle
# trigger asks the table for its latest version (one listing of
# `_versions/`): twice a second for one table. A database's tables are each listed at every
# trigger (200 tables: 200 listings), so it keeps 1 s.
DEFAULT_TRIGGER = "500 milliseconds"
DEFAULT_DATABASE_TRIGGER = "1 second"
# With commit events a trigger looks only at the tables an event named (and the few whose
# safety-net look is due): an idle trigger costs no request, and a commit waits half as
# long for the trigger that publishes it.
DEFAULT_EVENTS_TRIGGER = "500 milliseconds"


@dataclass(frozen=True)
class Database:
    """`lance-cdf publish --database`: the database, which of its tables (regexes over
    qualified names, `re.fullmatch`), and the prefix of their topics. `idle_poll_max`:
    the longest wait, in seconds, between two looks (one listing each) at a table that
    stays quiet (`IdlePolls`; None: its default, 0: every trigger).
    `commit_events`: an SQS queue URL, or `files`, whose storage events name the tables
    that commit (`CommitEvents`; None: found by listing alone), and `events_poll_max` the
    safety net's longest wait while they are heard (None: its default)."""

    uri: str
    topic_prefix: str
    include: str | None = None
    exclude: str | None = None
    idle_poll_max: float | None = None
    commit_events: str | None = None
    events_poll_max: float | None = None

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}.{name}"


@dataclass(frozen=True)
class SourceSettings:
    """What is read: the table (or, with `database`, every matching table of a database:
    `table` unused; `DatabaseReader`) and from where.

    `starting_version`: a number, "latest" or "earliest" (None: "latest"), for a new
    checkpoint only: with an existing checkpoint it must be the one that checkpoint was
    started with (or None), else CheckpointMismatchError (the checkpoint would ignore it).
    `snapshot`: first the table as it stands when the query first starts, as `op="r"`
    records, then the changes after it (the checkpoint remembers the snapshot's version and
    how far it got). `storage_options`: the table's (and an object-storage checkpoint's)."""

    table: str = ""
    database: Database | None = None
    starting_version: str | None = None
    snapshot: bool = False
    drop_unchanged_updates: bool = False
    max_rows_per_trigger: int | None = None
    storage_options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KafkaTarget:
    """Where the records go and how they are made.

    `topic`: unused with a database (each table to `<topic_prefix>.<qualified name>`).
    `key`: the key columns, comma-separated (None: `_rowid`). `table_name`: `prefix.table`
    naming the Avro records (`prefix.table.Envelope`) and `source.name` / `source.table`;
    default `lancecdf.<table directory name>`. `topics`: how the topics publish writes are
    created if missing (partitions, replication factor, topic settings; `TopicSettings`); by
    default the broker's defaults, and for a database as many partitions as there are
    writers. `transaction_metadata`: a BEGIN and an END record per commit version on
    `transaction_topic` (default `<topic>.transaction`; `TransactionWriter`), with the
    table's definition where it changed unless `table_definitions` is False
    (`definition_sync.TableDefinitions`).
    `exactly_once`: a replayed micro-batch skips the records each partition already holds
    (per-partition high-water marks); False: plain at-least-once. `flush_timeout`: seconds
    a micro-batch waits for the broker's acknowledgements (and for a partition's last
    record) before the broker counts as not answering and the outage is ridden out
    (`RideOut`); None: the sink's default, 60 (sink option `flushTimeout`)."""

    bootstrap_servers: str
    topic: str  # ("" with a database)
    schema_registry: str
    producer_config: dict[str, str] = field(default_factory=dict)
    registry_config: dict[str, str] = field(default_factory=dict)
    key: str | None = None
    tombstones: bool = True
    table_name: str | None = None
    topics: TopicSettings = field(default_factory=TopicSettings)
    transaction_topic: str | None = None
    transaction_metadata: bool = True
    table_definitions: bool = True
    exactly_once: bool = True
    flush_timeout: float | None = None


@dataclass(frozen=True)
class RunSettings:
    """How the Spark job runs.

    `trigger_interval`: Spark's micro-batch interval; None: `DEFAULT_TRIGGER` for a table,
    `DEFAULT_DATABASE_TRIGGER` for a database. `available_now`: publish up to the latest
    version at start, then return. `master`: the Spark master URL; by default the one
    `spark-submit --master` gave, else `local[2]` (an active session, a spark-submit
    script's, is reused). `writers`: parallel writer tasks per micro-batch (default: Spark's
    default parallelism), at most one per partition of the topic; each owns a disjoint set
    of partitions (`partition % writers`) and reads that share of the micro-batch's events
    itself, so per-key order holds whatever their number. `head_start`: publish the commits
    waiting at start, and those made while the query starts, from this process
    (`headstart.Rounds`; exactly-once only, and only where the query's start is
    known before it starts: a checkpoint's committed offset or a numeric starting
    version). `stop_timeout_s`:
    how long a stop (SIGTERM, SIGINT) waits for the running micro-batch to commit (its
    records and their versions' END) before interrupting it. `metrics_port`:
    serve Prometheus metrics on metrics_host:metrics_port (0: any free port;
    lance_cdf.ops.metrics). `warm_workers`: keep a local session's Python workers through
    quiet periods (Spark stops them after a minute idle, and the first micro-batch after
    one pays their start: `spark_driver.keep_workers_warm`); their memory
    stays while idle."""

    checkpoint: str
    trigger_interval: str | None = None
    available_now: bool = False
    master: str | None = None
    writers: int | None = None
    head_start: bool = True
    stop_timeout_s: float = 60.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    warm_workers: bool = True


@dataclass(frozen=True)
class PublishSettings:
    """Everything `publish` is asked: the source, the Kafka target and the run. Settings
    that contradict each other are refused here (LanceCdfError), before anything starts."""

    source: SourceSettings
    target: KafkaTarget
    run: RunSettings

    def __post_init__(self) -> None:
        if self.source.database is not None and (
            self.target.transaction_topic or self.target.table_name
        ):
            raise LanceCdfError(
                "--database names each table's topic, transaction topic and records itself: "
                "leave out --transaction-topic and --table-name"
            )
        if (
            self.target.transaction_metadata
            and self.source.snapshot
            and self.source.max_rows_per_trigger
        ):
            raise LanceCdfError(
                "--snapshot with --max-rows-per-trigger splits the snapshot's version over "
                "micro-batches, so its transaction metadata would count part of it; drop "
                "--max-rows-per-trigger, or publish with --no-transaction-metadata"
            )

    @property
    def database(self) -> Database | None:
        return self.source.database

    @property
    def checkpoint(self) -> str:
        return self.run.checkpoint

    @property
    def trigger_interval(self) -> str:
        if self.run.trigger_interval is not None:
            return self.run.trigger_interval
        if self.database is not None and self.database.commit_events:
            return DEFAULT_EVENTS_TRIGGER
        return DEFAULT_DATABASE_TRIGGER if self.database is not None else DEFAULT_TRIGGER

    @property
    def head_start(self) -> bool:
        """Whether the head start runs: exactly-once (its records are skipped by the query's
        writers through the exactly-once marks) and not turned off; for a table or a
        database (`TableRounds`, `DatabaseRounds`)."""
        return self.run.head_start and self.target.exactly_once

    def shown_topic(self) -> str:
        """The topic as the lease and messages name it (a database's: `<prefix>.*`)."""
        return self.database.topic("*") if self.database is not None else self.target.topic
