"""The `lance-cdf` command line: `changes`, `publish`, `replicate`, `status`, `demo`, `devtools`.

Each subcommand is one `cmd_*` function taking the parsed arguments and returning the exit
status: 0 on success or a clean stop (SIGTERM / SIGINT), 2 for a `LanceCdfError` (printed as
one line, `lance-cdf: error: ...`, with secrets scrubbed) or a missing optional extra. The flags
are listed, from this parser, in the documentation's CLI reference (docs/reference/cli.md).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias

from lance_cdf import __version__, malloc
from lance_cdf.errors import LanceCdfError

if TYPE_CHECKING:
    from lance_cdf.kafka.publish import Database
    from lance_cdf.kafka.topics import TopicSettings
    from lance_cdf.replicate.database_replicator import DatabaseReplicator

# what `add_subparsers` returns: each command's parser is made with its `add_parser`
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

EXAMPLES = """examples:
  lance-cdf changes /data/events.lance --from 3 --to 9
  lance-cdf status --table /data/events.lance --checkpoint /data/ck/events
  lance-cdf changes /data/events.lance --from 1 --format jsonl --columns id,name
  lance-cdf changes file:///data/events.lance --from 5 --format parquet --output changes.parquet
  lance-cdf changes /data/events.lance --from 3 --to 9 --net --drop-unchanged-updates
  lance-cdf changes /data/events.lance --snapshot --from 7 --format jsonl
  lance-cdf changes --database /data/lancedb sales.orders --from 2
"""


def _csv(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


def _kafka_endpoint(parser: argparse.ArgumentParser, topic_required: bool = True) -> None:
    """The broker, topic and schema registry publish writes to and replicate reads from."""
    parser.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    parser.add_argument("--topic", required=topic_required)
    parser.add_argument("--schema-registry", required=True, metavar="URL",
                        help="Confluent-compatible registry URL")  # fmt: skip


def _client_settings(parser: argparse.ArgumentParser, client: str, table: str) -> None:
    """The repeatable KEY=VALUE settings passed through to Kafka, the registry and storage,
    and the Java-properties files Kafka and registry settings can come from instead (a
    flag wins over its file; any value may be ${env:NAME})."""
    for flag, help_text in (
        (f"--{client}-config", f"{client} setting, e.g. security.protocol=SASL_SSL"),
        (
            "--registry-config",
            "schema registry client setting, e.g. basic.auth.user.info=${env:REGISTRY_AUTH}",
        ),
        ("--storage-option", f"storage option for {table}, e.g. aws_region=eu-west-1"),
    ):
        parser.add_argument(
            flag,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=help_text + " (repeatable; ${env:NAME} reads a variable)",
        )
    for name in (client, "registry"):
        parser.add_argument(f"--{name}-config-file", default=None, metavar="FILE",
                            help=f"{name} settings in Java-properties form (Kafka's "
                            f"client.properties); --{name}-config flags win")  # fmt: skip


def _settings(args: argparse.Namespace, name: str) -> dict[str, str]:
    """The settings of one client (`producer`, `consumer`, `registry`): its file, then its
    flags, ${env:NAME} expanded; the secret values remembered for redaction."""
    from lance_cdf.clientconfig import settings

    flag = f"--{name.replace('_', '-')}"
    return settings(getattr(args, name), getattr(args, f"{name}_file", None),
                    flag=flag, file_flag=f"{flag}-file")  # fmt: skip


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return number


def _topic_flags(parser: argparse.ArgumentParser) -> None:
    """How publish creates the topics it writes that do not exist yet (an existing topic
    is used as it is)."""
    group = parser.add_argument_group("new topics (created with CreateTopics; one that "
                                      "exists is used as it is)")  # fmt: skip
    group.add_argument("--partitions", type=_positive, default=None, metavar="N",
                       help="partitions of a new change topic (default: the broker's "
                       "num.partitions; with --database, one per writer)")  # fmt: skip
    group.add_argument("--replication-factor", type=_positive, default=None, metavar="N",
                       help="replication factor of new topics (default: the broker's "
                       "default.replication.factor)")  # fmt: skip
    group.add_argument("--topic-config", action="append", default=[], metavar="KEY=VALUE",
                       help="topic setting of new topics, e.g. min.insync.replicas=2 (repeatable; "
                       "the transaction topic takes all but cleanup.policy)")  # fmt: skip


def _topic_settings(args: argparse.Namespace) -> TopicSettings:
    from lance_cdf.clientconfig import parse_pairs
    from lance_cdf.kafka.topics import TopicSettings

    config = parse_pairs(args.topic_config, "--topic-config")
    return TopicSettings.of(args.partitions, args.replication_factor, config)


def _metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (lag, "
                        "events/s, batches, failures; 0 = any free port)")  # fmt: skip
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="address the metrics endpoint listens on (default 127.0.0.1; "
                        "0.0.0.0 for a scraper on another host)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The `argparse` parser of every subcommand and flag (also what the documentation's CLI
    reference is generated from)."""
    parser = argparse.ArgumentParser(
        prog="lance-cdf",
        description="Row-level change data feed for Lance tables (insert / update / delete "
        "events read straight from the table's manifests).",
        epilog=EXAMPLES
        + "\ndocumentation: the site in docs/ of the lance-cdf repository (`make docs` builds it"
        "\n  into site/index.html): getting started, how-to guides, and the reference of every"
        "\n  command and flag. `lance-cdf COMMAND --help` lists a command's flags.\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lance-cdf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _changes_parser(sub)
    _publish_parser(sub)
    _replicate_parser(sub)
    _status_parser(sub)
    return parser


def _changes_parser(sub: Subcommands) -> None:
    """`lance-cdf changes`."""
    changes = sub.add_parser(
        "changes",
        help="print the changes of a version range",
        description="Print the row-level changes of versions FROM..TO (both inclusive) of a "
        "Lance table created with stable row IDs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    changes.add_argument(
        "uri", help="table path or URI (file://, s3://, gs://, az://); with --database: the "
        "table's name (e.g. sales.orders)",
    )  # fmt: skip
    changes.add_argument(
        "--database", default=None, metavar="DIR",
        help="a LanceDB database / Lance directory namespace (path or URI) holding the table",
    )  # fmt: skip
    changes.add_argument(
        "--from", dest="start", type=int, default=None,
        help="first version (required, except with --snapshot: the version to snapshot, "
        "default latest)",
    )  # fmt: skip
    changes.add_argument(
        "--to", dest="end", type=int, default=None, help="last version (default: latest)"
    )
    changes.add_argument(
        "--columns", type=_csv, default=None, help="comma-separated columns to include"
    )
    changes.add_argument(
        "--format", choices=["table", "jsonl", "parquet"], default="table",
        help="table (readable, default), jsonl (one event per line) or parquet (needs --output)",
    )  # fmt: skip
    changes.add_argument("--output", default=None, help="write to this file instead of stdout")
    changes.add_argument(
        "--snapshot", action="store_true",
        help="first the table as it stands at version FROM as snapshot events, then the "
        "changes of FROM+1..TO",
    )  # fmt: skip
    changes.add_argument(
        "--net", action="store_true",
        help="net changes over the range: at most one event (an update: one pair) per row",
    )  # fmt: skip
    changes.add_argument(
        "--drop-unchanged-updates", action="store_true",
        help="leave out updates whose before and after images are equal on every column shown",
    )  # fmt: skip
    changes.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="storage option passed to Lance (repeatable)",
    )  # fmt: skip
    changes.set_defaults(func=cmd_changes)


