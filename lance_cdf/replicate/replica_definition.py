"""A replica's definition made equal to the source's (`TableDefinition`): its secondary
indexes built, rebuilt or dropped, its `update_config` keys and its schema and field
metadata set, each as pylance 14 does it on the source.

An index is built from its definition on the replica's own rows (a vector index is trained
on them). What the replicator built from a definition is recorded in the replica's config
(`lance-cdf.indexes`: name -> type, columns, parameters), so a later definition is
compared with what was built rather than guessed back from the index files; config keys
under `lance-cdf.` (the replicator's own) and `lance.auto_cleanup.` (the replica's version
retention) are neither copied from the source nor removed. Never dropped: the
replicator's key index and the replica-only indexes (`--index`), named in `protected`.

A definition that cannot be built (an unknown type, a column the replica lacks, too few
rows to train) is returned as an `Unbuilt` (one line: the index, the cause, what to do);
the rest is built. Every change is its own Lance commit without a recorded position, so
`ReplicaTable.position()` steps over it.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass, field

import lance

from lance_cdf.format.definitions import IndexDefinition, TableDefinition
from lance_cdf.replicate.served_btree import build_btree

log = logging.getLogger("lance_cdf.replicate")

OWN_PREFIX = "lance-cdf."
# config keys that stay the replica's own: auto cleanup would remove the replica versions
# that hold its recorded position (the newest commit carrying one may be older than the
# index and settings commits after it)
KEPT_PREFIXES = (OWN_PREFIX, "lance.auto_cleanup.")
BUILT_CONFIG = "lance-cdf.indexes"  # name -> [type, columns, params] built from a definition
# the build types `create_scalar_index` takes; vector types start with IVF_
SCALAR_TYPES = frozenset(
    {"BTREE", "BITMAP", "LABEL_LIST", "INVERTED", "FTS", "NGRAM", "ZONEMAP", "BLOOMFILTER"}
)


@dataclass(frozen=True)
class Unbuilt:
    """A definition the replica could not build (retried at later upkeeps)."""

    name: str
    index_type: str
    columns: tuple[str, ...]
    cause: str
    remedy: str

    def line(self) -> str:
        cols = ", ".join(self.columns)
        return (
            f"index {self.name!r} ({self.index_type} on {cols}) not built on the replica: "
            f"{self.cause}; {self.remedy}"
        )


@dataclass
class Reconciled:
    """What one reconcile changed (index names) and what it could not build."""

    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    unbuilt: list[Unbuilt] = field(default_factory=list)
    settings_changed: int = 0  # commits that set config or metadata

    def changed(self) -> bool:
        return bool(self.created or self.replaced or self.dropped or self.settings_changed)


def _record(d: IndexDefinition) -> list[object]:
    return [d.index_type, list(d.columns), d.params]


def built_indexes(ds: lance.LanceDataset) -> dict[str, list[object]]:
    """What the replicator recorded as built from a definition, by index name."""
    value = ds.config().get(BUILT_CONFIG)
    return {} if value is None else dict(json.loads(value))


def is_vector(index_type: str) -> bool:
    return index_type.upper().startswith("IVF_")


def build(ds: lance.LanceDataset, d: IndexDefinition) -> Unbuilt | None:
    """Build (or replace) index `d` on `ds`; None when built, else why not."""
    kind = d.index_type.upper()
    missing = [c for c in d.columns if c not in ds.schema.names]
    if not d.columns or missing:
        return Unbuilt(
            d.name,
            d.index_type,
            d.columns,
            f"the replica has no column {', '.join(missing) or '(none named)'}",
            "it is built once the column arrives (or drop the index on the source)",
        )
    if not is_vector(kind) and kind not in SCALAR_TYPES:
        return Unbuilt(
            d.name,
            d.index_type,
            d.columns,
            f"index type {d.index_type!r} is not one this replicator builds",
            "upgrade lance-cdf on the replicator, or replicate with --no-indexes",
        )
    params = d.parameters()
    if "document_granularity" in params:  # (the build takes it as the enum, not its value)
        from lance.query import DocumentGranularity

        params["document_granularity"] = DocumentGranularity(params["document_granularity"])
    try:
        if is_vector(kind):
            column: str | list[str] = d.columns[0] if len(d.columns) == 1 else list(d.columns)
            ds.create_index(column, kind, name=d.name, replace=True, **params)  # type: ignore[arg-type]
        elif not (kind == "BTREE" and not params and build_btree(ds, d.columns[0], d.name)):
            ds.create_scalar_index(d.columns[0], kind, name=d.name, replace=True, **params)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - any refusal is named, the rest goes on
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        rows = ds.count_rows()
        remedy = (
            f"the replica has {rows} rows; it is tried again at every upkeep (a vector index "
            "needs enough rows to train: fewer num_partitions on the source, or wait)"
            if is_vector(kind)
            else "it is tried again at every upkeep; fix the index on the source, or "
            "replicate with --no-indexes"
        )
        return Unbuilt(d.name, d.index_type, d.columns, f"{type(exc).__name__}: {cause}", remedy)
    return _untrained(ds, d) if is_vector(kind) else None


def _untrained(ds: lance.LanceDataset, d: IndexDefinition) -> Unbuilt | None:
    """pylance 14 answers a vector index it cannot train (too few rows for its
    partitions) with an empty index that covers no row, not an error: dropped again and
    named, so it is tried again rather than left covering nothing."""
    rows = ds.count_rows()
    found = next((i for i in ds.describe_indices() if i.name == d.name), None)
    if found is None or found.num_rows_indexed > 0 or rows == 0:
        return None
    ds.drop_index(d.name)
    return Unbuilt(
        d.name,
        d.index_type,
        d.columns,
        f"pylance trained nothing on the replica's {rows} rows (too few for its parameters)",
        "it is tried again at later upkeeps as rows arrive (or define it on the source "
        "with fewer num_partitions)",
    )


def reconcile_indexes(
    ds: lance.LanceDataset,
    wanted: tuple[IndexDefinition, ...],
    protected: set[str],
    drop: bool = True,
) -> Reconciled:
    """Build each of `wanted` that is missing or was built from another definition;
    (`drop`) drop indexes built from a definition that `wanted` no longer has, never one
    named in `protected`. The record of what was built is updated at the end."""
    out = Reconciled()
    built = built_indexes(ds)
    present = {i["name"] for i in ds.list_indices()}
    record = dict(built)
    for d in wanted:
        if d.name in present and built.get(d.name) == _record(d):
            continue
        failed = build(ds, d)
        if failed is not None:
            out.unbuilt.append(failed)
            continue
        (out.replaced if d.name in present else out.created).append(d.name)
        record[d.name] = _record(d)
    names = {d.name for d in wanted}
    for name in sorted(built):
        if name in names or name in protected or not drop:
            continue
        if name in present:
            ds.drop_index(name)
            out.dropped.append(name)
        record.pop(name, None)
    if record != built:
        ds.update_config({BUILT_CONFIG: json.dumps(record, sort_keys=True)})
    return out


def reconcile_settings(ds: lance.LanceDataset, definition: TableDefinition) -> int:
    """`update_config` keys (the replicator's own `lance-cdf.` keys kept), schema metadata
    and field metadata made equal to `definition`'s; returns the commits made."""
    commits = 0
    have = {k: v for k, v in ds.config().items() if not k.startswith(KEPT_PREFIXES)}
    want = {k: v for k, v in definition.config if not k.startswith(KEPT_PREFIXES)}
    gone = sorted(set(have) - set(want))
    if gone:
        ds.delete_config_keys(gone)
        commits += 1
    changed = {k: v for k, v in want.items() if have.get(k) != v}
    if changed:
        ds.update_config(dict(changed))
        commits += 1
    schema_meta = {_text(k): _text(v) for k, v in (ds.schema.metadata or {}).items()}
    want_meta = {k: _text(v) for k, v in definition.schema_metadata}
    if schema_meta != want_meta:
        ds.update_schema_metadata(dict(want_meta), replace=True)
        commits += 1
    fields = dict(definition.field_metadata)
    updates: dict[str, dict[str, str | None]] = {}
    for path in _field_paths(ds):
        have_f = _field_meta(ds, path)
        want_f = {k: _text(v) for k, v in fields.get(path, ())}
        if have_f != want_f:
            updates[path] = dict(want_f)
    for path in sorted(set(fields) - set(_field_paths(ds))):
        log.warning("field metadata of %r not set: the replica has no such field", path)
    if updates:
        ds.update_field_metadata(updates, replace=True)
        commits += 1
    return commits


def _text(v: str | bytes) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _field_paths(ds: lance.LanceDataset) -> list[str]:
    """The dotted path of every top-level and struct-child field of the replica."""
    import pyarrow as pa

    out: list[str] = []

    def walk(f: pa.Field, prefix: str) -> None:
        path = f"{prefix}{f.name}"
        out.append(path)
        if pa.types.is_struct(f.type):
            for child in f.type:
                walk(child, f"{path}.")

    for f in ds.schema:
        walk(f, "")
    return out


def _field_meta(ds: lance.LanceDataset, path: str) -> dict[str, str]:
    parts = path.split(".")
    f = ds.schema.field(parts[0])
    for name in parts[1:]:
        f = f.type.field(name)
    return {_text(k): _text(v) for k, v in (f.metadata or {}).items()}


def reconcile(
    ds: lance.LanceDataset,
    definition: TableDefinition | None,
    protected: set[str],
    extra: tuple[IndexDefinition, ...] = (),
    indexes: bool = True,
) -> Reconciled:
    """The replica `ds` made equal to `definition` (None: none received; only `extra`
    is built): indexes (unless `indexes` is False: then only the replica-only `extra`),
    config and metadata. `protected`: index names never dropped (the key index); the
    names of `extra` are added to it. `ds` is moved to each commit made."""
    keep = protected | {d.name for d in extra}
    source = definition.indexes if definition is not None and indexes else ()
    wanted = tuple(d for d in source if d.name not in keep) + extra
    out = reconcile_indexes(ds, wanted, keep, drop=indexes)
    if definition is not None:
        out.settings_changed = reconcile_settings(ds, definition)
    for u in out.unbuilt:
        log.warning("%s", u.line())
    return out


def definition_json(d: TableDefinition) -> str:
    """`d` as one JSON text (metadata values base64): what a replica commit records."""
    return json.dumps(
        {
            "indexes": [[i.name, i.index_type, list(i.columns), i.params] for i in d.indexes],
            "config": dict(d.config),
            "schema_metadata": {k: _b64(v) for k, v in d.schema_metadata},
            "field_metadata": {p: {k: _b64(v) for k, v in m} for p, m in d.field_metadata},
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def definition_of_json(text: str) -> TableDefinition:
    """The inverse of `definition_json`."""
    raw = json.loads(text)
    return TableDefinition.of(
        [IndexDefinition(n, t, tuple(c), p) for n, t, c, p in raw["indexes"]],
        raw["config"],
        {k: base64.b64decode(v) for k, v in raw["schema_metadata"].items()},
        {
            p: {k: base64.b64decode(v) for k, v in m.items()}
            for p, m in raw["field_metadata"].items()
        },
    )


def _b64(v: bytes) -> str:
    return base64.b64encode(v).decode("ascii")
