"""What a read of the `lance-cdf` source resolves before it plans: the table's feed, the first
version (startingVersion / startingTimestamp / a checkpoint), the versions still readable,
the union schema of the range and the Spark schema of the events."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import LongType, StructType

from lance_cdf.core.columns import column_sources
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.core.stream_columns import EVENT_ORDER, KEY_HASH
from lance_cdf.errors import (
    LanceCdfError,
    NoVersionSinceError,
)
from lance_cdf.spark.source.advice import Advice, advice_for
from lance_cdf.spark.source.identity import origin
from lance_cdf.spark.source.options import SourceOptions
from lance_cdf.spark.source.table_feeds import feed_for
from lance_cdf.spark.source.types import spark_schema


def unreadable(versions: Sequence[int], first: int, last: int) -> list[int]:
    """Versions in first..last whose changes cannot be computed any more: the
    version, or the one it is diffed against, was removed by cleanup."""
    present = set(versions)
    return [
        v for v in range(first, last + 1) if v not in present or (v > 1 and v - 1 not in present)
    ]


def earliest_readable(versions: Sequence[int]) -> int:
    """The first version whose changes can still be read (latest + 1 if none)."""
    present = set(versions)
    for v in versions:
        if v == 1 or v - 1 in present:
            return v
    return versions[-1] + 1


def spans(versions: Iterable[int]) -> str:
    """`[2, 3, 4, 7]` -> `"2..4, 7"`."""
    out: list[list[int]] = []
    for v in sorted(versions):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in out)


def _first_at_or_after(feed: ChangeFeed, timestamp_us: int, latest: int) -> int:
    """First present version committed at or after `timestamp_us` (commit times
    grow with versions), or latest + 1."""
    versions = [v for v in feed.table.versions if v <= latest]
    i = bisect.bisect_left(
        range(len(versions)),
        True,
        key=lambda i: (
            feed.table.manifest(versions[i], operation=False).timestamp_us >= timestamp_us
        ),
    )
    return versions[i] if i < len(versions) else latest + 1


def _start_version(opts: SourceOptions, feed: ChangeFeed, latest: int, streaming: bool) -> int:
    """First version whose changes are delivered.

    `latest`: a stream starts after it (only new commits); a batch read returns
    the changes of the latest version. `earliest`: the first readable version.
    `snapshot`: the changes after the snapshot version (the latest).
    """
    if opts.starting_timestamp_us is not None:
        return _first_at_or_after(feed, opts.starting_timestamp_us, latest)
    if opts.starting == "snapshot":
        return latest + 1
    if opts.starting == "latest":
        return latest + 1 if streaming else latest
    if opts.starting == "earliest":
        return min(earliest_readable(feed.table.versions), latest + 1)
    start = int(opts.starting)
    if start > latest + (1 if streaming else 0):
        raise feed.table.missing_version_error(start)
    return start


def _union(feed: ChangeFeed, first: int, last: int, columns: Sequence[str] | None) -> pa.Schema:
    """The event columns of first..last, as read_changes has them, from the
    versions still present (a stream skips or stops at the missing ones)."""
    lo = max(first - 1, 1)
    present = [v for v in feed.table.versions if lo <= v <= last]
    if not present:
        return feed.schema_at(feed.table.latest_version, columns)
    return feed.union_of(present, columns, f"versions {first}..{last}")


def renamed_columns(fixed: pa.Schema, now: pa.Schema, gone: list[str]) -> list[str]:
    """'old -> new' for columns of `fixed` missing by name from `now` whose Lance
    field id is still there under another name."""
    sources = column_sources(fixed, now)
    return [
        f"{f.name} -> {src.name}"
        for f, src in zip(fixed, sources, strict=True)
        if f.name in gone and src is not None and src.name != f.name
    ]


@dataclass(frozen=True)
class Resolved:
    """Options checked against the table: where to start, the columns."""

    opts: SourceOptions
    start: int
    end: int  # a batch read's last version; a stream's "now" (the schema's version)
    user_schema: pa.Schema
    snapshot_version: int | None = None  # startingVersion=snapshot: V0
    # the start this query was given (identity.origin), None if no option named one
    given: str | None = None
    advice: Advice = advice_for("spark")  # the entry point's words (option entryPoint)


def resolve(options: Mapping[str, str], streaming: bool, as_of: int | None = None) -> Resolved:
    """Parse options and fix the schema: the columns of every version from the
    start to the end. `as_of` (the version `load()` saw) stands for "latest":
    a stream starts after it, a batch read without endingVersion ends at it."""
    opts = SourceOptions.parse(dict(options), streaming)
    raw = {str(k).lower(): str(v) for k, v in options.items()}
    named = "startingversion" in raw or "startingtimestamp" in raw
    given = origin(opts.starting, opts.starting_timestamp_us) if named else None
    advice = advice_for(raw.get("entrypoint", "spark").strip().lower())
    feed = feed_for(opts)
    latest = feed.latest_version()
    if as_of is not None and as_of <= latest:
        latest = as_of
    if opts.starting == "snapshot" and not streaming:
        # a batch read's snapshot is the table at endingVersion (default: the latest)
        end = opts.ending_version if opts.ending_version is not None else latest
        if not feed.table.has_version(end):
            raise feed.table.missing_version_error(end)
        return Resolved(opts, end + 1, end, feed.schema_at(end, opts.columns), end)
    start = _start_version(opts, feed, latest, streaming)
    if streaming:
        snap = latest if opts.starting == "snapshot" else None
        union = _union(feed, start, latest, opts.columns)
        return Resolved(opts, start, latest, union, snap, given, advice)
    if start > latest and opts.starting_timestamp_us is not None:
        raise NoVersionSinceError(
            f"no version of {opts.path} was committed at or after startingTimestamp; the "
            f"latest, version {latest}, was committed at {feed.table.manifest(latest).timestamp}."
        )
    end = opts.ending_version if opts.ending_version is not None else latest
    start, end = feed.resolve_range(start, end)
    return Resolved(opts, start, end, feed.user_schema(start, end, opts.columns))


def event_struct(resolved: Resolved) -> StructType:
    """The events' Spark schema: the user columns, the metadata, and with keyHash the
    routing columns."""
    if not resolved.opts.key_hash:
        return spark_schema(resolved.user_schema)
    names = resolved.user_schema.names
    missing = [c for c in resolved.opts.key_hash if c != "_rowid" and c not in names]
    if missing:
        raise LanceCdfError(
            f"keyHash names {missing}, not columns of {resolved.opts.path} "
            f"(available: {resolved.user_schema.names} and _rowid)"
        )
    return routed_struct(resolved.user_schema)


def routed_struct(user_schema: pa.Schema) -> StructType:
    """The Spark schema of the events of `user_schema`'s columns with `_key_hash` and
    `_event_order` (option keyHash)."""
    declared = spark_schema(user_schema)
    declared = declared.add(KEY_HASH, LongType(), nullable=False)
    return declared.add(EVENT_ORDER, LongType(), nullable=False)