def _publish_parser(sub: Subcommands) -> None:
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
    pub.add_argument(
        "--table", default=None, help="table path or URI (file://, s3://, gs://, az://)"
    )
    _kafka_endpoint(pub)
    _database_flags(pub)
    pub.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="Spark checkpoint directory"
    )
    pub.add_argument("--starting-version", default=None,
                     help="first version of a new checkpoint: a number, latest (default) or "
                     "earliest; with an existing checkpoint only its own start")  # fmt: skip
    pub.add_argument("--snapshot", action="store_true",
                     help="bootstrap: publish the table as it stands when the query first "
                     "starts (op=r), then its changes (replaces --starting-version)")  # fmt: skip
    pub.add_argument("--drop-unchanged-updates", action="store_true",
                     help="do not publish updates that changed no column value")  # fmt: skip
    pub.add_argument("--trigger-interval", type=_interval, default=None,
                     help="micro-batch interval: 500ms, 2s, 1.5 or Spark's '1 second' "
                     "(default 500ms; 1s with --database: each table is listed per "
                     "trigger)")  # fmt: skip
    pub.add_argument("--available-now", action="store_true",
                     help="publish everything up to the latest version, then exit")  # fmt: skip
    pub.add_argument("--key", default=None, help="key columns (default _rowid), e.g. id,tenant")
    pub.add_argument("--table-name", default=None, metavar="PREFIX.TABLE",
                     help="names the Avro records PREFIX.TABLE.Envelope/.Value/.Key and fills "
                     "source.name/source.table (default lancecdf.<table directory)")  # fmt: skip
    pub.add_argument("--no-tombstones", action="store_true", help="no null record after a delete")
    pub.add_argument("--max-rows-per-trigger", type=int, default=None)
    pub.add_argument("--writers", type=int, default=None, metavar="N",
                     help="parallel writer tasks per micro-batch (default: Spark's default "
                     "parallelism; at most the topic's partition count)")  # fmt: skip
    pub.add_argument("--at-least-once", action="store_true",
                     help="do not skip, on a replay, records the topic already holds")  # fmt: skip
    pub.add_argument(
        "--transaction-topic",
        default=None,
        metavar="TOPIC",
        help="BEGIN/END records per commit version (default <topic>.transaction)",
    )
    pub.add_argument("--no-transaction-metadata", action="store_true",
                     help="write no BEGIN/END records (a replica then records no source "
                     "version it cannot prove complete)")  # fmt: skip
    pub.add_argument("--no-head-start", action="store_true",
                     help="do not publish the commits waiting at start from this process "
                     "while Spark starts; the query publishes everything")  # fmt: skip
    _topic_flags(pub)
    _client_settings(pub, "producer", "the source table")
    pub.add_argument("--master", default=None, metavar="URL",
                     help="Spark master (default: spark-submit's, else local[2])")  # fmt: skip
    _metrics_flags(pub)
    pub.set_defaults(func=cmd_publish)


