"""How change records name a table and its columns in Avro: `prefix.table` (Debezium's
`<topic.prefix>.<table>`), valid Avro names from any column or table name, unique record
names within a schema. Without pyarrow: Spark's commit process names a table's transaction
records with it (`KafkaStreamWriter.commit`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lance_cdf.errors import LanceCdfError

DEFAULT_PREFIX = "lancecdf"
# Record names the generated schemas use themselves (a struct column must not take them).
RESERVED = ("Envelope", "Value", "Key")


def avro_name(text: str) -> str:
    """A valid Avro name from any column or table name."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return clean if clean and not clean[0].isdigit() else f"_{clean}"


_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class TableName:
    """How records name a table: `prefix.table` (Debezium's `<topic.prefix>.<table>`),
    and the table's URI (`source.db`)."""

    prefix: str
    table: str
    uri: str = ""

    @property
    def namespace(self) -> str:
        """The Avro namespace of the table's records (`<prefix>.<table>`)."""
        return f"{self.prefix}.{self.table}"

    @classmethod
    def of(cls, name: str | TableName | None, uri: str = "") -> TableName:
        """`name` given (`--table-name` / the sink's `table.name`): a dotted Avro name
        (`shop.items`: prefix `shop`, table `items`; a bare `items`: prefix `lancecdf`).
        No name: derived from the URI's last path component (`.../items.lance` → `items`).
        A `name` that is a path or URI (older callers) counts as the URI."""
        if isinstance(name, TableName):
            return name
        if name and ("/" in name or ":" in name or "\\" in name):
            uri, name = uri or name, None
        if not name:
            base = re.split(r"[/\\]", uri.rstrip("/\\"))[-1] if uri else ""
            base = base[: -len(".lance")] if base.endswith(".lance") else base
            return cls(DEFAULT_PREFIX, avro_name(base or "table"), uri)
        parts = name.split(".")
        bad = [p for p in parts if not _AVRO_NAME.fullmatch(p)]
        if bad:
            raise LanceCdfError(
                f"table name {name!r} is not a dotted Avro name (bad part(s): {bad}); use "
                "letters, digits and _ in each dot-separated part, not starting with a digit, "
                "e.g. --table-name shop.items"
            )
        prefix = ".".join(parts[:-1]) or DEFAULT_PREFIX
        return cls(prefix, parts[-1], uri)


class Namer:
    """Unique record names within one schema (Avro names are global to it)."""

    def __init__(self) -> None:
        self.used: set[str] = set(RESERVED)

    def __call__(self, base: str) -> str:
        name, i = avro_name(base), 1
        while name in self.used:
            i += 1
            name = f"{avro_name(base)}_{i}"
        self.used.add(name)
        return name
