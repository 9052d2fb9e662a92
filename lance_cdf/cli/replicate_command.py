"""`lance-cdf replicate`: a topic's (or a database's topics') changes applied to replica tables."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING

from lance_cdf.cli.flags import (
    Subcommands,
    client_settings,
    client_settings_flags,
    csv_list,
    index_flag,
    kafka_endpoint_flags,
    metrics_flags,
    on_signals,
    registry_url,
    seconds,
    storage_options,
)
from lance_cdf.errors import LanceCdfError
from lance_cdf.ops import malloc
from lance_cdf.replicate.replicate_settings import BatchSettings, DatabaseSettings

# the flags' defaults are the settings' own (one place for each)
BATCH, DATABASE = BatchSettings(), DatabaseSettings()

if TYPE_CHECKING:
    from lance_cdf.replicate.database_replicator import DatabaseReplicator
    from lance_cdf.replicate.replicate_settings import ReplicateSettings

# what `add_subparsers` returns: each command's parser is made with its `add_parser`

# (s) a database replicator's lease TTL: a replicator that dies on another machine has its
# tables taken up within this (its group membership ends sooner, --member-timeout)
DATABASE_LEASE_TTL_S = 20.0


def replicate_parser(sub: Subcommands) -> None:
    """`lance-cdf replicate`: where from, where to (one table, or `_database_flags`); how
    records are batched and applied, how a run ends, what it reports: the flag groups."""
    rep = sub.add_parser(
        "replicate",
        help="apply a published change topic to a replica Lance table",
        description="Consume a topic written by `lance-cdf publish` and apply its changes to a "
        "Lance table (created on the first batch, with stable row IDs). Exactly once in "
        "effect: the Kafka position is stored in the same Lance commit as the rows. Stops "
        "cleanly on SIGTERM / Ctrl-C after the current batch.\n\n"
        "What a batch costs: decode, then one lookup of its keys through a BTREE index on "
        "the key (built on the first batch, held in memory: ~17 bytes per replica row), "
        "deletion vectors on the fragments those rows live in, one new fragment and one "
        "commit: it follows the batch, not the replica (1,000 mixed rows: 0.03-0.06 s into "
        "10M rows, 1.3-4x the time into 100k). Source inserts need no lookup (a new source row ID "
        "cannot be in the replica yet), only updates and deletes do. A batch so large that "
        "probing the index key by key costs more than one scan of the key column (keys x "
        "750 > replica rows) scans that column instead; composite keys use merge_insert "
        "(O(replica)). "
        "Latency vs throughput: a batch is what has arrived (applied as soon as no more "
        "records are waiting); --max-batch-interval bounds how long it keeps taking records "
        "that keep coming, --max-batch-rows its size; small batches mean low latency and "
        "more small fragments, which the replicator compacts as the replica's shape calls for.",
        epilog="example:\n  lance-cdf replicate --bootstrap-servers 127.0.0.1:9092 --topic "
        "events.cdf \\\n      --schema-registry http://127.0.0.1:8081 --target "
        "/data/replica.lance --key id",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kafka_endpoint_flags(rep, topic_required=False)
    rep.add_argument("--target", default=None, help="replica table path or URI (with --topic)")
    _database_flags(rep)
    _batch_flags(rep)
    _upkeep_flags(rep)
    _whole_version_flags(rep)
    _run_flags(rep)
    client_settings_flags(rep, "consumer", "the replica table")
    _report_flags(rep)
    rep.set_defaults(func=cmd_replicate)


def _database_flags(rep: argparse.ArgumentParser) -> None:
    """A whole database: every topic of a prefix into its table (`DatabaseReplicator`)."""
    rep.add_argument(
        "--database-target",
        default=None,
        metavar="URI",
        help="instead of --topic/--target: replicate every topic PREFIX.<table> "
        "(see --topic-prefix) into the table of that qualified name (sales.orders: "
        "table orders of namespace sales) of this LanceDB database / Lance "
        "directory namespace, with one consumer; new topics are picked up, "
        "deleted ones let go",
    )
    rep.add_argument(
        "--topic-prefix",
        default=None,
        metavar="P",
        help="with --database-target: the publisher's --topic-prefix",
    )
    rep.add_argument(
        "--include",
        default=None,
        metavar="REGEX",
        help="with --database-target: only tables whose qualified name matches",
    )
    rep.add_argument(
        "--exclude",
        default=None,
        metavar="REGEX",
        help="with --database-target: not the tables whose qualified name matches",
    )
    rep.add_argument(
        "--refresh-interval",
        type=seconds,
        default=DATABASE.refresh_s,
        metavar="SECONDS",
        help="with --database-target: how often the topic list is read for new "
        f"and deleted topics (default {DATABASE.refresh_s:g})",
    )
    rep.add_argument(
        "--member-timeout",
        type=seconds,
        default=DATABASE.member_timeout_s,
        metavar="SECONDS",
        help="with --database-target: the replicators of one --group-id share the "
        "tables; one that stops heartbeating leaves the group after this long (Kafka's "
        "session timeout, within the broker's group.min/max.session.timeout.ms) and its "
        "tables are taken up by the others once their leases are free (default "
        f"{DATABASE.member_timeout_s:g}, the broker's smallest by default)",
    )


def _batch_flags(rep: argparse.ArgumentParser) -> None:
    """The replica's key, and which records a batch holds: consumer group, size, pace."""
    rep.add_argument(
        "--key",
        type=csv_list,
        default=None,
        help="replica key columns, e.g. id,tenant (default: _source_rowid, the "
        "source's stable row ID kept as a column)",
    )
    rep.add_argument(
        "--group-id",
        default=None,
        help="consumer group (default lance-cdf-replicate-TOPIC; with "
        "--database-target lance-cdf-replicate-db-PREFIX)",
    )
    rep.add_argument(
        "--max-batch-rows",
        type=int,
        default=BATCH.max_batch_rows,
        help="records per batch (one Lance commit); bigger batches: fewer "
        f"commits and files, more throughput, more latency (default {BATCH.max_batch_rows})",
    )
    rep.add_argument(
        "--max-batch-interval",
        type=seconds,
        default=BATCH.max_batch_interval,
        metavar="SECONDS",
        help="longest a batch keeps taking records that keep coming, e.g. 1 "
        "or 500ms (a quiet topic's records are applied at once)",
    )


