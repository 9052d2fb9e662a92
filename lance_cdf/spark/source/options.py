"""Options of the `lance-cdf` Spark source, parsed and checked on the driver."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from lance_cdf.errors import LanceCdfError
from lance_cdf.format.namespace import resolve_table

STORAGE_PREFIX = "storage."
KNOWN = {
    "path",
    "startingversion",
    "startingtimestamp",
    "endingversion",
    "maxversionspertrigger",
    "maxrowspertrigger",
    "columns",
    "failondataloss",
    "mergeschema",
    "rowsperpartition",
    "netchanges",
    "dropunchangedupdates",
    "keyhash",
    "writerslots",
    "kafkapartitions",
    "entrypoint",  # "publish" words error advice in publish's flags (advice.py)
    "database",
    "handover",  # publish's head start hands over to the query through it (handover.py)
}


def _int(options: dict[str, str], key: str, minimum: int) -> int | None:
    raw = options.get(key.lower())
    return None if raw is None else _whole(raw, key, minimum)


def _whole(raw: str, key: str, minimum: int) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise LanceCdfError(f"option {key}={raw!r} is not a whole number") from None
    if value < minimum:
        raise LanceCdfError(f"option {key}={raw!r} must be at least {minimum}")
    return value


def option_bool(options: dict[str, str], key: str, default: bool) -> bool:
    """Boolean option `key` of `options` (keys lower-cased): true or false in any case,
    `default` when absent; anything else is refused naming the option. The one parser of
    the source's and the sink's boolean options."""
    raw = options.get(key.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise LanceCdfError(f"option {key}={raw!r} must be true or false")
    return text == "true"


def _timestamp(raw: str) -> int:
    """Microseconds since the epoch of an ISO-8601 time (UTC if no zone is given)."""
    try:
        ts = datetime.fromisoformat(str(raw).strip().replace("Z", "+00:00"))
    except ValueError:
        raise LanceCdfError(
            f"option startingTimestamp={raw!r} is not an ISO-8601 time, e.g. 2026-11-22T10:00:00Z"
        ) from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return int(ts.timestamp() * 1_000_000)


def _columns(raw: str | None) -> tuple[str, ...] | None:
    if raw is None or not str(raw).strip():
        return None
    columns = tuple(c.strip() for c in str(raw).split(",") if c.strip())
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise LanceCdfError(f"option columns={raw!r} names {repeated} more than once")
    return columns


@dataclass(frozen=True)
class SourceOptions:
    """The `lance-cdf` source's options, parsed and checked (`SourceOptions.parse`): names
    are case-insensitive, as Spark's; `storage.<key>` options become `storage_options`; with
    `database`, `path` is a table's name there and is resolved to its URI. Every option is
    in the Spark options reference (docs/reference/spark-options.md; test_docs
    checks that each one known here is there). `parse` raises `LanceCdfError` for an unknown
    option, a bad value or a combination that cannot hold."""

    path: str
    # a version number, "latest", "earliest" or "snapshot" (see source._start_version)
    starting: int | str
    starting_timestamp_us: int | None
    ending_version: int | None
    max_versions_per_trigger: int | None
    max_rows_per_trigger: int | None
    columns: tuple[str, ...] | None
    fail_on_data_loss: bool
    merge_schema: bool
    rows_per_partition: int
    net_changes: bool = False
    drop_unchanged_updates: bool = False
    # keyHash: key columns whose hash each event carries in `_key_hash` (core/keyhash.py)
    key_hash: tuple[str, ...] | None = None
    # writerSlots / kafkaPartitions: the stream carries, per micro-batch, one work item per
    # writer slot instead of the events (spark/source/handoff.py: the Kafka sink reads them)
    writer_slots: int | None = None
    kafka_partitions: int | None = None
    # handOver (internal, set by lance-cdf publish): the file through which the head start
    # hands over to this query at its first plan (spark/source/handover.py)
    hand_over: str | None = None
    storage_options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: dict[str, str], streaming: bool) -> SourceOptions:
        options = {str(k).lower(): v for k, v in raw.items()}
        path = options.get("path")
        if not path:
            raise LanceCdfError(
                'option "path" is required: .option("path", "/data/table.lance") or .load(path)'
            )
        starting_raw = options.get("startingversion")
        if starting_raw is None:
            starting: int | str = "latest" if streaming else "earliest"
        elif str(starting_raw).strip().lower() in ("latest", "earliest", "snapshot"):
            starting = str(starting_raw).strip().lower()
        else:
            starting = _whole(starting_raw, "startingVersion", 1)
        ts = options.get("startingtimestamp")
        if ts is not None and starting_raw is not None:
            raise LanceCdfError("give startingVersion or startingTimestamp, not both")
        ending = _int(options, "endingVersion", 1)
        if ending is not None and streaming:
            raise LanceCdfError(
                "endingVersion is for batch reads (spark.read); a stream runs until stopped — "
                "use Trigger.AvailableNow to stop at the latest version"
            )
        columns = _columns(options.get("columns"))
        unknown = sorted(k for k in options if k not in KNOWN and not k.startswith(STORAGE_PREFIX))
        if unknown:
            raise LanceCdfError(
                f"unknown option(s) {unknown} for lance-cdf; known: {sorted(KNOWN)} and "
                f"{STORAGE_PREFIX}<key> for storage options"
            )
        slots = _int(options, "writerSlots", 1)
        if slots is not None and not (
            streaming
            and options.get("keyhash")
            and options.get("kafkapartitions")
            and not option_bool(options, "netChanges", False)
        ):
            raise LanceCdfError(
                "option writerSlots hands each micro-batch to the lance-cdf-kafka sink's "
                "writers: it is for streams (readStream) with keyHash and kafkaPartitions "
                "set, without netChanges"
            )
        storage_options = {
            k[len(STORAGE_PREFIX) :]: str(v)
            for k, v in raw.items()
            if str(k).lower().startswith(STORAGE_PREFIX)
        }
        database = options.get("database")
        if database:  # path is a table's name in that database (lance_cdf.format.namespace)
            path = resolve_table(str(database), str(path), storage_options)
        return cls(
            path=str(path),
            starting=starting,
            starting_timestamp_us=_timestamp(ts) if ts is not None else None,
            ending_version=ending,
            max_versions_per_trigger=_int(options, "maxVersionsPerTrigger", 1),
            max_rows_per_trigger=_int(options, "maxRowsPerTrigger", 1),
            columns=columns,
            fail_on_data_loss=option_bool(options, "failOnDataLoss", True),
            merge_schema=option_bool(options, "mergeSchema", False),
            rows_per_partition=_int(options, "rowsPerPartition", 1) or 100_000,
            net_changes=option_bool(options, "netChanges", False),
            drop_unchanged_updates=option_bool(options, "dropUnchangedUpdates", False),
            key_hash=_columns(options.get("keyhash")),
            writer_slots=_int(options, "writerSlots", 1),
            kafka_partitions=_int(options, "kafkaPartitions", 1),
            hand_over=options.get("handover") or None,
            storage_options=storage_options,
        )
