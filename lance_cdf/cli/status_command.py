"""`lance-cdf status`: where a stream's checkpoint and its table stand."""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from lance_cdf.cli.flags import Subcommands, storage_options
from lance_cdf.errors import LanceCdfError, in_words

if TYPE_CHECKING:
    from lance import LanceDataset

# what `add_subparsers` returns: each command's parser is made with its `add_parser`


def status_parser(sub: Subcommands) -> None:
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
    status.add_argument(
        "--table",
        default=None,
        help="source table path or URI (required unless --database or --database-target)",
    )
    status.add_argument(
        "--database",
        default=None,
        metavar="URI",
        help="a database publisher's database (publish --database): every "
        "table it follows, with its lag, and the tables it skips",
    )
    status.add_argument(
        "--database-target",
        default=None,
        metavar="URI",
        help="instead: every replica table of a `replicate --database-target` "
        "database, one line each (the source version it holds)",
    )
    status.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="checkpoint directory of a lance-cdf stream (publish)",
    )
    status.add_argument("--replica", default=None, help="replica table of lance-cdf replicate")
    status.add_argument("--json", action="store_true", help="one JSON object instead of text")
    status.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storage option for --table, and for --replica unless "
        "--replica-storage-option is given (repeatable)",
    )
    status.add_argument(
        "--replica-storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storage option for --replica (repeatable; default: the --storage-option ones)",
    )
    status.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    """`lance-cdf status --table T [--checkpoint C] [--replica R]`: where a pipeline stands —
    the table's latest version, the publisher's committed version and lag, the replica's
    source version — as text or `--json`; `--database D --checkpoint C`: the same for every
    table a database publisher follows (and those it skips); `--database-target URI`: the
    source version each replica table of a database replicator holds.

    Returns 0. Raises `LanceCdfError` (exit 2) for a table or replica that cannot be read."""
    import datetime as dt

    from lance_cdf.core.feed import ChangeFeed
    from lance_cdf.ops.clientconfig import redact_url

    if args.database_target is not None:
        return _status_database(args)
    if (args.table is None) == (args.database is None):
        raise LanceCdfError(
            "status needs --table (one table), --database (and --checkpoint) or --database-target"
        )
    if args.database is not None:
        return _database_status(args)

    options = storage_options(args.storage_option)
    feed = ChangeFeed(args.table, options)
    latest = feed.latest_version()
    when = dt.datetime.fromtimestamp(feed.table.manifest(latest).timestamp_us / 1e6, dt.UTC)
    report: dict[str, object] = {
        "table": redact_url(args.table),
        "latest_version": latest,
        "committed_at": when.isoformat(timespec="seconds"),
    }
    shown = redact_url(args.table)
    lines = [f"table       {shown}: latest version {latest} (committed {when:%F %T} UTC)"]
    if args.checkpoint:
        _checkpoint_status(args.checkpoint, latest, report, lines)
    if args.replica:
        _replica_status(args, options, latest, report, lines)
    print(json.dumps(report) if args.json else "\n".join(lines))
    return 0


def _checkpoint_status(
    checkpoint: str, latest: int, report: dict[str, object], lines: list[str]
) -> None:
    """Into `report` and `lines`: the version a publisher's `checkpoint` delivered
    through, its lag behind `latest`, and the broker outage it records."""
    from lance_cdf.kafka.outage import describe_state
    from lance_cdf.ops.clientconfig import redact_url
    from lance_cdf.spark.source.checkpoint import checkpoint_version

    done = checkpoint_version(checkpoint)
    report["checkpoint_version"] = done
    report["checkpoint_lag"] = None if done is None else latest - done
    lines.append(
        f"checkpoint  {redact_url(checkpoint)}: "
        + (
            "no micro-batch completed yet (lag unknown)"
            if done is None
            else f"delivered through version {done} (lag {latest - done} versions)"
        )
    )
    kafka = describe_state(checkpoint)
    if kafka is not None:
        report["kafka"], line = kafka
        lines.append(f"kafka       {line}")


