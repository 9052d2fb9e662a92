"""`lance-cdf publish`: a table's (or a database's) changes to Kafka through Spark."""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING

from lance_cdf.cli.flags import (
    Subcommands,
    client_settings,
    client_settings_flags,
    database_flags,
    kafka_endpoint_flags,
    metrics_flags,
    on_signals,
    registry_url,
    seconds,
    storage_options,
    topic_flags,
    topic_settings,
    trigger_interval,
)
from lance_cdf.errors import LanceCdfError

if TYPE_CHECKING:
    from lance_cdf.spark.publish.settings import Database, PublishSettings

# what `add_subparsers` returns: each command's parser is made with its `add_parser`


def publish_parser(sub: Subcommands) -> None:
    """`lance-cdf publish`: one table, or a whole database."""
    pub = sub.add_parser(
        "publish",
        help="stream a table's changes to Kafka as Avro",
        description="Stream the table's changes to a Kafka topic as Debezium-style Avro records "
        "(Confluent wire format, schema registry), restartable from a checkpoint.",
        epilog="example:\n  lance-cdf publish --table /data/events.lance --bootstrap-servers "
        "127.0.0.1:9092 --topic events.cdf \\\n      --schema-registry "
        "http://127.0.0.1:8081 --checkpoint /data/ck/events --starting-version 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # (the groups in the order --help lists the flags)
    _source_flags(pub)
    _record_flags(pub)
    _delivery_flags(pub)
    topic_flags(pub)
    client_settings_flags(pub, "producer", "the source table")
    pub.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="Spark master (default: spark-submit's, else local[2])",
    )
    metrics_flags(pub)
    pub.set_defaults(func=cmd_publish)


def _source_flags(pub: argparse.ArgumentParser) -> None:
    """What is published where, and from which version."""
    pub.add_argument(
        "--table", default=None, help="table path or URI (file://, s3://, gs://, az://)"
    )
    kafka_endpoint_flags(pub)
    database_flags(pub)
    pub.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="Spark checkpoint directory"
    )
    pub.add_argument(
        "--starting-version",
        default=None,
        help="first version of a new checkpoint: a number, latest (default) or "
        "earliest; with an existing checkpoint only its own start",
    )
    pub.add_argument(
        "--snapshot",
        action="store_true",
        help="bootstrap: publish the table as it stands when the query first "
        "starts (op=r), then its changes (replaces --starting-version)",
    )
    pub.add_argument(
        "--drop-unchanged-updates",
        action="store_true",
        help="do not publish updates that changed no column value",
    )


def _record_flags(pub: argparse.ArgumentParser) -> None:
    """When micro-batches run, and the records they make."""
    pub.add_argument(
        "--trigger-interval",
        type=trigger_interval,
        default=None,
        help="micro-batch interval: 500ms, 2s, 1.5 or Spark's '1 second' "
        "(default 500ms; 1s with --database: a table that changed is listed "
        "every trigger, a quiet one up to --idle-poll-max apart)",
    )
    pub.add_argument(
        "--available-now",
        action="store_true",
        help="publish everything up to the latest version, then exit",
    )
    pub.add_argument("--key", default=None, help="key columns (default _rowid), e.g. id,tenant")
    pub.add_argument(
        "--table-name",
        default=None,
        metavar="PREFIX.TABLE",
        help="names the Avro records PREFIX.TABLE.Envelope/.Value/.Key and fills "
        "source.name/source.table (default lancecdf.<table directory)",
    )
    pub.add_argument("--no-tombstones", action="store_true", help="no null record after a delete")
    pub.add_argument("--max-rows-per-trigger", type=int, default=None)
    pub.add_argument(
        "--writers",
        type=int,
        default=None,
        metavar="N",
        help="parallel writer tasks per micro-batch (default: Spark's default "
        "parallelism; at most the topic's partition count)",
    )


def _delivery_flags(pub: argparse.ArgumentParser) -> None:
    """Exactly once, transaction metadata and the head start."""
    pub.add_argument(
        "--at-least-once",
        action="store_true",
        help="do not skip, on a replay, records the topic already holds",
    )
    pub.add_argument(
        "--transaction-topic",
        default=None,
        metavar="TOPIC",
        help="BEGIN/END records per commit version (default <topic>.transaction)",
    )
    pub.add_argument(
        "--no-transaction-metadata",
        action="store_true",
        help="write no BEGIN/END records (a replica then records no source "
        "version it cannot prove complete)",
    )
    pub.add_argument(
        "--no-table-definitions",
        action="store_true",
        help="send no index, config or metadata definitions on the transaction topic "
        "(the commit then reads no table manifest)",
    )
    pub.add_argument(
        "--no-head-start",
        action="store_true",
        help="do not publish the commits waiting at start, and those made while the "
        "query starts, from this process; the query publishes everything",
    )
    pub.add_argument(
        "--no-warm-workers",
        action="store_true",
        help="let a local session's Python workers stop after a minute without a "
        "micro-batch (Spark's default; less memory idle, a slower micro-batch after "
        "each quiet minute)",
    )
    pub.add_argument(
        "--stop-timeout",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="on SIGTERM / SIGINT, how long the running micro-batch may take to finish "
        "(its records and their versions' END) before it is interrupted (default 60)",
    )
    pub.add_argument(
        "--flush-timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="how long a micro-batch waits for the broker's acknowledgements before it "
        "counts the broker as not answering and rides the outage out (default 60)",
    )