def _replicate_parser(sub: Subcommands) -> None:
    """`lance-cdf replicate`: where from, where to; how records are applied: `_applying_flags`."""
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
        "more small fragments, which --compact-every folds together.",
        epilog="example:\n  lance-cdf replicate --bootstrap-servers 127.0.0.1:9092 --topic "
        "events.cdf \\\n      --schema-registry http://127.0.0.1:8081 --target "
        "/data/replica.lance --key id",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _kafka_endpoint(rep, topic_required=False)
    rep.add_argument("--target", default=None,
                     help="replica table path or URI (with --topic)")  # fmt: skip
    # a whole database: every topic of a prefix into its table (replicate/database_replicator.py)
    rep.add_argument("--database-target", default=None, metavar="URI",
                     help="instead of --topic/--target: replicate every topic PREFIX.<table> "
                     "(see --topic-prefix) into the table of that qualified name (sales.orders: "
                     "table orders of namespace sales) of this LanceDB database / Lance "
                     "directory namespace, with one consumer; new topics are picked up, "
                     "deleted ones let go")  # fmt: skip
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
    rep.add_argument("--exclude", default=None, metavar="REGEX",
                     help="with --database-target: not the tables whose qualified name "
                     "matches")  # fmt: skip
    rep.add_argument("--refresh-interval", type=_seconds, default=5.0, metavar="SECONDS",
                     help="with --database-target: how often the topic list is read for new "
                     "and deleted topics (default 5)")  # fmt: skip
    _applying_flags(rep)
    rep.set_defaults(func=cmd_replicate)


def _applying_flags(rep: argparse.ArgumentParser) -> None:
    """How `replicate` applies records, and what it reports."""
    rep.add_argument("--key", type=_csv, default=None,
                     help="replica key columns, e.g. id,tenant (default: _source_rowid, the "
                     "source's stable row ID kept as a column)")  # fmt: skip
    rep.add_argument("--group-id", default=None,
                     help="consumer group (default lance-cdf-replicate-TOPIC; with "
                     "--database-target lance-cdf-replicate-db-PREFIX)")  # fmt: skip
    rep.add_argument("--max-batch-rows", type=int, default=100_000,
                     help="records per batch (one Lance commit); bigger batches: fewer "
                     "commits and files, more throughput, more latency")  # fmt: skip
    rep.add_argument("--max-batch-interval", type=_seconds, default=1.0, metavar="SECONDS",
                     help="longest a batch keeps taking records that keep coming, e.g. 1 "
                     "or 500ms (a quiet topic's records are applied at once)")  # fmt: skip
    rep.add_argument("--compact-every", type=int, default=100, metavar="N",
                     help="compact the small fragments batches leave, and bring the "
                     "key index up to date, every N batches (default 100, 0: off)")  # fmt: skip
    rep.add_argument("--index-rows", type=int, default=None, metavar="ROWS",
                     help="add new fragments to the key index once they hold more "
                     "than ROWS rows (default 100000); lookups scan them till then")  # fmt: skip
    rep.add_argument("--keep-row-ids", action="store_true",
                     help="an updated row keeps its replica _rowid (the replica's own "
                     "change feed then shows updates, not delete+insert); each commit "
                     "then costs O(replica rows): ~3 s at 10M rows")  # fmt: skip
    rep.add_argument("--no-index-preload", action="store_true",
                     help="do not load the key index into memory up front (~17 bytes per "
                     "replica row); lookups then read index pages from storage as they "
                     "meet them (~5x slower per key into 10M rows until cached)")  # fmt: skip
    rep.add_argument("--no-key-map", action="store_true",
                     help="do not keep the in-memory key -> row address map of an integer "
                     "key (~16 bytes per replica row, built by one scan of the key column "
                     "at start and after each compaction: 0.7-1.5 s per 10M rows); lookups "
                     "then go through the key index (a 100,000-row batch into 10M rows "
                     "then costs O(replica))")  # fmt: skip
    rep.add_argument("--transaction-topic", default=None, metavar="TOPIC",
                     help="publish's BEGIN/END records (default <topic>.transaction): each "
                     "replica commit then equals the source at one version")  # fmt: skip
    rep.add_argument(
        "--no-transaction-topic",
        action="store_true",
        help="apply records as they come; no source version is recorded",
    )
    rep.add_argument("--max-pending-records", type=int, default=200_000, metavar="N",
                     help="records of unfinished versions held in memory; beyond, they are "
                     "applied as a piece; status says the replica is inside a version")  # fmt: skip
    rep.add_argument("--dead-letter-topic", default=None, metavar="TOPIC",
                     help="set undecodable records aside here (error in a header) and go on; "
                     "without it the replicator stops at such a record")  # fmt: skip
    rep.add_argument("--idle-timeout", type=_seconds, default=None, metavar="SECONDS",
                     help="exit 0 once no record has arrived for this long (counted from "
                     "start while the topic does not exist)")  # fmt: skip
    rep.add_argument("--rebuild", action="store_true",
                     help="a missing or empty replica is built from the beginning of the "
                     "topic although the consumer group has committed offsets (without it "
                     "that start is refused); the topic must still hold its history")  # fmt: skip
    rep.add_argument("--lease-ttl", type=_seconds, default=30.0, metavar="SECONDS",
                     help="one replicator per replica: its lease expires this long after its "
                     "last renewal (every third of it) if it dies elsewhere, and is then "
                     "taken over (default 30)")  # fmt: skip
    _client_settings(rep, "consumer", "the replica table")
    _metrics_flags(rep)
    rep.add_argument("--source-table", default=None, metavar="URI",
                     help="the published table (read-only): its latest version and commit "
                     "times give the lag metrics in versions and seconds")  # fmt: skip
    rep.add_argument("--source-database", default=None, metavar="URI",
                     help="with --database-target: the published database (read-only): its "
                     "tables' latest versions and commit times give each replica table's "
                     "lag metrics")  # fmt: skip
    rep.add_argument("--source-storage-option", action="append", default=[],
                     metavar="KEY=VALUE", help="storage option for --source-table / "
                     "--source-database (repeatable)")  # fmt: skip


