"""`lance-cdf changes`: a version range's events printed, or written as JSON lines / Parquet."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from lance_cdf.cli.flags import EXAMPLES, Subcommands, csv_list, storage_options
from lance_cdf.errors import LanceCdfError

if TYPE_CHECKING:
    pass

# what `add_subparsers` returns: each command's parser is made with its `add_parser`


def changes_parser(sub: Subcommands) -> None:
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
        "uri",
        help="table path or URI (file://, s3://, gs://, az://); with --database: the "
        "table's name (e.g. sales.orders)",
    )
    changes.add_argument(
        "--database",
        default=None,
        metavar="DIR",
        help="a LanceDB database / Lance directory namespace (path or URI) holding the table",
    )
    changes.add_argument(
        "--from",
        dest="start",
        type=int,
        default=None,
        help="first version (required, except with --snapshot: the version to snapshot, "
        "default latest)",
    )
    changes.add_argument(
        "--to", dest="end", type=int, default=None, help="last version (default: latest)"
    )
    changes.add_argument(
        "--columns", type=csv_list, default=None, help="comma-separated columns to include"
    )
    changes.add_argument(
        "--format",
        choices=["table", "jsonl", "parquet"],
        default="table",
        help="table (readable, default), jsonl (one event per line) or parquet (needs --output)",
    )
    changes.add_argument("--output", default=None, help="write to this file instead of stdout")
    changes.add_argument(
        "--snapshot",
        action="store_true",
        help="first the table as it stands at version FROM as snapshot events, then the "
        "changes of FROM+1..TO",
    )
    changes.add_argument(
        "--net",
        action="store_true",
        help="net changes over the range: at most one event (an update: one pair) per row",
    )
    changes.add_argument(
        "--drop-unchanged-updates",
        action="store_true",
        help="leave out updates whose before and after images are equal on every column shown",
    )
    changes.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storage option passed to Lance (repeatable)",
    )
    changes.set_defaults(func=cmd_changes)


def cmd_changes(args: argparse.Namespace) -> int:
    """`lance-cdf changes URI --from V [--to W]`: print or write (table, JSON lines, Parquet)
    the change events of versions V+1..W of a table, by URI or by name in `--database`.

    Returns 0. Raises `LanceCdfError` (exit 2) for a missing `--from` or `--output`, and
    whatever `read_changes` raises (unknown table or version, no stable row IDs, ...)."""
    from lance_cdf.core.feed import read_changes

    if args.start is None and not args.snapshot:
        raise LanceCdfError("give --from VERSION (or --snapshot to start from a snapshot)")
    reader = read_changes(
        args.uri,
        args.start,
        args.end,
        columns=args.columns,
        storage_options=storage_options(args.storage_option),
        snapshot=args.snapshot,
        net=args.net,
        drop_unchanged_updates=args.drop_unchanged_updates,
        database=args.database,
    )
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
            from lance_cdf.cli.render import render_changes

            render_changes(reader, out)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0
