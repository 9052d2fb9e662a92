"""The `lance-cdf` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

from lance_cdf import __version__
from lance_cdf.errors import LanceCdfError

EXAMPLES = """examples:
  lance-cdf changes /data/events.lance --from 3 --to 9
  lance-cdf changes /data/events.lance --from 1 --format jsonl --columns id,name
  lance-cdf changes file:///data/events.lance --from 5 --format parquet --output changes.parquet
"""


def _csv(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lance-cdf",
        description="Row-level change data feed for Lance tables (insert / update / delete "
        "events read straight from the table's manifests).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lance-cdf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    changes = sub.add_parser(
        "changes",
        help="print the changes of a version range",
        description="Print the row-level changes of versions FROM..TO (both inclusive) of a "
        "Lance table created with stable row IDs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    changes.add_argument("uri", help="table path or URI (file://, s3://, gs://, az://)")
    changes.add_argument("--from", dest="start", type=int, required=True, help="first version")
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
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="storage option passed to Lance (repeatable)",
    )  # fmt: skip
    changes.set_defaults(func=cmd_changes)

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
    pub.add_argument("--table", required=True, help="table path or URI (file://, s3://, gs://, az://)")
    pub.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    pub.add_argument("--topic", required=True)
    pub.add_argument("--schema-registry", required=True, metavar="URL",
                     help="Confluent-compatible registry URL")  # fmt: skip
    pub.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="Spark checkpoint directory"
    )
    pub.add_argument("--starting-version", default="latest",
                     help="first version: a number, latest (default) or earliest")  # fmt: skip
    pub.add_argument("--trigger-interval", default="1 second", help="micro-batch interval")
    pub.add_argument("--available-now", action="store_true",
                     help="publish everything up to the latest version, then exit")  # fmt: skip
    pub.add_argument("--key", default=None, help="key columns (default _rowid), e.g. id,tenant")
    pub.add_argument("--no-tombstones", action="store_true", help="no null record after a delete")
    pub.add_argument("--max-rows-per-trigger", type=int, default=None)
    pub.add_argument("--producer-config", action="append", default=[], metavar="KEY=VALUE",
                     help="producer setting, e.g. security.protocol=SASL_SSL")  # fmt: skip
    pub.add_argument("--registry-config", action="append", default=[], metavar="KEY=VALUE",
                     help="schema registry client setting (repeatable)")  # fmt: skip
    pub.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    pub.add_argument("--master", default=None, metavar="URL",
                     help="Spark master (default: spark-submit's, else local[2])")  # fmt: skip
    pub.set_defaults(func=cmd_publish)
    return parser


def _options(pairs: Iterable[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise LanceCdfError(f"option {pair!r} is not KEY=VALUE")
        out[key] = value
    return out


def cmd_changes(args: argparse.Namespace) -> int:
    from lance_cdf.feed import read_changes

    reader = read_changes(
        args.uri, args.start, args.end, columns=args.columns,
        storage_options=_options(args.storage_option),
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


def cmd_publish(args: argparse.Namespace) -> int:
    from lance_cdf.connectors.publish import publish

    return publish(
        args.table, args.bootstrap_servers, args.topic, args.schema_registry, args.checkpoint,
        starting_version=args.starting_version, trigger_interval=args.trigger_interval,
        available_now=args.available_now, key=args.key, tombstones=not args.no_tombstones,
        producer_config=_options(args.producer_config),
        registry_config=_options(args.registry_config),
        storage_options=_options(args.storage_option),
        max_rows_per_trigger=args.max_rows_per_trigger, master=args.master,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except LanceCdfError as exc:
        print(f"lance-cdf: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