def _status_parser(sub: Subcommands) -> None:
    """`lance-cdf status`."""
    status = sub.add_parser(
        "status",
        help="latest version of a table and how far a publisher / replica got",
        description="Print the table's latest version and, when given, the version a "
        "`lance-cdf publish` checkpoint delivered through and the source version a replica "
        "holds, with the lag of each in versions.",
        epilog="example:\n  lance-cdf status --table /data/events.lance --checkpoint "
        "/data/ck/events --replica /data/replica.lance",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument("--table", default=None,
                        help="source table path or URI (required unless --database or "
                        "--database-target)")  # fmt: skip
    status.add_argument("--database", default=None, metavar="URI",
                        help="a database publisher's database (publish --database): every "
                        "table it follows, with its lag, and the tables it skips")  # fmt: skip
    status.add_argument("--database-target", default=None, metavar="URI",
                        help="instead: every replica table of a `replicate --database-target` "
                        "database, one line each (the source version it holds)")  # fmt: skip
    status.add_argument("--checkpoint", default=None, metavar="DIR",
                        help="checkpoint directory of a lance-cdf stream (publish)")  # fmt: skip
    status.add_argument("--replica", default=None, help="replica table of lance-cdf replicate")
    status.add_argument("--json", action="store_true", help="one JSON object instead of text")
    status.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="storage option for --table, and for --replica unless "
                        "--replica-storage-option is given (repeatable)")  # fmt: skip
    status.add_argument("--replica-storage-option", action="append", default=[],
                        metavar="KEY=VALUE", help="storage option for --replica "
                        "(repeatable; default: the --storage-option ones)")  # fmt: skip
    status.set_defaults(func=cmd_status)


def _seconds(value: str) -> float:
    text = value.strip().lower()
    try:
        if text.endswith("ms"):
            return float(text[:-2]) / 1000
        return float(text[:-1] if text.endswith("s") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration (e.g. 1, 2.5s, 500ms)"
        ) from None


def _interval(value: str) -> str:
    """A micro-batch interval for Spark's processingTime trigger: Spark's own form
    ('1 second', '500 milliseconds') as it is, the replicate-style 500ms / 2s / 1.5 as
    milliseconds (Spark rejects '500ms')."""
    if any(c.isspace() for c in value.strip()):
        return value.strip()
    return f"{round(_seconds(value) * 1000)} milliseconds"


def _registry_url(args: argparse.Namespace) -> str:
    """--schema-registry with ${env:NAME} expanded (user-info need not sit in argv); the
    URL's user-info is remembered for redaction."""
    from lance_cdf.clientconfig import expand_env, remember_url

    url = expand_env(args.schema_registry, what="--schema-registry")
    remember_url(url)
    return url