def _replica_status(
    args: argparse.Namespace,
    options: dict[str, str],
    latest: int,
    report: dict[str, object],
    lines: list[str],
) -> None:
    """Into `report` and `lines`: the source version `--replica` holds, and its lag."""
    from lance_cdf.ops.clientconfig import redact_url
    from lance_cdf.replicate.replica import (
        INSIDE_VERSION_PROPERTY,
        ReplicaTable,
        describe_position,
        source_version_of,
    )

    replica_options = (
        storage_options(args.replica_storage_option, "--replica-storage-option")
        if args.replica_storage_option
        else options
    )
    table = ReplicaTable(args.replica, [], replica_options)
    position = table.position()
    held = source_version_of(position)
    inside = position.get(INSIDE_VERSION_PROPERTY)
    report["replica_version"] = held
    report["replica_inside_version"] = None if inside is None else int(inside)
    report["replica_lag"] = None if held is None else latest - held
    lag = (
        ""
        if held is None
        else f" ({latest - held} versions behind; commits that change no rows publish nothing)"
    )
    lines.append(f"replica     {redact_url(args.replica)}: {describe_position(position)}{lag}")
    from lance_cdf.replicate import unfinished

    left = unfinished.read(args.replica, held)
    report["replica_unfinished"] = None if left is None else asdict(left)
    if left is not None:
        lines.append(f"unfinished  {unfinished.describe(left)}")
    from lance_cdf.replicate.consumers import read_renewals

    renewed = read_renewals(args.replica)
    report["replica_consumer_restarts"] = renewed
    if renewed is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(renewed.get("at", 0))))
        lines.append(
            f"consumer    renewed {renewed.get('restarts')} time(s) after a fatal consumer "
            f"error, the last at {when} UTC: {renewed.get('error')}"
        )
    indexes, unbuilt = _replica_indexes(table.open())
    report["replica_indexes"], report["replica_unbuilt_indexes"] = indexes, unbuilt
    lines += _index_lines(indexes, unbuilt, "index       ")


def _replica_indexes(ds: LanceDataset | None) -> tuple[list[dict[str, object]], list[str]]:
    """A replica's indexes (name, type, columns, unindexed rows) and the definitions the
    replicator last could not build (one line each)."""
    from lance_cdf.replicate.index_keeper import describe_indexes, unbuilt_lines

    if ds is None:
        return [], []
    return describe_indexes(ds), unbuilt_lines(ds)


def _index_lines(indexes: list[dict[str, object]], unbuilt: list[str], lead: str) -> list[str]:
    lines = []
    for i in indexes:
        columns = i["columns"]
        names = ", ".join(str(c) for c in columns) if isinstance(columns, list) else ""
        lines.append(
            f"{lead}{i['name']} ({i['type']} on {names}): {i['unindexed_rows']} rows unindexed"
        )
    lines += [f"{lead}{line}" for line in unbuilt]
    return lines


def _database_status(args: argparse.Namespace) -> int:
    """`lance-cdf status --database D --checkpoint C`: each table a database publisher
    follows, its latest version and how far the checkpoint delivered it; the skipped ones."""
    from lance_cdf.core.feed import ChangeFeed
    from lance_cdf.format.namespace import list_tables
    from lance_cdf.ops.clientconfig import redact_url
    from lance_cdf.spark.source.checkpoint import REPORT_FILE, committed_tables, read_report

    if not args.checkpoint or args.replica:
        raise LanceCdfError("status --database takes --checkpoint (the publisher's), no --replica")
    options = storage_options(args.storage_option)
    delivered = committed_tables(args.checkpoint) or {}
    root = args.checkpoint.removeprefix("file://")
    report = read_report(os.path.join(root, REPORT_FILE)) or {}
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
        try:
            latest: int | None = ChangeFeed(uri, options).latest_version()
        except (LanceCdfError, OSError) as exc:  # (caught mid-commit, storage unreachable)
            latest = None
            lines.append(f"table       {name}: latest version not read ({in_words(exc)})")
        lag = None if done is None or latest is None else latest - done
        tables[name] = {"latest_version": latest, "checkpoint_version": done, "checkpoint_lag": lag}
        if latest is not None:
            lines.append(
                f"table       {name}: latest version {latest}, "
                + (
                    "no micro-batch delivered it yet (lag unknown)"
                    if done is None
                    else f"delivered through version {done} (lag {lag} versions)"
                )
            )
    for name, why in sorted(skipped.items()):
        lines.append(f"skipped     {name}: {why}")
    aside: dict[str, dict[str, object]] = dict(report.get("aside") or {})
    lines += [_aside_line(name, entry) for name, entry in sorted(aside.items())]
    retries = _takeup_retries(args.checkpoint, report)
    if retries:
        lines.append(f"retries     {retries} take-up / publish attempt(s) repeated after a fault")
    discovery: dict[str, object] = dict(report.get("discovery") or {"mode": "listing"})
    lines.append(_discovery_line(discovery))
    document = {
        "database": redact_url(args.database),
        "tables": tables,
        "skipped": skipped,
        "aside": aside,
        "takeup_retries": retries,
        "discovery": discovery,
    }
    print(json.dumps(document) if args.json else "\n".join(lines))
    return 0


