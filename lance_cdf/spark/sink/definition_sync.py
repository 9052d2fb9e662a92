"""The table definitions (`TableDefinition`: indexes, `update_config` keys, schema and
field metadata) the sink's commit sends on the transaction topic, in order with the data.

For each table whose micro-batch covers versions (start, end] (the query's checkpoint:
`offsets/<batch>` and `offsets/<batch - 1>`), the definition at `end` is compared with
what the topic's consumers know: the definition the topic's last record carries, else
the definition at `start` (what every earlier micro-batch made known), else, at a new
checkpoint or a table new to the stream, the empty definition (an indexed table's first
micro-batch sends it). Where it differs it goes on the END of version `end`
(`TransactionWriter`), a BEGIN/END with no events if `end` has no changes (an index or
config commit). An index optimize changes an index's segments, not its definition: nothing
is sent for it.

The head start (`headstart.Rounds`) commits as batch -1: its span starts at the
checkpoint's committed offset and ends at the last version it published; the query's first
micro-batch after it starts there too, and finds the head start's definition (if any) on
the topic's last record. A remote checkpoint cannot be read here: the span then ends at
the batch's last version with changes and is compared with the definition at the topic's
last END (an index-only commit rides with the next commit that has changes).

Capturing reads only the manifests of `start` and `end` (pylance's `describe_indices`,
the config and the schema); a vector index's partition count needs its index file read,
once per set of index segments (`DefinitionCapture`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lance_cdf.errors import PublishError, in_words
from lance_cdf.format.definitions import TableDefinition

if TYPE_CHECKING:
    from lance_cdf.format.definition_capture import DefinitionCapture
    from lance_cdf.kafka.transactions import DefinitionChange, TransactionRecord

# tables whose definitions this process keeps (least recently used out), and versions each
MAX_TABLES = 512
_VERSIONS_KEPT = 4


@dataclass(frozen=True)
class Span:
    """A table's versions in one micro-batch: (start, end]; start None: nothing before
    (a new checkpoint, a table new to the stream, a snapshot just delivered)."""

    start: int | None
    end: int
    # the checkpoint could not say where the batch began: what the consumers know is the
    # definition at the version of the topic's last END
    from_topic: bool = False


def _span(start: dict[str, Any] | None, end: dict[str, Any]) -> Span | None:
    if "snapshot" in end:  # a snapshot being delivered: its definition once it completes
        return None
    e = int(end["version"])
    if e < 1:  # (a table entering a database stream before its first version)
        return None
    if start is None or "snapshot" in start:
        return Span(None, e)
    s = int(start["version"])
    return Span(s, e) if s < e else None


def batch_spans(
    checkpoint: str | None, batch_id: int, versions: dict[str | None, list[int]]
) -> dict[str | None, Span]:
    """Each table's span in micro-batch `batch_id` (None: the single table; else the
    database's qualified names). `versions`: the versions with changes per table (the
    fallback where the checkpoint cannot be read)."""
    from lance_cdf.spark.source.checkpoint import batch_offset, committed_offset

    end = batch_offset(checkpoint, batch_id) if checkpoint else None
    if end is not None:
        start = batch_offset(str(checkpoint), batch_id - 1)
    elif batch_id < 0 and checkpoint:  # the head start: from the committed offset
        try:
            start = committed_offset(checkpoint)
        except Exception:  # noqa: BLE001 - a remote or unreadable checkpoint: fall back
            start = None
        return _head_start_spans(start, versions)
    if end is None:
        return {t: Span(None, max(v), from_topic=True) for t, v in versions.items() if v}
    if "tables" not in end:
        span = _span(start, end)
        return {} if span is None else {None: span}
    before = (start or {}).get("tables") or {}
    out: dict[str | None, Span] = {}
    for name, offset in end["tables"].items():
        span = _span(before.get(name), offset)
        if span is not None:
            out[str(name)] = span
    return out


def _head_start_spans(
    start: dict[str, Any] | None, versions: dict[str | None, list[int]]
) -> dict[str | None, Span]:
    out: dict[str | None, Span] = {}
    tables = (start or {}).get("tables")
    for name, have in versions.items():
        if not have:
            continue
        offset = start if name is None else (tables or {}).get(name)
        base = None if offset is None or "snapshot" in offset else int(offset["version"])
        out[name] = Span(base, max(have))
    return out


# a captured definition and its indexes' origins (`DefinitionCapture`)
Captured = tuple[TableDefinition, dict[str, int]]


@dataclass
class TableDefinitions:
    """One table's definitions by version, as this process captured them."""

    uri: str
    storage: dict[str, str] = field(repr=False)  # credentials: never printed
    capture: DefinitionCapture | None = None
    by_version: dict[int, Captured | None] = field(default_factory=dict)

    def at(self, version: int) -> Captured | None:
        """The definition at `version` (with its indexes' origins); None if the version
        is gone (cleaned up)."""
        if version in self.by_version:
            return self.by_version[version]
        import lance

        from lance_cdf.format.definition_capture import DefinitionCapture

        if self.capture is None:
            self.capture = DefinitionCapture()
        try:
            ds = lance.dataset(self.uri, version=version, storage_options=self.storage or None)
            found: Captured | None = self.capture.capture_with_origins(ds)
        except Exception as exc:
            if "not found" not in str(exc).lower():
                raise PublishError(
                    f"reading the definition of {self.uri} at version {version} failed: "
                    f"{in_words(exc)}"
                ) from exc
            found = None
        while len(self.by_version) >= _VERSIONS_KEPT:
            del self.by_version[next(iter(self.by_version))]
        self.by_version[version] = found
        return found

    def _known_at(self, start: int | None) -> tuple[TableDefinition, int]:
        if start is None:
            return TableDefinition(), 0
        before = self.at(start)  # gone: sent again (a repeat, never a loss)
        return (TableDefinition(), 0) if before is None else (before[0], start)

    def change(self, span: Span) -> DefinitionChange:
        """What `TransactionWriter.write` asks: the definition at `span.end` unless the
        topic's consumers know it already."""
        from lance_cdf.format.definition_capture import settled

        def changed(last: TransactionRecord | None) -> TableDefinition | None:
            now = self.at(span.end)
            if now is None:
                return None  # (gone already: its successor's definition comes with it)
            if last is not None and last.definition is not None:
                known, known_at = last.definition, last.version
            elif span.from_topic:
                known, known_at = self._known_at(None if last is None else last.version)
            else:
                known, known_at = self._known_at(span.start)
            current = settled(now[0], now[1], known, known_at)
            return None if current == known else current

        return changed

    def unchanged(self, span: Span) -> bool:
        """The definition at the span's end is the one at its start (nothing to send
        for a span without changes; the topic need not be read)."""
        from lance_cdf.format.definition_capture import settled

        if span.from_topic:
            return False  # (the topic's last record decides)
        try:
            if span.start is not None and self.at(span.start) is None:
                return False
            known, known_at = self._known_at(span.start)
            now = self.at(span.end)
            # (an end already gone has no definition to send: `change` sends none)
            return now is None or settled(now[0], now[1], known, known_at) == known
        except PublishError:  # (the write asks again, with the broker outage's patience)
            return False


_TABLES: dict[tuple[str, tuple[tuple[str, str], ...]], TableDefinitions] = {}


def table_definitions(uri: str, storage: dict[str, str]) -> TableDefinitions:
    """This process's `TableDefinitions` of the table (most recently used last)."""
    key = (uri, tuple(sorted(storage.items())))
    found = _TABLES.pop(key, None)
    if found is None:
        while len(_TABLES) >= MAX_TABLES:
            del _TABLES[next(iter(_TABLES))]
        found = TableDefinitions(uri, dict(storage))
    _TABLES[key] = found
    return found
