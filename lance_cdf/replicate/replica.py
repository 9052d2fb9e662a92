"""The replica side of replication: apply one batch of final row states to a Lance table.

A batch is applied as at most two Lance commits: a `merge_insert(key)
.when_matched_delete()` for the deleted keys, then a `merge_insert(key)
.when_matched_update_all().when_not_matched_insert_all()` for the upserted rows.
The last commit of the batch carries the Kafka position it reached in its
transaction properties (`lance-cdf.offsets`): the data and the position it
describes land in the same atomic commit, which is what makes replication
exactly once in effect. Both steps are idempotent, so a batch replayed after a
crash between them converges to the same table.
"""

from __future__ import annotations

import json
import os

import lance
import pyarrow as pa

from lance_cdf.errors import LanceCdfError

OFFSETS_PROPERTY = "lance-cdf.offsets"
SOURCE_VERSION_PROPERTY = "lance-cdf.source-version"
SOURCE_ROWID = "_source_rowid"
# Fault injection for the crash tests: the process exits hard at the named point.
CRASH_ENV = "LANCE_CDF_REPLICATOR_CRASH_AT"


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os._exit(137)


def source_version_of(position: dict[str, str]) -> int | None:
    """The source version a recorded position reached (None: not recorded)."""
    value = position.get(SOURCE_VERSION_PROPERTY)
    return int(value) if value is not None else None


def offsets_of(position: dict[str, str], topic: str) -> dict[int, int]:
    offsets = json.loads(position.get(OFFSETS_PROPERTY, "{}")).get(topic, {})
    return {int(p): int(o) for p, o in offsets.items()}


class ReplicaTable:
    """The target Lance table of a replicator, keyed by `key`."""

    def __init__(self, uri: str, key: list[str], storage_options: dict | None = None):
        self.uri, self.key, self.storage_options = uri, list(key), storage_options

    def open(self) -> lance.LanceDataset | None:
        try:
            return lance.dataset(self.uri, storage_options=self.storage_options)
        except (ValueError, FileNotFoundError, OSError) as exc:
            if "not found" in str(exc).lower() or isinstance(exc, FileNotFoundError):
                return None
            raise LanceCdfError(f"cannot open the replica table {self.uri}: {exc}") from exc

    def position(self) -> dict[str, str]:
        """The transaction properties of the newest replica commit that recorded a
        position ({} for a new replica: Kafka's committed offsets then decide)."""
        ds = self.open()
        if ds is None:
            return {}
        for version in range(ds.version, 0, -1):
            try:
                tx = ds.read_transaction(version)
            except Exception:
                break  # older versions cleaned up: fall back to Kafka's offsets
            props = (tx.transaction_properties or {}) if tx is not None else {}
            if OFFSETS_PROPERTY in props:
                return dict(props)
        return {}

    def applied_offsets(self, topic: str) -> dict[int, int]:
        """Next offset per partition of `topic` the replica holds."""
        return offsets_of(self.position(), topic)

    def source_version(self) -> int | None:
        """Highest source commit version whose changes the replica holds."""
        return source_version_of(self.position())

    def apply(self, upserts: pa.Table | None, deletes: pa.Table | None, props: dict) -> bool:
        """Delete the keys in `deletes`, then upsert `upserts`; the last commit carries
        `props`. A batch with no rows to change (tombstones, dead letters) still commits
        its position (an empty delete). False when nothing could be written (no table
        yet and no rows to create it from): the caller then relies on Kafka's committed
        offsets, which can only replay no-ops."""
        has_upserts = upserts is not None and upserts.num_rows > 0
        has_deletes = deletes is not None and deletes.num_rows > 0
        ds = self.open()
        if ds is None:
            if not has_upserts:
                return False  # only deletes of rows the replica never had
            crash_point("before-lance-commit")
            lance.write_dataset(
                upserts, self.uri, enable_stable_row_ids=True, transaction_properties=props,
                storage_options=self.storage_options,
            )  # fmt: skip
            return True
        if has_upserts:
            ds = self._add_new_columns(ds, upserts.schema)
        if has_deletes or not has_upserts:  # deletes, or a position-only commit
            key_schema = pa.schema([ds.schema.field(c) for c in self.key])
            keys = (
                deletes.select(self.key).cast(key_schema)
                if has_deletes
                else key_schema.empty_table()
            )
            crash_point("before-lance-commit")
            tx, _ = ds.merge_insert(self.key).when_matched_delete().execute_uncommitted(keys)
            if not has_upserts:
                tx.transaction_properties = props
            ds = lance.LanceDataset.commit(
                self.uri, tx, read_version=ds.version, storage_options=self.storage_options
            )
            crash_point("between-commits")
        if has_upserts:
            data = self._conform(upserts, ds.schema)
            crash_point("before-lance-commit")
            builder = ds.merge_insert(self.key).when_matched_update_all()
            tx, _ = builder.when_not_matched_insert_all().execute_uncommitted(data)
            tx.transaction_properties = props
            lance.LanceDataset.commit(
                self.uri, tx, read_version=ds.version, storage_options=self.storage_options
            )
        return True

    def _add_new_columns(self, ds: lance.LanceDataset, schema: pa.Schema) -> lance.LanceDataset:
        missing = [f.with_nullable(True) for f in schema if f.name not in ds.schema.names]
        if not missing:
            return ds
        ds.add_columns(missing)  # all-null columns: rows written before had no value
        return self.open()

    @staticmethod
    def _conform(data: pa.Table, target: pa.Schema) -> pa.Table:
        """`data` with the replica's column order and types; columns the source no
        longer sends are null."""
        columns = []
        for f in target:
            if f.name in data.column_names:
                col = data[f.name]
                try:
                    columns.append(col.cast(f.type) if col.type != f.type else col)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise LanceCdfError(
                        f"column {f.name!r} arrives as {col.type} but the replica has {f.type}: "
                        "the source retyped a column; rebuild the replica from a snapshot "
                        f"({exc})"
                    ) from exc
            else:
                columns.append(pa.nulls(data.num_rows, f.type))
        return pa.Table.from_arrays(columns, schema=target)