def _publish_target(args: argparse.Namespace) -> Database | None:
    """The table and topic, or the database (`settings.Database`); one line if mixed."""
    from lance_cdf.spark.publish.settings import Database

    if args.database is None and (args.commit_events or args.commit_events_poll_max is not None):
        raise LanceCdfError(
            "--commit-events names the tables of a --database that commit; one --table's "
            "stream looks at its table every trigger"
        )
    if args.database is None:
        if (
            args.table is None
            or args.topic is None
            or args.topic_prefix
            or args.include
            or args.exclude
        ):
            raise LanceCdfError(
                "publish needs --table and --topic (one table), or --database and "
                "--topic-prefix (--include / --exclude: which of its tables)"
            )
        return None
    if args.table is not None or args.topic is not None or not args.topic_prefix:
        raise LanceCdfError(
            "--database publishes every table to --topic-prefix PREFIX.<table>: give "
            "--topic-prefix, and leave out --table and --topic"
        )
    import re

    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in args.topic_prefix.split(".")):
        raise LanceCdfError(
            f"--topic-prefix {args.topic_prefix!r} also names the Avro records "
            "(PREFIX.<table>.Envelope): use dot-separated parts of letters, digits and _, "
            "not starting with a digit, e.g. shop or cdf.prod"
        )
    if args.commit_events:  # refused here, before anything starts, if it cannot be
        from lance_cdf.ops.commit_hints import CommitEvents

        CommitEvents.parse(args.commit_events, args.database)
    return Database(
        args.database,
        args.topic_prefix,
        args.include,
        args.exclude,
        args.idle_poll_max,
        args.commit_events,
        args.commit_events_poll_max,
    )


def cmd_publish(args: argparse.Namespace) -> int:
    """`lance-cdf publish`: stream a table's changes to a Kafka topic until stopped (or, with
    `--available-now`, until caught up), exactly once, through
    `lance_cdf.spark.publish.runner.publish`.

    Returns 0 after a clean stop or catch-up; a failed query ends with one line naming the
    cause (Spark's text in `<checkpoint>/lance-cdf-publish.log`) and a non-zero status.
    Raises `LanceCdfError` (exit 2) for refused settings, an unreachable or refusing broker /
    registry, a foreign checkpoint, or a checkpoint leased by another publisher."""
    from lance_cdf.spark.publish.runner import publish

    settings = publish_settings(args)
    # SIGTERM / SIGINT stop publishing: the query is stopped, the checkpoint kept
    stop = threading.Event()
    with on_signals(lambda *_: stop.set()):
        return publish(settings, stop)


def publish_settings(args: argparse.Namespace) -> PublishSettings:
    """The flags as `PublishSettings` (LanceCdfError, one line, for a refused combination)."""
    from lance_cdf.spark.publish.settings import (
        KafkaTarget,
        PublishSettings,
        RunSettings,
        SourceSettings,
    )

    database = _publish_target(args)
    source = SourceSettings(
        table=args.table or "",
        database=database,
        starting_version=args.starting_version,
        snapshot=args.snapshot,
        drop_unchanged_updates=args.drop_unchanged_updates,
        max_rows_per_trigger=args.max_rows_per_trigger,
        storage_options=storage_options(args.storage_option),
    )
    target = KafkaTarget(
        bootstrap_servers=args.bootstrap_servers,
        schema_registry=registry_url(args),
        topic=args.topic or "",
        producer_config=client_settings(args, "producer_config"),
        registry_config=client_settings(args, "registry_config"),
        key=args.key,
        tombstones=not args.no_tombstones,
        table_name=args.table_name,
        topics=topic_settings(args),
        transaction_topic=args.transaction_topic,
        transaction_metadata=not args.no_transaction_metadata,
        table_definitions=not args.no_table_definitions,
        exactly_once=not args.at_least_once,
        flush_timeout=args.flush_timeout,
    )
    run = RunSettings(
        checkpoint=args.checkpoint,
        trigger_interval=args.trigger_interval,
        available_now=args.available_now,
        master=args.master,
        writers=args.writers,
        head_start=not args.no_head_start,
        stop_timeout_s=args.stop_timeout,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        warm_workers=not args.no_warm_workers,
    )
    return PublishSettings(source, target, run)
