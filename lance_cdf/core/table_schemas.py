"""A table's columns version by version: the Arrow schema pylance gives each version, those
schemas as events carry them (annotated with Lance field ids and column tokens), and the
column history that tells which column of one version is which of another
(`lance_cdf.core.columns`). What `lance_cdf.core.rows` reads rows against; no rows are
read here.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING

import pyarrow as pa

from lance_cdf.core.columns import ColumnHistory, Commit, FieldState, annotate, origin_of
from lance_cdf.format.cache import LruCache
from lance_cdf.format.table import TableLog

if TYPE_CHECKING:
    import lance

# pylance's metadata cache (manifests, data files' footers, row-ID sequences, deletion
# vectors) of the session a TableSchemas' datasets share: with pylance's default bound,
# 1 GiB, it keeps every version checked out for as long as the process follows the table.
# Rows are read through lance.file readers (`lance_cdf.core.rows`), so the datasets are
# used for the schema and little else: the bounded session stays small, and reading takes
# the same time bounded or not (docs/benchmarks.md, "Soak: 30 minutes of publish +
# replicate").
METADATA_CACHE_BYTES = 16 << 20

# Arrow schemas by (table, fields, schema metadata): what pylance says a manifest's schema is
_SCHEMAS: LruCache[tuple[object, ...], pa.Schema] = LruCache(256)
_SCHEMAS_LOCK = threading.Lock()

# A schema one process hands another (`TableSchemas.known_schemas`): the manifest's fields
# key, its schema metadata as sorted (key, value) pairs, and the Arrow schema in Arrow IPC
KnownSchema = tuple[bytes, tuple[tuple[str, bytes], ...], bytes]


def _field_states(table: TableLog, version: int) -> tuple[FieldState, ...]:
    fields = table.manifest(version, operation=False).fields
    return tuple(FieldState(f.id, f.parent_id, f.name, f.logical_type) for f in fields)


def _commit(table: TableLog, version: int) -> Commit:
    manifest = table.manifest(version)
    return Commit(manifest.operation, manifest.restored_version)


class TableSchemas:
    """The columns of any version of a table: its Arrow schema, as events carry it, and
    which column each field is counted from an origin version."""

    def __init__(self, table: TableLog):
        self.table = table
        self._datasets: LruCache[int, lance.LanceDataset] = LruCache(4)
        self._schemas: dict[tuple[object, ...], pa.Schema] = {}  # annotated schemas
        self._histories: LruCache[int, ColumnHistory] = LruCache(8)  # per origin
        self._history_lock = threading.RLock()

    def dataset(self, version: int) -> lance.LanceDataset:
        # imported here: pylance takes seconds to import, and the processes that only plan
        # (Spark's driver-side source worker) or publish (the Kafka sink) never read rows
        import lance

        ds = self._datasets.get(version)
        if ds is None:
            try:
                if self._datasets:
                    # a checkout shares the open dataset's session (metadata and index caches)
                    ds = next(reversed(self._datasets.values())).checkout_version(version)
                else:
                    ds = lance.dataset(
                        self.table.uri,
                        version=version,
                        storage_options=self.table.storage_options,
                        metadata_cache_size_bytes=METADATA_CACHE_BYTES,
                    )
            except Exception as exc:
                if self.table.has_version(version):
                    raise
                raise self.table.missing_version_error(version) from exc
            self._datasets.put(version, ds)
        return ds

    def arrow_schema(self, version: int) -> pa.Schema:
        """The table's Arrow schema at a version, cached per distinct schema for the
        process: a fresh read_changes call does not open a pylance dataset for it."""
        manifest = self.table.manifest(version, operation=False)
        meta = tuple(sorted(manifest.proto.schema_metadata.items()))
        key = (self.table.uri, manifest.schema_key(), meta)
        with _SCHEMAS_LOCK:
            schema = _SCHEMAS.get(key)
        if schema is None:
            schema = self.dataset(version).schema
            with _SCHEMAS_LOCK:
                _SCHEMAS.put(key, schema)
        return schema

    def known_schemas(self) -> list[KnownSchema]:
        """The Arrow schemas this process has from pylance for this table, as (fields key,
        schema metadata, the schema in Arrow IPC) for `learn_schemas` in another process of
        the same query: Spark's driver-side streaming source runner then never imports
        pylance, a smaller process (docs/benchmarks.md, "Publisher footprint").
        A schema holding an extension type is left out: it is only rebuilt where the
        module defining it (pylance's bfloat16, ...) is imported, which the receiving
        process may not have done."""
        with _SCHEMAS_LOCK:
            items = [(k, s) for k, s in _SCHEMAS.items() if k[0] == self.table.uri]
        out = []
        for (_, fields, meta), schema in items:  # (table, fields, metadata): arrow_schema's
            ipc = schema.serialize().to_pybytes()
            if b"ARROW:extension:name" not in ipc:
                assert isinstance(fields, bytes) and isinstance(meta, tuple)
                out.append((fields, meta, ipc))
        return out

    def learn_schemas(self, known: list[KnownSchema]) -> None:
        """`known_schemas` of another process, into this process's cache: the versions
        whose fields and metadata they match take their Arrow schema from it instead of
        a pylance dataset (a version with any other schema still opens one)."""
        for fields, meta, ipc in known:
            schema = pa.ipc.read_schema(pa.py_buffer(ipc))
            with _SCHEMAS_LOCK:
                _SCHEMAS.put((self.table.uri, fields, meta), schema)

    def annotated(self, version: int) -> pa.Schema:
        """The table's columns at a version as events carry them: each field tagged
        with its Lance field id, blob columns as large_binary (cached per schema)."""
        manifest = self.table.manifest(version, operation=False)
        key = (b"annotated", manifest.schema_key())
        schema = self._schemas.get(key)
        if schema is None:
            schema = self._schemas[key] = annotate(self.arrow_schema(version), manifest.fields)
        return schema

    def history(self, origin: int) -> ColumnHistory:
        """Which column each field is, version by version from `origin` on
        (`lance_cdf.core.columns`): one walk per origin, extended as versions are asked for."""
        with self._history_lock:
            history = self._histories.get(origin)
            if history is None:
                # functions of the TableLog, not bound methods: a history that held this
                # object would make a reference cycle, and every fresh read_changes call's
                # reader, its manifests and decoded sequences would wait for the cyclic
                # collector (markedly slower calls: docs/benchmarks.md, "Reading rows")
                history = ColumnHistory(
                    origin,
                    functools.partial(_field_states, self.table),
                    functools.partial(_commit, self.table),
                    self.table.uri,
                )
                self._histories.put(origin, history)
            return history

    def tokens(self, version: int, origin: int) -> dict[int, str]:
        """field id -> column token of the fields of `version`, counted from `origin`."""
        with self._history_lock:  # a walk extends the history: one at a time
            return self.history(origin).tokens(version)

    def tagged(self, version: int, origin: int) -> pa.Schema:
        """The table's columns at `version` as events carry them (see `annotated`), each
        tagged with its column token counted from `origin` (`lance_cdf.core.columns`)."""
        tokens = self.tokens(version, origin)
        manifest = self.table.manifest(version, operation=False)
        key = (b"tagged", manifest.schema_key(), origin, tuple(sorted(tokens.items())))
        schema = self._schemas.get(key)
        if schema is None:
            arrow = self.arrow_schema(version)
            schema = self._schemas[key] = annotate(arrow, manifest.fields, tokens, origin)
        return schema

    def annotated_for(self, schema: pa.Schema, version: int) -> pa.Schema:
        """The columns of `version` tagged as `schema` (a range's columns) counts them."""
        origin = origin_of(schema)
        return self.annotated(version) if origin is None else self.tagged(version, origin)
