"""How far a `lance-cdf` stream is behind its table, from Spark's query progress.

Spark puts the source's offsets in every progress report: `endOffset` (what the
micro-batch delivered through) and `latestOffset` (what the source reported as
the table's latest version, `reportLatestOffset`). The Python Data Source API of
pyspark 4.3 has no custom source metrics, so the lag is derived from those two.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery


@dataclass(frozen=True)
class SourceVersions:
    """`delivered`: every change up to this version was delivered (a snapshot still in
    progress counts as the version before it); `latest`: the table's latest version
    when the micro-batch was planned."""

    delivered: int
    latest: int | None

    @property
    def lag(self) -> int | None:
        return None if self.latest is None else max(0, self.latest - self.delivered)


def _version(offset: object) -> tuple[int, bool] | None:
    """(version, snapshot in progress) of a lance-cdf offset (a dict or its JSON)."""
    if offset is None:
        return None
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return None
    if not isinstance(offset, dict) or "version" not in offset:
        return None
    return int(offset["version"]), "snapshot" in offset


def source_versions(progress: dict[str, Any] | None) -> SourceVersions | None:
    """The lance-cdf source's versions in one progress report (`query.lastProgress`),
    or None when the query has no lance-cdf source or has not planned a batch yet."""
    for source in (progress or {}).get("sources", []):
        end = _version(source.get("endOffset"))
        if end is None:
            continue
        latest = _version(source.get("latestOffset"))
        version, snapshotting = end
        return SourceVersions(
            version - 1 if snapshotting else version, None if latest is None else latest[0]
        )
    return None


def lag(query: StreamingQuery) -> int | None:
    """Versions the table is ahead of what `query` (a StreamingQuery reading
    `format("lance-cdf")`) delivered, as of its last progress report."""
    versions = source_versions(query.lastProgress)
    return None if versions is None else versions.lag