def _upkeep_flags(rep: argparse.ArgumentParser) -> None:
    """How a batch finds the replica rows it replaces, and the replica's upkeep."""
    rep.add_argument(
        "--compact-every",
        type=int,
        default=None,
        metavar="N",
        help="compact the replica's small fragments every N batches instead of when "
        "its shape calls for it (by default: more than 4 fragments beyond what "
        "compaction would leave, or a tenth of its rows deleted); 0: never",
    )
    rep.add_argument(
        "--index-rows",
        type=int,
        default=None,
        metavar="ROWS",
        help="add new fragments to the key index once they hold more "
        "than ROWS rows (default 100000); lookups scan them till then",
    )
    rep.add_argument(
        "--keep-row-ids",
        action="store_true",
        help="an updated row keeps its replica _rowid (the replica's own "
        "change feed then shows updates, not delete+insert); each commit "
        "then costs O(replica rows): ~3 s at 10M rows",
    )
    rep.add_argument(
        "--no-index-preload",
        action="store_true",
        help="do not load the key index into memory up front (~17 bytes per "
        "replica row); lookups then read index pages from storage as they "
        "meet them (~5x slower per key into 10M rows until cached)",
    )
    rep.add_argument(
        "--no-key-map",
        action="store_true",
        help="do not keep the in-memory key -> row address map of an integer "
        "key (~16 bytes per replica row, built by one scan of the key column "
        "at start and after each compaction: 0.7-1.5 s per 10M rows); lookups "
        "then go through the key index (a 100,000-row batch into 10M rows "
        "then costs O(replica))",
    )
    rep.add_argument(
        "--no-indexes",
        action="store_true",
        help="do not build, rebuild or drop the source's secondary indexes on the "
        "replica (its config and schema/field metadata still follow the source)",
    )
    rep.add_argument(
        "--index",
        type=index_flag,
        action="append",
        default=[],
        metavar="NAME=TYPE:COLUMN[:k=v,...]",
        help="a replica-only index, built once and kept current, never dropped by the "
        "source's definition (repeatable), e.g. cat_idx=BITMAP:category or "
        "emb_idx=IVF_PQ:vector:metric=cosine,num_partitions=256,num_sub_vectors=16",
    )


