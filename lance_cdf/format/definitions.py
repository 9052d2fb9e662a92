"""A table's definition beyond its rows: its secondary indexes (what is needed to build each
again), its `update_config` keys, and its schema and field metadata (where LanceDB keeps
embedding settings). `publish` sends it on the transaction topic whenever it changes, in
order with the data; the replicator makes its replica's definition equal to it.

Index definitions are compared by what a rebuild needs (name, type, columns, parameters):
an optimize or merge of an index changes its files, not its definition, and is not sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

# the JSON type of an index's build parameters
Params = dict[str, object]


@dataclass(frozen=True)
class IndexDefinition:
    """One index as `LanceDataset.create_index` / `create_scalar_index` builds it again.

    `index_type` is the build type pylance takes (`BTREE`, `BITMAP`, `LABEL_LIST`,
    `INVERTED`, `NGRAM`, `ZONEMAP`, `IVF_PQ`, `IVF_FLAT`, `IVF_SQ`, `IVF_HNSW_SQ`,
    `IVF_HNSW_PQ`, ...); `params` is a canonical JSON object of the keyword arguments the
    build takes (vector: `metric`, `num_partitions`, `num_sub_vectors`, `num_bits`, `m`,
    `ef_construction`; inverted: the tokenizer settings; scalar: usually none).
    """

    name: str
    index_type: str
    columns: tuple[str, ...]
    params: str = "{}"

    @staticmethod
    def of(name: str, index_type: str, columns: tuple[str, ...], params: Params) -> IndexDefinition:
        return IndexDefinition(name, index_type, columns, canonical(params))

    def parameters(self) -> Params:
        loaded = json.loads(self.params)
        assert isinstance(loaded, dict)
        return loaded


@dataclass(frozen=True)
class TableDefinition:
    """A table's definition at one version: indexes sorted by name, the other parts as
    sorted (key, value) pairs. Field metadata is keyed by the field's dotted path."""

    indexes: tuple[IndexDefinition, ...] = ()
    config: tuple[tuple[str, str], ...] = ()
    schema_metadata: tuple[tuple[str, bytes], ...] = ()
    field_metadata: tuple[tuple[str, tuple[tuple[str, bytes], ...]], ...] = field(default=())

    @staticmethod
    def of(
        indexes: list[IndexDefinition],
        config: dict[str, str],
        schema_metadata: dict[str, bytes],
        field_metadata: dict[str, dict[str, bytes]],
    ) -> TableDefinition:
        return TableDefinition(
            tuple(sorted(indexes, key=lambda i: i.name)),
            tuple(sorted(config.items())),
            tuple(sorted(schema_metadata.items())),
            tuple(sorted((k, tuple(sorted(v.items()))) for k, v in field_metadata.items() if v)),
        )

    def index(self, name: str) -> IndexDefinition | None:
        return next((i for i in self.indexes if i.name == name), None)


def canonical(params: Params) -> str:
    """The one JSON text of a parameter object (sorted keys, no spaces)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))
