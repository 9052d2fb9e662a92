"""How far a `lance-cdf` streaming query got, read from its Spark checkpoint directory.

A Spark checkpoint holds `offsets/<batch>` (written when a micro-batch is planned: a
version line, a metadata line, then one JSON offset per source) and `commits/<batch>`
(written when it completed). The newest committed batch's offset, `{"version": N}`,
says every change through version N was delivered to the sink.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any

from lance_cdf.errors import LanceCdfError
from lance_cdf.ops.state_files import checkpoint_file, read_json

if TYPE_CHECKING:
    from lance_cdf.spark.source.partitions import Offset


def _batches(path: str) -> list[int]:
    if not os.path.isdir(path):
        return []
    return sorted(int(name) for name in os.listdir(path) if name.isdigit())


# what Spark's atomic write of `offsets/<batch>` or `commits/<batch>` leaves when its process
# is killed before the rename: the temporary file `.<batch>.<uuid>.tmp` and its checksum
# `..<batch>.<uuid>.tmp.crc` (Hadoop's local file system)
_UNFINISHED_WRITE = re.compile(r"\.\.?\d+\.[0-9a-f-]+\.tmp(\.crc)?")


def drop_unfinished_writes(checkpoint: str) -> list[str]:
    """Remove what a killed query's unfinished writes left in a local checkpoint's
    `offsets/` and `commits/` (the names removed; none for another file system). Spark never
    reads them, but a checkpoint whose only offset file is one refuses to start
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY: a publisher killed while planning its
    first micro-batch could not be restarted). For the checkpoint's one writer, before its
    query starts: a running query's own writes in progress look the same."""
    root = _local_root(checkpoint)
    if root is None:
        return []
    removed = []
    for log in ("offsets", "commits"):
        folder = os.path.join(root, log)
        names = os.listdir(folder) if os.path.isdir(folder) else []
        for name in sorted(n for n in names if _UNFINISHED_WRITE.fullmatch(n)):
            os.remove(os.path.join(folder, name))
            removed.append(f"{log}/{name}")
    return removed


def committed_offset(checkpoint: str) -> Offset | None:
    """The lance-cdf source's offset in the newest committed micro-batch (`{"version": N}`,
    with `"snapshot"` while a snapshot is being delivered), or None if the query has not
    completed a micro-batch yet (or the directory is not a checkpoint)."""
    root = _local(checkpoint)
    committed = _batches(os.path.join(root, "commits"))
    return _offset(checkpoint, root, committed[-1]) if committed else None


def planned_offset(checkpoint: str) -> Offset | None:
    """The lance-cdf source's offset in the newest planned micro-batch (what the query
    has seen of its source, delivered or not), or None before the first."""
    root = _local(checkpoint)
    planned = _batches(os.path.join(root, "offsets"))
    return _offset(checkpoint, root, planned[-1]) if planned else None


def _local_root(checkpoint: str) -> str | None:
    """A local checkpoint's directory (None: the checkpoint is on another file system)."""
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return None
    return checkpoint.removeprefix("file://")


def _local(checkpoint: str) -> str:
    root = _local_root(checkpoint)
    if root is None:
        raise LanceCdfError(
            f"checkpoint {checkpoint!r}: only local checkpoint directories can be inspected"
        )
    return root


def _offset(checkpoint: str, root: str, batch: int) -> Offset:
    with open(os.path.join(root, "offsets", str(batch))) as f:
        offset = _lance_cdf_offset(f.read())
    if offset is None:
        raise LanceCdfError(
            f"checkpoint {checkpoint!r} is not one of a lance-cdf query (no version offset "
            f"in offsets/{batch})"
        )
    return offset


def _lance_cdf_offset(text: str) -> Offset | None:
    """The lance-cdf source's offset in an `offsets/<batch>` file (a version line, a
    metadata line, then one JSON offset per source); None if it has none."""
    for line in text.splitlines()[2:]:
        try:
            offset = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(offset, dict) and ("version" in offset or "tables" in offset):
            return offset  # (a database stream's, `DatabaseReader`: `{"tables": {name: offset}}`)
    return None


def batch_offset(checkpoint: str, batch: int) -> Offset | None:
    """The lance-cdf source's end offset of micro-batch `batch` (`offsets/<batch>`, written
    when the batch was planned); None if there is none (a remote checkpoint, a batch
    before the first, a file Spark purged, or no lance-cdf offset in it)."""
    if batch < 0 or ("://" in checkpoint and not checkpoint.startswith("file://")):
        return None
    try:
        with open(os.path.join(checkpoint.removeprefix("file://"), "offsets", str(batch))) as f:
            return _lance_cdf_offset(f.read())
    except OSError:
        return None


def checkpoint_version(checkpoint: str) -> int | None:
    """The source version a lance-cdf query has delivered through, or None if it has not
    completed a micro-batch yet (or the directory is not a checkpoint)."""
    offset = committed_offset(checkpoint)
    if offset is not None and "tables" in offset:
        raise LanceCdfError(
            f"checkpoint {checkpoint!r} is a database publisher's (publish --database): "
            "give lance-cdf status --database instead of --table"
        )
    return None if offset is None else int(offset["version"])


def committed_tables(checkpoint: str) -> dict[str, int] | None:
    """Per table of a database stream's checkpoint (publish --database), the version it has
    delivered through; None if the query has not completed a micro-batch yet."""
    return _tables(checkpoint, committed_offset(checkpoint))


def planned_tables(checkpoint: str) -> dict[str, int] | None:
    """Per table of a database stream's checkpoint, the version its newest planned
    micro-batch reads through (the latest it has seen); None before the first."""
    return _tables(checkpoint, planned_offset(checkpoint))


def _tables(checkpoint: str, offset: Offset | None) -> dict[str, int] | None:
    if offset is None:
        return None
    tables = offset.get("tables")
    if not isinstance(tables, dict):
        raise LanceCdfError(
            f"checkpoint {checkpoint!r} is a single table's, not a database publisher's: "
            "give lance-cdf status --table instead of --database"
        )
    return {str(name): int(o["version"]) for name, o in tables.items()}


REPORT_FILE = "database-tables.json"


def report_path(checkpoint: str) -> str | None:
    """Where a database publisher's stream lists the tables it follows, skips and sets
    aside (a local checkpoint's `REPORT_FILE`; None on object storage)."""
    return checkpoint_file(checkpoint, REPORT_FILE)


def read_report(path: str) -> dict[str, Any] | None:
    """The report a database stream wrote (`_report`), or None."""
    return read_json(path)
