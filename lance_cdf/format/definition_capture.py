"""A table's definition (format/definitions.py) read from pylance: each secondary index as
the build that makes it again, the `update_config` keys, the schema and field metadata.

pylance describes an index in two places. `describe_indices()` reads the manifest's index
section: the index type ("BTree", "Bitmap", "LabelList", "Inverted", "NGram", "ZoneMap",
"IVF_PQ", "IVF_HNSW_SQ", ...), the columns, and the details the commit recorded (an
inverted index's tokenizer settings; a vector index's metric, its PQ sub-vectors and bits,
its HNSW graph settings). A vector index's partition count is only in
`ds.stats.index_stats(name)`, which opens the index file (and returns the centroids): it
is asked for a vector index only, and once per set of index segments (`DefinitionCapture`
keeps what it captured by the segments' UUIDs). An optimize of an index gives it new
segments, not a new definition.

The replicator's own key index (a BTREE named `_source_rowid_idx` on `_source_rowid`, on
a replica keyed by the source's row IDs) is not part of the definition: a replica that is
itself published must not pass it on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lance_cdf.format.definitions import IndexDefinition, Params, TableDefinition

if TYPE_CHECKING:
    import lance
    import pyarrow as pa

log = logging.getLogger(__name__)

# the replicator's key index on a replica keyed by the source's row IDs (the replicator's
# SOURCE_ROWID column with pylance's default index name; test_definition_capture
# checks it against the replicator's constant)
KEY_COLUMN = "_source_rowid"
KEY_INDEX = f"{KEY_COLUMN}_idx"

# pylance's describe_indices() type names -> the build type create_index takes
_SCALAR_TYPES = {
    "BTree": "BTREE",
    "Bitmap": "BITMAP",
    "LabelList": "LABEL_LIST",
    "Inverted": "INVERTED",
    "NGram": "NGRAM",
    "ZoneMap": "ZONEMAP",
    "BloomFilter": "BLOOMFILTER",
    "RTree": "RTREE",
}
# field metadata that is the storage's, not the user's (Lance sets it from the column's
# encoding; the replica's column gets it from its own schema)
_STORAGE_KEYS = (b"lance-encoding:", b"lance:")

# an index's segments as the manifest lists them: (name, type, columns, uuids)
IndexKey = tuple[str, str, tuple[str, ...], frozenset[str]]


@dataclass
class DefinitionCapture:
    """Captures definitions, keeping each index's definition by its segments: a table
    whose indexes did not change costs one read of the manifest's index section."""

    known: dict[IndexKey, IndexDefinition] = field(default_factory=dict)

    def capture(self, ds: lance.LanceDataset) -> TableDefinition:
        return self.capture_with_origins(ds)[0]

    def capture_with_origins(
        self, ds: lance.LanceDataset
    ) -> tuple[TableDefinition, dict[str, int]]:
        """The definition, and each index's origin: the table version its oldest segment
        was built from (an optimize keeps it; a build or replace moves it to the version
        it read). An optimize may train a vector index again with another partition
        count (pylance sizes partitions by rows): `settled` keeps the one it was built
        with."""
        described = [d for d in ds.describe_indices() if not is_key_index(d)]
        keys = [index_key(d) for d in described]
        for key, d in zip(keys, described, strict=True):
            if key not in self.known:
                self.known[key] = index_definition(ds, d)
        wanted = set(keys)  # forget segments that are gone (bounded by the table's)
        for old in [k for k in self.known if k not in wanted]:
            del self.known[old]
        origins = {
            str(d.name): min(int(s.dataset_version_at_last_update) for s in d.segments)
            for d in described
            if d.segments
        }
        definition = TableDefinition.of(
            [self.known[k] for k in keys],
            {str(k): str(v) for k, v in ds.config().items()},
            schema_metadata(ds.schema),
            field_metadata(ds.schema),
        )
        return definition, origins


def capture(ds: lance.LanceDataset) -> TableDefinition:
    """The definition of `ds` at its version (nothing cached)."""
    return DefinitionCapture().capture(ds)