def _options(pairs: Iterable[str], flag: str = "--storage-option") -> dict[str, str]:
    """Repeatable KEY=VALUE flags, ${env:NAME} expanded, secret values remembered."""
    from lance_cdf.clientconfig import settings

    return settings(pairs, flag=flag)


def cmd_changes(args: argparse.Namespace) -> int:
    """`lance-cdf changes URI --from V [--to W]`: print or write (table, JSON lines, Parquet)
    the change events of versions V+1..W of a table, by URI or by name in `--database`.

    Returns 0. Raises `LanceCdfError` (exit 2) for a missing `--from` or `--output`, and
    whatever `read_changes` raises (unknown table or version, no stable row IDs, ...)."""
    from lance_cdf.feed import read_changes

    if args.start is None and not args.snapshot:
        raise LanceCdfError("give --from VERSION (or --snapshot to start from a snapshot)")
    reader = read_changes(
        args.uri, args.start, args.end, columns=args.columns,
        storage_options=_options(args.storage_option), snapshot=args.snapshot, net=args.net,
        drop_unchanged_updates=args.drop_unchanged_updates, database=args.database,
    )  # fmt: skip
    if args.format == "parquet":
        if not args.output:
            raise LanceCdfError("--format parquet writes a file: add --output PATH")
        import pyarrow.parquet as pq

        with pq.ParquetWriter(args.output, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
        return 0
    out = open(args.output, "w") if args.output else sys.stdout
    try:
        if args.format == "jsonl":
            for batch in reader:
                for row in batch.to_pylist():
                    out.write(json.dumps(row, default=str) + "\n")
        else:
            from lance_cdf.render import render_changes

            render_changes(reader, out)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _database_flags(pub: argparse.ArgumentParser) -> None:
    """publish --database: every matching table of a database, one topic each."""
    for action in pub._actions:  # --topic: or --topic-prefix with --database
        if action.dest == "topic":
            action.required = False
    group = pub.add_argument_group("a whole database (instead of --table and --topic)")
    group.add_argument("--database", default=None, metavar="URI",
                       help="a LanceDB database / Lance directory namespace: publish every "
                       "table (new ones within 10 s), each to PREFIX.<qualified name>")  # fmt: skip
    group.add_argument("--topic-prefix", default=None, metavar="PREFIX",
                       help="with --database: table sales.orders goes to topic "
                       "PREFIX.sales.orders (records PREFIX.sales.orders.Envelope)")  # fmt: skip
    group.add_argument(
        "--include",
        default=None,
        metavar="REGEX",
        help="with --database: only tables whose whole qualified name matches",
    )
    group.add_argument("--exclude", default=None, metavar="REGEX",
                       help="with --database: leave out tables whose whole qualified name "
                       "matches")  # fmt: skip


def _publish_target(args: argparse.Namespace) -> Database | None:
    """The table and topic, or the database (publish.Database); one line if mixed."""
    from lance_cdf.kafka.publish import Database

    if args.database is None:
        if args.table is None or args.topic is None or args.topic_prefix or args.include \
                or args.exclude:  # fmt: skip
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
    return Database(args.database, args.topic_prefix, args.include, args.exclude)


def cmd_publish(args: argparse.Namespace) -> int:
    """`lance-cdf publish`: stream a table's changes to a Kafka topic until stopped (or, with
    `--available-now`, until caught up), exactly once, through `kafka.publish.publish`.

    Returns 0 after a clean stop or catch-up; a failed query ends with one line naming the
    cause (Spark's text in `<checkpoint>/lance-cdf-publish.log`) and a non-zero status.
    Raises `LanceCdfError` (exit 2) for refused settings, an unreachable or refusing broker /
    registry, a foreign checkpoint, or a checkpoint leased by another publisher."""
    import threading

    database = _publish_target(args)
    # SIGTERM / SIGINT stop publishing: the query is stopped, the checkpoint kept
    stop = threading.Event()
    with _on_signals(lambda *_: stop.set()):
        return _run_publish(args, database, stop)


def _run_publish(args: argparse.Namespace, database: Database | None, stop: threading.Event) -> int:
    from lance_cdf.kafka.publish import publish

    return publish(
        args.table or "", args.bootstrap_servers, args.topic or "", _registry_url(args),
        args.checkpoint,
        starting_version=args.starting_version, trigger_interval=args.trigger_interval,
        available_now=args.available_now, key=args.key, tombstones=not args.no_tombstones,
        producer_config=_settings(args, "producer_config"),
        registry_config=_settings(args, "registry_config"),
        storage_options=_options(args.storage_option),
        max_rows_per_trigger=args.max_rows_per_trigger, snapshot=args.snapshot,
        drop_unchanged_updates=args.drop_unchanged_updates, master=args.master,
        table_name=args.table_name,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        writers=args.writers, exactly_once=not args.at_least_once,
        head_start=not args.no_head_start, transaction_topic=args.transaction_topic,
        transaction_metadata=not args.no_transaction_metadata, database=database,
        topics=_topic_settings(args), stop=stop,
    )  # fmt: skip


@contextlib.contextmanager
def _on_signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """`handler` for SIGTERM and SIGINT during the block, the previous ones after (only
    the main thread has signal handlers: a command run from another thread installs none)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


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

    from lance_cdf.clientconfig import redact_url, scrub_logging
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
    replicator = Replicator(
        args.bootstrap_servers, args.topic, _registry_url(args), args.target, key=args.key,
        group_id=args.group_id, transaction_topic=args.transaction_topic, **_applying(args),
    )  # fmt: skip
    print(f"replicating {args.topic} on {redact_url(args.bootstrap_servers)} -> "
          f"{redact_url(args.target)}", flush=True)  # fmt: skip
    if args.metrics_port is not None:
        from lance_cdf.metrics import PipelineMetrics, Progress

        c = replicator.counters
        progress = lambda: Progress(  # noqa: E731 (read on every scrape)
            version=c.source_version or None, events=c.records, batches=c.batches,
            dead_letters=c.dead_letters, delivery_failures=c.delivery_failures,
            last_error=c.last_error, kafka_lag=c.lag,
        )  # fmt: skip
        metrics = PipelineMetrics(
            "replicate", progress, args.source_table,
            _options(args.source_storage_option, "--source-storage-option"), args.topic,
        )  # fmt: skip
        print(f"metrics at {metrics.serve(args.metrics_port, args.metrics_host)}", flush=True)
    with _on_signals(lambda *_: replicator.stop()):  # the batch in hand is finished
        counters = replicator.run(idle_timeout=args.idle_timeout)
    print(
        f"stopped: {counters.batches} batches, {counters.records} records, "
        f"{counters.upserts} upserts, {counters.deletes} deletes, "
        f"{counters.dead_letters} dead letters, source version {counters.source_version}",
        flush=True,
    )
    return 0


def _replicate_database(args: argparse.Namespace) -> int:
    """`lance-cdf replicate --database-target URI --topic-prefix P`
    (replicate/database_replicator.py)."""
    from lance_cdf.clientconfig import redact_url
    from lance_cdf.replicate.database_replicator import DatabaseReplicator

    if args.database_target is None or args.topic_prefix is None:
        raise LanceCdfError("--database-target and --topic-prefix go together")
    used = [flag for flag, value in (
        ("--topic", args.topic), ("--target", args.target), ("--key", args.key),
        ("--transaction-topic", args.transaction_topic), ("--source-table", args.source_table),
    ) if value is not None]  # fmt: skip
    if used:
        raise LanceCdfError(
            f"{', '.join(used)} cannot be used with --database-target (each table's topic, "
            "transaction topic and replica follow from its name; replicas are keyed by "
            "_source_rowid)"
        )
    replicator = DatabaseReplicator(
        args.bootstrap_servers, args.topic_prefix, _registry_url(args), args.database_target,
        include=args.include, exclude=args.exclude, group_id=args.group_id,
        refresh_s=args.refresh_interval, **_applying(args),
    )  # fmt: skip
    print(f"replicating {args.topic_prefix}.* on {redact_url(args.bootstrap_servers)} -> "
          f"{redact_url(args.database_target)}", flush=True)  # fmt: skip
    if args.metrics_port is not None:
        _serve_database_metrics(replicator, args)
    with _on_signals(lambda *_: replicator.stop()):  # each table's batch in hand finished
        counters = replicator.run(idle_timeout=args.idle_timeout)
    for name, c in sorted(counters.items()):
        print(f"stopped {name}: {c.batches} batches, {c.records} records, {c.upserts} upserts, "
              f"{c.deletes} deletes, source version {c.source_version}", flush=True)  # fmt: skip
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
    from lance_cdf.metrics import PipelineMetrics, Progress
    from lance_cdf.replicate.database_replicator import SourceTables

    options = _options(args.source_storage_option, "--source-storage-option")
    sources = SourceTables(args.source_database, options) if args.source_database else None

    def progress() -> Progress:
        c = replicator.totals()
        return Progress(events=c.records, batches=c.batches, dead_letters=c.dead_letters,
                        delivery_failures=c.delivery_failures, last_error=c.last_error)  # fmt: skip

    def tables() -> dict[str, tuple[str | None, int | None]]:
        held = replicator.table_positions()
        uris = sources.uris(sorted(held)) if sources is not None else {}
        return {name: (uris.get(name), version) for name, (version, _) in held.items()}

    metrics = PipelineMetrics(
        "replicate", progress, None, options, f"{args.topic_prefix}.*", tables=tables,
        kafka_lags=lambda: {name: lag for name, (_, lag) in replicator.table_positions().items()},
    )  # fmt: skip
    print(f"metrics at {metrics.serve(args.metrics_port, args.metrics_host)}", flush=True)


def _applying(args: argparse.Namespace) -> dict[str, Any]:
    """How records are applied: the settings a single-table and a database replicator share."""
    return dict(
        pause_gc=True,  # this process is the replicator's own
        max_batch_rows=args.max_batch_rows, max_batch_interval=args.max_batch_interval,
        dead_letter_topic=args.dead_letter_topic,
        consumer_config=_settings(args, "consumer_config"),
        registry_config=_settings(args, "registry_config"),
        storage_options=_options(args.storage_option), compact_every=args.compact_every,
        index_rows_max=args.index_rows, keep_row_ids=args.keep_row_ids,
        preload_index=not args.no_index_preload, key_map=not args.no_key_map,
        rebuild=args.rebuild, lease_ttl_s=args.lease_ttl,
        transaction_metadata=not args.no_transaction_topic,
        max_pending_records=args.max_pending_records,
    )  # fmt: skip


def cmd_status(args: argparse.Namespace) -> int:
    """`lance-cdf status --table T [--checkpoint C] [--replica R]`: where a pipeline stands —
    the table's latest version, the publisher's committed version and lag, the replica's
    source version — as text or `--json`; `--database D --checkpoint C`: the same for every
    table a database publisher follows (and those it skips); `--database-target URI`: the
    source version each replica table of a database replicator holds.

    Returns 0. Raises `LanceCdfError` (exit 2) for a table or replica that cannot be read."""
    import datetime as dt

    from lance_cdf.clientconfig import redact_url
    from lance_cdf.feed import ChangeFeed

    if args.database_target is not None:
        return _status_database(args)
    if (args.table is None) == (args.database is None):
        raise LanceCdfError(
            "status needs --table (one table), --database (and --checkpoint) or --database-target"
        )
    if args.database is not None:
        return _database_status(args)

    options = _options(args.storage_option)
    feed = ChangeFeed(args.table, options)
    latest = feed.latest_version()
    when = dt.datetime.fromtimestamp(feed.table.manifest(latest).timestamp_us / 1e6, dt.UTC)
    report: dict[str, object] = {"table": redact_url(args.table), "latest_version": latest,
                    "committed_at": when.isoformat(timespec="seconds")}  # fmt: skip
    shown = redact_url(args.table)
    lines = [f"table       {shown}: latest version {latest} (committed {when:%F %T} UTC)"]
    if args.checkpoint:
        from lance_cdf.streaming.checkpoint import checkpoint_version

        done = checkpoint_version(args.checkpoint)
        report["checkpoint_version"] = done
        report["checkpoint_lag"] = None if done is None else latest - done
        lines.append(
            f"checkpoint  {redact_url(args.checkpoint)}: "
            + ("no micro-batch completed yet" if done is None
               else f"delivered through version {done} (lag {latest - done} versions)")
        )  # fmt: skip
        from lance_cdf.kafka.outage import describe_state

        kafka = describe_state(args.checkpoint)
        if kafka is not None:
            report["kafka"], line = kafka
            lines.append(f"kafka       {line}")
    if args.replica:
        from lance_cdf.replicate.replica import (
            INSIDE_VERSION_PROPERTY,
            ReplicaTable,
            describe_position,
            source_version_of,
        )

        replica_options = (
            _options(args.replica_storage_option, "--replica-storage-option")
            if args.replica_storage_option else options
        )  # fmt: skip
        position = ReplicaTable(args.replica, [], replica_options).position()
        held = source_version_of(position)
        inside = position.get(INSIDE_VERSION_PROPERTY)
        report["replica_version"] = held
        report["replica_inside_version"] = None if inside is None else int(inside)
        report["replica_lag"] = None if held is None else latest - held
        lag = "" if held is None else (
            f" ({latest - held} versions behind; commits that change no rows publish nothing)"
        )  # fmt: skip
        lines.append(f"replica     {redact_url(args.replica)}: {describe_position(position)}{lag}")
    print(json.dumps(report) if args.json else "\n".join(lines))
    return 0


def _database_status(args: argparse.Namespace) -> int:
    """`lance-cdf status --database D --checkpoint C`: each table a database publisher
    follows, its latest version and how far the checkpoint delivered it; the skipped ones."""
    from lance_cdf.clientconfig import redact_url
    from lance_cdf.feed import ChangeFeed
    from lance_cdf.namespace import list_tables
    from lance_cdf.streaming.checkpoint import committed_tables
    from lance_cdf.streaming.database_stream import read_report

    if not args.checkpoint or args.replica:
        raise LanceCdfError("status --database takes --checkpoint (the publisher's), no --replica")
    options = _options(args.storage_option)
    delivered = committed_tables(args.checkpoint) or {}
    root = args.checkpoint.removeprefix("file://")
    report = read_report(os.path.join(root, "database-tables.json")) or {}
    followed: dict[str, str] = dict(report.get("followed") or {})
    skipped: dict[str, str] = dict(report.get("skipped") or {})
    uris = {ref.qualified_name: ref.uri for ref in list_tables(args.database, options)}
    tables: dict[str, dict[str, object]] = {}
    lines = [f"database    {redact_url(args.database)} (checkpoint {redact_url(args.checkpoint)})"]
    for name in sorted(set(followed) | set(delivered)):
        done = delivered.get(name)
        uri = uris.get(name)
        if uri is None:
            tables[name] = {"gone": True, "checkpoint_version": done}
            lines.append(f"table       {name}: gone from the database")
            continue
        latest = ChangeFeed(uri, options).latest_version()
        lag = None if done is None else latest - done
        tables[name] = {"latest_version": latest, "checkpoint_version": done,
                        "checkpoint_lag": lag}  # fmt: skip
        lines.append(
            f"table       {name}: latest version {latest}, "
            + ("no micro-batch delivered it yet" if done is None
               else f"delivered through version {done} (lag {lag} versions)")
        )  # fmt: skip
    for name, why in sorted(skipped.items()):
        lines.append(f"skipped     {name}: {why}")
    document = {"database": redact_url(args.database), "tables": tables, "skipped": skipped}
    print(json.dumps(document) if args.json else "\n".join(lines))
    return 0


def _status_database(args: argparse.Namespace) -> int:
    """`lance-cdf status --database-target URI`: each replica table of the database (by
    qualified name), the topic it follows and the source version it holds."""
    from lance_cdf.clientconfig import redact_url
    from lance_cdf.namespace import list_tables
    from lance_cdf.replicate.replica import (
        INSIDE_VERSION_PROPERTY,
        TOPIC_PROPERTY,
        ReplicaTable,
        describe_position,
        source_version_of,
    )

    options = _options(args.replica_storage_option or args.storage_option)
    refs = list_tables(args.database_target, options)
    replicas: list[dict[str, object]] = []
    width = max([len(r.qualified_name) for r in refs] or [0])
    lines = [f"database    {redact_url(args.database_target)}: {len(refs)} replica tables"]
    for ref in refs:
        position = ReplicaTable(ref.uri, [], options).position()
        inside = position.get(INSIDE_VERSION_PROPERTY)
        replicas.append({
            "table": ref.qualified_name, "uri": redact_url(ref.uri),
            "topic": position.get(TOPIC_PROPERTY), "source_version": source_version_of(position),
            "inside_version": None if inside is None else int(inside),
        })  # fmt: skip
        topic = position.get(TOPIC_PROPERTY)
        lines.append(f"  {ref.qualified_name:<{width}}  {describe_position(position)}"
                     + (f" (topic {topic})" if topic else ""))  # fmt: skip
    report = {"database_target": redact_url(args.database_target), "replicas": replicas}
    print(json.dumps(report) if args.json else "\n".join(lines))
    return 0


# top-level modules of the optional dependencies -> the extra that installs them
EXTRAS = {
    "pyspark": "spark",
    "pandas": "spark",
    "confluent_kafka": "kafka",
    "fastavro": "kafka",
    "prometheus_client": "kafka",
}


def main(argv: list[str] | None = None) -> int:
    """Run the `lance-cdf` command with `argv` (default: `sys.argv[1:]`) and return its exit
    status; `LanceCdfError`s and missing extras become one line on stderr and status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func  # set_defaults(func=cmd_...)
    try:
        return command(args)
    except LanceCdfError as exc:
        from lance_cdf.clientconfig import scrub

        # one redaction rule for errors too: URL user-info and every secret value given
        print(f"lance-cdf: error: {scrub(str(exc))}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"lance-cdf: error: this command needs {exc.name}, which the core install leaves "
            f"out; install it with: pip install 'lance-cdf[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:
        return 0


def entry() -> None:
    """The `lance-cdf` command: `main` in a process of lance-cdf's own, which keeps freed
    decode buffers for reuse (`lance_cdf.malloc`) and passes that opt-in on to the Spark
    Python workers it starts (they inherit the environment), and holds glibc to two
    arenas (`LANCE_CDF_MALLOC_ARENAS`; the command's own process only). A crash in native code
    (librdkafka, pylance, pyarrow) prints every thread's Python stack to stderr, so the
    log says where. (A crash in a thread of librdkafka's own leaves no Python stack: the
    replicator's SIGSEGV at start was one, found from a core dump; kafka/endpoints.py.)"""
    faulthandler.enable()
    malloc.bound_arenas_unless_told()  # before any thread of pylance or librdkafka starts
    os.environ.setdefault(malloc.ENV, "1")
    malloc.keep_freed_memory_if_asked()
    sys.exit(main())


if __name__ == "__main__":
    entry()
