"""Whose replica it is: the topic it follows and the source table its records name,
recorded in every replica commit; records of another topic or table are refused before
anything of their batch is applied."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.errors import ForeignReplicaError
from lance_cdf.replicate.replica import (
    SOURCE_TABLE_PROPERTY,
    TOPIC_PROPERTY,
    source_table_of,
    topics_of,
)

if TYPE_CHECKING:
    from confluent_kafka import Message

# How records name their source table (`source.name`, `source.table`, `source.db`).
SOURCE_FIELDS = ("name", "table", "db")


class ReplicaIdentity:
    """The topic the replica at `target` follows and the source table ({table, uri}) it
    holds: recorded in the replica, else taken from the first records applied."""

    def __init__(self, topic: str, target: str):
        self.topic, self.target = topic, target
        self.source: dict[str, str | None] | None = None

    def adopt(self, position: dict[str, str]) -> None:
        """What the replica's recorded position says of whose it is; a replica of another
        topic is refused."""
        others = topics_of(position) - {self.topic}
        if others:
            raise ForeignReplicaError(
                f"the replica {self.target} follows topic {sorted(others)[0]!r}, not "
                f"{self.topic!r}: a replica follows one topic. Replicate {self.topic!r} into "
                "a new --target."
            )
        self.source = source_table_of(position)

    def check_sources(self, found: list[tuple[dict[str, str | None], Message]]) -> None:
        """Each distinct source table of a batch's records (with its first record) must
        be the one the replica follows; what the first records say of it becomes it.
        Compared by the table's URI and name where both sides carry them (records of an
        earlier release name the URI only; a publisher may not know the URI)."""
        for raw, m in found:
            source = _table_identity(raw)
            known = self.source or {}
            clash = [k for k, v in source.items() if v and known.get(k) and known[k] != v]
            if clash:
                raise ForeignReplicaError(
                    f"the record at partition {m.partition()} offset {m.offset()} of "
                    f"{self.topic!r} comes from source table {_describe(source)}, but the "
                    f"replica {self.target} follows {_describe(known)}: a replica "
                    "follows one table. Nothing of the batch was applied; publish each table "
                    "into a topic of its own and replicate it into its own --target."
                )
            self.source = {k: known.get(k) or source.get(k) for k in ("table", "uri")}

    def properties(self) -> dict[str, str]:
        """The properties that say whose replica it is (every commit carries them)."""
        props = {TOPIC_PROPERTY: self.topic}
        if self.source is not None:
            props[SOURCE_TABLE_PROPERTY] = json.dumps(self.source, sort_keys=True)
        return props


def _table_identity(source: dict[str, str | None]) -> dict[str, str | None]:
    """A source table as records name it (`source.name`, `.table`, `.db`) -> its dotted
    name and URI (None: not named). Records of releases before `source.db` carried the
    URI in `source.table` and no name."""
    name, table, db = (source.get(f) for f in SOURCE_FIELDS)
    if name is None and db is None:
        return {"table": None, "uri": table or None}
    return {"table": f"{name}.{table}" if name else table, "uri": db or None}


def _describe(source: dict[str, str | None]) -> str:
    return f"{source.get('table') or '(unnamed)'} at {source.get('uri') or '(no URI)'}"


def distinct_sources(
    source: pa.StructArray, good: np.ndarray
) -> list[tuple[dict[str, str | None], int]]:
    """The distinct source tables ({name, table, db}) of the good records of a decoded
    batch, each with the index (among the good ones) of its first record: no Python per
    record (a batch of one table, the rule: one comparison per column; else one Arrow
    group-by)."""
    fields = {source.type.field(i).name for i in range(source.type.num_fields)}
    n = int(good.sum())
    if n == 0:
        return []
    mask = None if n == len(good) else pa.array(good)
    columns = []
    for f in SOURCE_FIELDS:
        if f not in fields:
            columns.append(pa.nulls(n, pa.string()))
            continue
        col = source.field(f)
        columns.append((col if mask is None else col.filter(mask)).cast(pa.string()))
    first = {f: c[0].as_py() for f, c in zip(SOURCE_FIELDS, columns, strict=True)}
    if all(
        c.null_count == n
        if first[f] is None
        else c.null_count == 0 and pc.all(pc.equal(c, first[f])).as_py()
        for f, c in zip(SOURCE_FIELDS, columns, strict=True)
    ):
        return [(first, 0)]
    table = pa.Table.from_arrays([*columns, pa.array(np.arange(n))], [*SOURCE_FIELDS, "_i"])
    groups = table.group_by(list(SOURCE_FIELDS), use_threads=False).aggregate([("_i", "min")])
    return [({f: row[f] for f in SOURCE_FIELDS}, int(row["_i_min"])) for row in groups.to_pylist()]