def settled(
    now: TableDefinition, origins: dict[str, int], known: TableDefinition, known_at: int
) -> TableDefinition:
    """`now` with each index that was not built again after version `known_at` (its
    origin is before it) as `known` (the definition at `known_at`) describes it: an
    optimize's new segments leave the definition as it was."""
    indexes = []
    for index in now.indexes:
        was = known.index(index.name)
        same = was is not None and (was.index_type, was.columns) == (
            index.index_type,
            index.columns,
        )
        kept = same and origins.get(index.name, known_at) < known_at
        indexes.append(was if kept and was is not None else index)
    return dataclasses.replace(now, indexes=tuple(indexes))


def is_key_index(d: Any) -> bool:
    """The replicator's key index (a BTREE on `_source_rowid` with pylance's default name)."""
    return bool(
        d.name == KEY_INDEX and list(d.field_names) == [KEY_COLUMN] and d.index_type == "BTree"
    )


def index_key(d: Any) -> IndexKey:
    return (
        str(d.name),
        str(d.index_type),
        tuple(str(c) for c in d.field_names),
        frozenset(str(s.uuid) for s in d.segments),
    )


def build_type(d: Any) -> str:
    """The build type of index `d` (an IndexDescription) as the user named it to pylance or
    LanceDB (`BTREE`, `LABEL_LIST`, `IVF_HNSW_SQ`, ...): describe_indices names scalar
    types in its own spelling (`BTree`, `LabelList`)."""
    kind = str(d.index_type)
    return _SCALAR_TYPES.get(kind, kind.upper())


def index_definition(ds: lance.LanceDataset, d: Any) -> IndexDefinition:
    """One index's build type and build keyword arguments (`d`: its IndexDescription)."""
    name, kind = str(d.name), str(d.index_type)
    columns = tuple(str(c) for c in d.field_names)
    details: dict[str, Any] = dict(d.details or {})
    if kind in _SCALAR_TYPES:
        params: Params = {}
        if kind == "Inverted":
            params = inverted_params(details)
        return IndexDefinition.of(name, _SCALAR_TYPES[kind], columns, params)
    if kind.startswith("IVF_"):
        return IndexDefinition.of(name, kind, columns, vector_params(ds, name, details))
    log.warning("index %s: type %r is not known to lance-cdf; sent with no parameters", name, kind)
    return IndexDefinition.of(name, kind.upper(), columns, {})


def inverted_params(details: dict[str, Any]) -> Params:
    """The tokenizer settings as create_scalar_index takes them: unset ones left out, and
    `document_granularity` only when not the default "row" (the build takes it as a
    `lance.query.DocumentGranularity`, here its string value)."""
    params = {k: v for k, v in details.items() if v is not None}
    if params.get("document_granularity") == "row":
        del params["document_granularity"]
    return params


def vector_params(ds: lance.LanceDataset, name: str, details: dict[str, Any]) -> Params:
    """metric, num_partitions, and the sub-index's settings (PQ: num_sub_vectors and
    num_bits; SQ: num_bits; HNSW: m and ef_construction)."""
    params: Params = {}
    if details.get("metric_type"):
        params["metric"] = str(details["metric_type"]).lower()
    compression = details.get("compression") or {}
    if compression.get("type") == "pq":
        params["num_sub_vectors"] = int(compression["num_sub_vectors"])
        params["num_bits"] = int(compression["num_bits"])
    hnsw = details.get("hnsw") or {}
    if hnsw:
        params["m"] = int(hnsw["max_connections"])
        params["ef_construction"] = int(hnsw["construction_ef"])
    stats = ds.stats.index_stats(name)
    partitions = {
        int(i["num_partitions"]) for i in stats.get("indices", []) if "num_partitions" in i
    }
    if partitions:
        params["num_partitions"] = max(partitions)
    return params


def schema_metadata(schema: pa.Schema) -> dict[str, bytes]:
    return {k.decode(): bytes(v) for k, v in (schema.metadata or {}).items()}


def field_metadata(schema: pa.Schema) -> dict[str, dict[str, bytes]]:
    """Each field's user metadata by its dotted path (struct children included)."""
    return {path: meta for path, meta in _fields(schema, "") if meta}


def _fields(fields: Any, prefix: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    import pyarrow as pa

    for f in fields:
        path = prefix + f.name
        meta = {
            k.decode(): bytes(v)
            for k, v in (f.metadata or {}).items()
            if not k.startswith(_STORAGE_KEYS)
        }
        yield path, meta
        if pa.types.is_struct(f.type):
            yield from _fields(f.type, path + ".")