def _whole_version_flags(rep: argparse.ArgumentParser) -> None:
    """Whole source versions: the transaction topic, and the records held for it."""
    rep.add_argument(
        "--transaction-topic",
        default=None,
        metavar="TOPIC",
        help="publish's BEGIN/END records (default <topic>.transaction): each "
        "replica commit then equals the source at one version",
    )
    rep.add_argument(
        "--no-transaction-topic",
        action="store_true",
        help="apply records as they come; no source version is recorded",
    )
    rep.add_argument(
        "--max-pending-records",
        type=int,
        default=BATCH.max_pending_records,
        metavar="N",
        help="records of unfinished versions held in memory; beyond, they are "
        "applied as a piece; status says the replica is inside a version (default "
        f"{BATCH.max_pending_records})",
    )


def _run_flags(rep: argparse.ArgumentParser) -> None:
    """How a run starts and ends: undecodable records, idleness, rebuilds, the lease."""
    rep.add_argument(
        "--dead-letter-topic",
        default=None,
        metavar="TOPIC",
        help="set undecodable records aside here (error in a header) and go on; "
        "without it the replicator stops at such a record",
    )
    rep.add_argument(
        "--idle-timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="exit 0 once no record has arrived for this long (counted from "
        "start while the topic does not exist)",
    )
    rep.add_argument(
        "--rebuild",
        action="store_true",
        help="a missing or empty replica is built from the beginning of the "
        "topic although the consumer group has committed offsets (without it "
        "that start is refused); the topic must still hold its history",
    )
    rep.add_argument(
        "--lease-ttl",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="one replicator per replica: its lease expires this long after its "
        "last renewal (every third of it) if it dies elsewhere, and is then "
        "taken over (default 30; with --database-target 20)",
    )


def _report_flags(rep: argparse.ArgumentParser) -> None:
    """What `replicate` reports: metrics, and the source tables its lag is measured on."""
    metrics_flags(rep)
    rep.add_argument(
        "--source-table",
        default=None,
        metavar="URI",
        help="the published table (read-only): its latest version and commit "
        "times give the lag metrics in versions and seconds",
    )
    rep.add_argument(
        "--source-database",
        default=None,
        metavar="URI",
        help="with --database-target: the published database (read-only): its "
        "tables' latest versions and commit times give each replica table's "
        "lag metrics",
    )
    rep.add_argument(
        "--source-storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storage option for --source-table / --source-database (repeatable)",
    )


def cmd_replicate(args: argparse.Namespace) -> int:
    """`lance-cdf replicate`: apply a topic's change records to a replica Lance table, whole
    source versions at a time, until stopped (or `--idle-timeout` passes with nothing new).

    Returns 0 after a clean stop, also during start-up (nothing applied then). Raises
    `LanceCdfError` (exit 2) for a replica of another topic or table (`ForeignReplicaError`),
    a position the topic no longer holds (`ReplicaPositionError`), a replica leased by
    another replicator (`LeaseHeldError`), or an unreachable broker / registry."""
    # a stop (SIGTERM / SIGINT, to the process or its group) while starting up (imports,
    # connection checks that may wait on a hung broker or registry) ends it quietly, exit
    # 0; once running, the handlers around Replicator.run finish the batch in hand instead
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    malloc.map_large_blocks_unless_told()  # its compactions' blocks go back when freed
    try:
        return _replicate(args)
    except KeyboardInterrupt:
        print("stopped while starting: nothing applied", flush=True)
        return 0


def _replicate(args: argparse.Namespace) -> int:
    import logging

    from lance_cdf.ops.clientconfig import redact_url, scrub_logging
    from lance_cdf.replicate.replicator import Replicator

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    scrub_logging()  # the registry client's request log names its URL, user-info included
    if args.database_target is not None or args.topic_prefix is not None:
        return _replicate_database(args)
    if args.topic is None or args.target is None or args.source_database is not None:
        raise LanceCdfError(
            "replicate needs --topic and --target (one table, --source-table its source), "
            "or --database-target and --topic-prefix (every table of a database, "
            "--source-database its source)"
        )
    replicator = Replicator(_settings(args, args.topic, args.target))
    print(
        f"replicating {args.topic} on {redact_url(args.bootstrap_servers)} -> "
        f"{redact_url(args.target)}",
        flush=True,
    )
    if args.metrics_port is not None:
        from lance_cdf.ops.metrics import PipelineMetrics, Progress

        c = replicator.counters
        progress = lambda: Progress(  # noqa: E731 (read on every scrape)
            version=c.source_version or None,
            events=c.records,
            batches=c.batches,
            dead_letters=c.dead_letters,
            delivery_failures=c.delivery_failures,
            last_error=c.last_error,
            kafka_lag=c.lag,
            index_builds=c.index_builds,
            indexes_unbuilt=c.indexes_unbuilt,
            consumer_restarts=c.consumer_restarts,
        )
        metrics = PipelineMetrics(
            "replicate",
            progress,
            args.source_table,
            storage_options(args.source_storage_option, "--source-storage-option"),
            args.topic,
        )
        print(f"metrics at {metrics.serve(args.metrics_port, args.metrics_host)}", flush=True)
    with on_signals(lambda *_: replicator.stop()):  # the batch in hand is finished
        counters = replicator.run(idle_timeout=args.idle_timeout)
    print(
        f"stopped: {counters.batches} batches, {counters.records} records, "
        f"{counters.upserts} upserts, {counters.deletes} deletes, "
        f"{counters.dead_letters} dead letters, source version {counters.source_version}",
        flush=True,
    )
    return 0


def _replicate_database(args: argparse.Namespace) -> int:
    """`lance-cdf replicate --database-target URI --topic-prefix P` (`DatabaseReplicator`)."""
    from lance_cdf.ops.clientconfig import redact_url
    from lance_cdf.replicate.database_replicator import DatabaseReplicator

    if args.database_target is None or args.topic_prefix is None:
        raise LanceCdfError("--database-target and --topic-prefix go together")
    used = [
        flag
        for flag, value in (
            ("--topic", args.topic),
            ("--target", args.target),
            ("--key", args.key),
            ("--transaction-topic", args.transaction_topic),
            ("--source-table", args.source_table),
        )
        if value is not None
    ]
    if used:
        raise LanceCdfError(
            f"{', '.join(used)} cannot be used with --database-target (each table's topic, "
            "transaction topic and replica follow from its name; replicas are keyed by "
            "_source_rowid)"
        )
    # (each table's topic and transaction topic follow from its name: --topic, --key and
    # --transaction-topic were refused above, so the settings hold none)
    replicator = DatabaseReplicator(_settings(args, args.topic_prefix, args.database_target))
    print(
        f"replicating {args.topic_prefix}.* on {redact_url(args.bootstrap_servers)} -> "
        f"{redact_url(args.database_target)}",
        flush=True,
    )
    if args.metrics_port is not None:
        _serve_database_metrics(replicator, args)
    with on_signals(lambda *_: replicator.stop()):  # each table's batch in hand finished
        counters = replicator.run(idle_timeout=args.idle_timeout)
    for name, c in sorted(counters.items()):
        print(
            f"stopped {name}: {c.batches} batches, {c.records} records, {c.upserts} upserts, "
            f"{c.deletes} deletes, source version {c.source_version}",
            flush=True,
        )
    for name in replicator.gone:
        print(f"let go {name}: its topic was deleted", flush=True)
    if replicator.refused:
        raise LanceCdfError(
            f"{len(replicator.refused)} table(s) not replicated (the others were): "
            + "; ".join(sorted(replicator.refused.values()))
        )
    return 0


def _serve_database_metrics(replicator: DatabaseReplicator, args: argparse.Namespace) -> None:
    """A database replicator's metrics: the counters summed over its tables, the applied
    version and Kafka lag per replica table (`table` label: the tables replicated now), and
    with --source-database each table's source and lag gauges."""
    from lance_cdf.ops.metrics import PipelineMetrics, Progress
    from lance_cdf.replicate.database_replicator import SourceTables

    options = storage_options(args.source_storage_option, "--source-storage-option")
    sources = SourceTables(args.source_database, options) if args.source_database else None

    def progress() -> Progress:
        c = replicator.totals()
        return Progress(
            events=c.records,
            batches=c.batches,
            dead_letters=c.dead_letters,
            delivery_failures=c.delivery_failures,
            last_error=c.last_error,
            index_builds=c.index_builds,
            indexes_unbuilt=c.indexes_unbuilt,
            consumer_restarts=c.consumer_restarts,
        )

    def tables() -> dict[str, tuple[str | None, int | None]]:
        held = replicator.table_positions()
        uris = sources.uris(sorted(held)) if sources is not None else {}
        return {name: (uris.get(name), version) for name, (version, _) in held.items()}

    metrics = PipelineMetrics(
        "replicate",
        progress,
        None,
        options,
        f"{args.topic_prefix}.*",
        tables=tables,
        kafka_lags=lambda: {name: lag for name, (_, lag) in replicator.table_positions().items()},
    )
    print(f"metrics at {metrics.serve(args.metrics_port, args.metrics_host)}", flush=True)


def _settings(args: argparse.Namespace, topic: str, target: str) -> ReplicateSettings:
    """The replicator's settings from the flags: `topic` the change topic (a database's:
    the topic prefix), `target` the replica table (a database's: the replica database)."""
    from lance_cdf.replicate.replicate_settings import (
        KafkaSettings,
        ReplicaSettings,
        ReplicateSettings,
    )

    kafka = KafkaSettings(
        args.bootstrap_servers,
        registry_url(args),
        group_id=args.group_id,
        consumer_config=client_settings(args, "consumer_config"),
        registry_config=client_settings(args, "registry_config"),
        dead_letter_topic=args.dead_letter_topic,
    )
    batching = BatchSettings(
        max_batch_rows=args.max_batch_rows,
        max_batch_interval=args.max_batch_interval,
        transaction_metadata=not args.no_transaction_topic,
        transaction_topic=args.transaction_topic,
        max_pending_records=args.max_pending_records,
        pause_gc=True,  # this process is the replicator's own
    )
    replica = ReplicaSettings(
        key=tuple(args.key) if args.key else None,
        storage_options=storage_options(args.storage_option),
        compact_every=args.compact_every,
        index_rows_max=args.index_rows,
        keep_row_ids=args.keep_row_ids,
        preload_index=not args.no_index_preload,
        key_map=not args.no_key_map,
        source_indexes=not args.no_indexes,
        replica_indexes=tuple(args.index),
        rebuild=args.rebuild,
        lease_ttl_s=args.lease_ttl
        if args.lease_ttl is not None
        else (
            DATABASE_LEASE_TTL_S
            if args.database_target is not None
            else ReplicaSettings.lease_ttl_s
        ),
    )
    database = DatabaseSettings(
        args.include, args.exclude, args.refresh_interval, args.member_timeout
    )
    return ReplicateSettings(kafka, topic, target, batching, replica, database)
