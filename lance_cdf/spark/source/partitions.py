"""The `lance-cdf` source's partitions (what one Spark task reads), and their JSON form.

Spark pickles these to its executors itself (its own mechanism, between its own
processes). The JSON form is for work items (option writerSlots, `WorkItem`):
rows of the stream that another component reads, so they hold plain data only, and
`part_of` takes nothing but the exact shapes `part_json` writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from lance_cdf.errors import WorkItemError

# A stream offset: the JSON object Spark keeps in the checkpoint and hands back to the
# source (pyspark types it a plain dict); its values are JSON's, so Any
Offset = dict[str, Any]


@dataclass(frozen=True)
class ChangeSlices(InputPartition):
    """Segments `(version, part, parts)`: part `part` of `parts` of the changed
    rows of `version`, read in this order."""

    segments: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class SnapshotSlice(InputPartition):
    """Live rows `offset`..`offset + limit` of fragment `fragment_id` of the
    snapshot version `version`."""

    version: int
    fragment_id: int
    offset: int
    limit: int


@dataclass(frozen=True)
class NetSlice(InputPartition):
    """Net changes over `versions` of the row IDs with `rowid % parts == part`."""

    versions: tuple[int, ...]
    part: int
    parts: int


SourcePartition = ChangeSlices | SnapshotSlice | NetSlice


def part_json(part: SourcePartition) -> dict[str, Any]:
    """`part` as JSON-ready data: `{"kind": ..., <its fields>}`."""
    if isinstance(part, ChangeSlices):
        return {"kind": "changes", "segments": [list(s) for s in part.segments]}
    if isinstance(part, SnapshotSlice):
        return {
            "kind": "snapshot",
            "version": part.version,
            "fragment": part.fragment_id,
            "offset": part.offset,
            "limit": part.limit,
        }
    if isinstance(part, NetSlice):
        return {
            "kind": "net",
            "versions": list(part.versions),
            "part": part.part,
            "parts": part.parts,
        }
    raise TypeError(f"not a lance-cdf source partition: {type(part).__name__}")


def whole(value: object, what: str, minimum: int = 0) -> int:
    """`value` if it is an int >= minimum (a JSON number without a fraction; not a bool)."""
    if type(value) is not int or value < minimum:
        raise WorkItemError(f"{what} is {value!r}, not a whole number >= {minimum}")
    return value


def fields(value: object, what: str, keys: set[str]) -> dict[str, object]:
    """`value` if it is an object with exactly the keys `keys`."""
    if not isinstance(value, dict) or set(value) != keys:
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise WorkItemError(f"{what} is {got}, not an object with keys {sorted(keys)}")
    return value


def listed(value: object, what: str) -> list[object]:
    if not isinstance(value, list):
        raise WorkItemError(f"{what} is {type(value).__name__}, not a list")
    return value


def _versions(value: object, what: str) -> tuple[int, ...]:
    return tuple(whole(v, f"{what}[{i}]", 1) for i, v in enumerate(listed(value, what)))


def _share(part: int, parts: int, what: str) -> None:
    if part >= parts:
        raise WorkItemError(f"{what}: part {part} of {parts} parts")


def part_of(value: object, what: str = "partition") -> SourcePartition:
    """The partition `part_json` wrote as `value`; anything else: `WorkItemError` naming
    what is wrong with it."""
    kind = value.get("kind") if isinstance(value, dict) else None
    if kind == "changes":
        v = fields(value, what, {"kind", "segments"})
        segments = []
        for i, segment in enumerate(listed(v["segments"], f"{what}.segments")):
            at = f"{what}.segments[{i}]"
            items = listed(segment, at)
            if len(items) != 3:
                raise WorkItemError(f"{at} has {len(items)} items, not (version, part, parts)")
            version = whole(items[0], f"{at} version", 1)
            part = whole(items[1], f"{at} part")
            parts = whole(items[2], f"{at} parts", 1)
            _share(part, parts, at)
            segments.append((version, part, parts))
        return ChangeSlices(tuple(segments))
    if kind == "snapshot":
        v = fields(value, what, {"kind", "version", "fragment", "offset", "limit"})
        return SnapshotSlice(
            whole(v["version"], f"{what}.version", 1),
            whole(v["fragment"], f"{what}.fragment"),
            whole(v["offset"], f"{what}.offset"),
            whole(v["limit"], f"{what}.limit"),
        )
    if kind == "net":
        v = fields(value, what, {"kind", "versions", "part", "parts"})
        part, parts = whole(v["part"], f"{what}.part"), whole(v["parts"], f"{what}.parts", 1)
        _share(part, parts, what)
        return NetSlice(_versions(v["versions"], f"{what}.versions"), part, parts)
    raise WorkItemError(f"{what} is {value!r:.80}, not a changes, snapshot or net partition")
