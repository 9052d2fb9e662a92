"""Whose a checkpoint is: the table and the start a `lance-cdf` stream's offsets carry.

An offset `{"version": N}` alone fits any table that has a version N: a checkpoint given
another table would go on from N and never send that table's versions 1..N. So each offset
also carries
- `table`: `{"uri": the table's path when the offset was made (for messages only),
  "commit": the fingerprint of the commit that made version N}` (a digest of its
  manifest's timestamp, in nanoseconds, and its transaction file's name, a UUID). Both
  live inside the manifest, so a table whose directory is copied, renamed or moved to
  another bucket or prefix keeps them; another table's version N has others;
- `from`: the start the stream was first given (startingVersion, or startingTimestamp as
  `timestamp:<µs>`), carried from offset to offset.

A query that starts from a stored offset checks both against its table and options
(`check_offset`). An offset without them (written by an older lance-cdf) is accepted as it
is; the offsets after it carry them. Offsets are compared as JSON by Spark (an unchanged
offset means no new data), so the fields depend on the version only.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from lance_cdf.core.feed import ChangeFeed
from lance_cdf.errors import CheckpointMismatchError
from lance_cdf.spark.source.advice import Advice

if TYPE_CHECKING:
    from lance_cdf.spark.source.partitions import Offset


def commit_fingerprint(feed: ChangeFeed, version: int) -> str | None:
    """The fingerprint of the commit that made `version` (None: no such manifest, e.g.
    version 0 or a version cleaned up)."""
    if version < 1 or not feed.table.has_version(version):
        return None
    manifest = feed.table.manifest(version, operation=False, base=True)
    ts = manifest.proto.timestamp
    text = f"{version}:{ts.seconds}.{ts.nanos:09d}:{manifest.transaction_file}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def shown_uri(uri: str) -> str:
    """The table's URI without credentials (`scheme://user:secret@host/...`)."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", uri)


def origin(starting: int | str, starting_timestamp_us: int | None) -> str:
    """The `from` of a stream's offsets: the start it was given."""
    if starting_timestamp_us is not None:
        return f"timestamp:{starting_timestamp_us}"
    return str(starting)


def stamp(offset: Offset, feed: ChangeFeed, uri: str, start: str | None) -> Offset:
    """`offset` with the table's identity at its version and the stream's `from`."""
    out = {k: v for k, v in offset.items() if k not in ("table", "from")}
    commit = commit_fingerprint(feed, int(offset["version"]))
    if commit is not None:
        out["table"] = {"uri": shown_uri(uri), "commit": commit}
    if start is not None:
        out["from"] = start
    return out


def check_offset(
    offset: Offset,
    feed: ChangeFeed,
    uri: str,
    start: str | None,
    advice: Advice,
    checkpoint: str = "the checkpoint",
) -> None:
    """Refuse a stored offset that is not of this table, or a start given now that differs
    from the one the checkpoint was started with (`start`: None when none was given now).

    A version whose manifest is gone cannot be checked here: cleanup removed it (the stream
    then stops naming the versions it can no longer read), or the table is shorter (the
    stream stops: the checkpoint is past its latest version)."""
    version = int(offset["version"])
    table = offset.get("table")
    if isinstance(table, dict) and "commit" in table:
        commit = commit_fingerprint(feed, version)
        if commit is not None and commit != table["commit"]:
            raise CheckpointMismatchError(
                f"{checkpoint} follows table {table.get('uri')}, not {shown_uri(uri)}: their "
                f"version {version} is another commit. To publish {shown_uri(uri)}, "
                f"{advice.new_checkpoint}; a table that was moved or copied is accepted."
            )
    held = offset.get("from")
    if start is not None and held is not None and str(held) != start:
        shown = held.removeprefix("timestamp:")
        raise CheckpointMismatchError(
            f"{checkpoint} was started with {advice.starting_given(shown)} and has delivered "
            f"through version {version}; {advice.starting_given(start)} applies to a new "
            f"checkpoint only. Leave it out (or give the same) to resume, or "
            f"{advice.new_checkpoint} to start from {start}."
        )