def _aside_line(name: str, entry: dict[str, object]) -> str:
    """One line for a table a database publisher set aside: why, and when it is retried."""
    import time

    retry_at = float(str(entry.get("retry_at") or 0))
    when = (
        f"tried again at {time.strftime('%H:%M:%S', time.gmtime(retry_at))} UTC"
        if retry_at
        else "tried again later"
    )
    return f"set aside   {name}: {entry.get('cause')} ({entry.get('attempts')} attempt(s); {when})"


def _discovery_line(discovery: dict[str, object]) -> str:
    """How a database publisher finds commits: by commit events, or by listing (and why,
    when it was given events: `DatabaseReader`, `CommitHints`)."""
    events = discovery.get("events")
    if not events:
        return "discovery   listing (no --commit-events)"
    if discovery.get("mode") == "events":
        line = f"discovery   events from {events} ({discovery.get('hints', 0)} hint(s) so far)"
    else:
        line = (
            f"discovery   listing: commit events from {events} not heard ({discovery.get('why')})"
        )
    missed = int(str(discovery.get("unannounced") or 0))
    if missed:
        named = discovery.get("unannounced_tables")
        tables = ", ".join(str(t) for t in (named if isinstance(named, list) else [])[:5])
        line += (
            f"; {missed} commit(s) found by listing that no event named (tables {tables}): "
            "check that the bucket notifies the queue of every object created under _versions/"
        )
    return line


def _takeup_retries(checkpoint: str, report: dict[str, object]) -> int:
    """The take-up and publish attempts a database publisher repeated: its stream's
    (the report) and its writer tasks' (`WriterRetries`)."""
    from lance_cdf.ops.takeup import read_writer_retries

    writer = read_writer_retries(checkpoint)
    return int(str(report.get("takeup_retries") or 0)) + (writer.retries if writer else 0)


def _status_database(args: argparse.Namespace) -> int:
    """`lance-cdf status --database-target URI`: each replica table of the database (by
    qualified name), the topic it follows and the source version it holds."""
    from lance_cdf.format.namespace import list_tables
    from lance_cdf.ops.clientconfig import redact_url
    from lance_cdf.replicate import unfinished
    from lance_cdf.replicate.replica import (
        INSIDE_VERSION_PROPERTY,
        TOPIC_PROPERTY,
        ReplicaTable,
        describe_position,
        source_version_of,
    )

    options = storage_options(args.replica_storage_option or args.storage_option)
    refs = list_tables(args.database_target, options)
    replicas: list[dict[str, object]] = []
    width = max([len(r.qualified_name) for r in refs] or [0])
    lines = [f"database    {redact_url(args.database_target)}: {len(refs)} replica tables"]
    for ref in refs:
        table = ReplicaTable(ref.uri, [], options)
        position = table.position()
        inside = position.get(INSIDE_VERSION_PROPERTY)
        replicas.append(
            {
                "table": ref.qualified_name,
                "uri": redact_url(ref.uri),
                "topic": position.get(TOPIC_PROPERTY),
                "source_version": source_version_of(position),
                "inside_version": None if inside is None else int(inside),
            }
        )
        topic = position.get(TOPIC_PROPERTY)
        lines.append(
            f"  {ref.qualified_name:<{width}}  {describe_position(position)}"
            + (f" (topic {topic})" if topic else "")
        )
        left = unfinished.read(ref.uri, source_version_of(position))
        replicas[-1]["unfinished"] = None if left is None else asdict(left)
        if left is not None:
            lines.append(f"  {'':<{width}}  unfinished: {unfinished.describe(left)}")
        indexes, unbuilt = _replica_indexes(table.open())
        replicas[-1]["indexes"], replicas[-1]["unbuilt_indexes"] = indexes, unbuilt
        lines += _index_lines(indexes, unbuilt, f"  {'':<{width}}  index: ")
    report = {"database_target": redact_url(args.database_target), "replicas": replicas}
    print(json.dumps(report) if args.json else "\n".join(lines))
    return 0
