"""A batch of change records -> the final state of each key: the rows to upsert, the keys
to delete, and which upserted keys need no lookup.

Decoded vectorized (`BatchDecoder`: all records of a writer schema at once, straight into
Arrow) when every schema of the batch allows it, else record by record with fastavro.
Records that do not decode, or lack their row image or key, go to the dead-letter topic
(or stop the replicator), in Kafka order on both paths; records of another source table
than the replica's are refused (`ReplicaIdentity`). The last state of a key is that of
its last record in source order: commit version, then deletes before inserts within a
commit, then Kafka order.

New rows need no lookup (see `ReplicaTable.fresh_bounds`): keyed by `_source_rowid`, with
the replica's recorded bounds (`fresh`: source version, highest row ID), a key above the row
ID, or whose first record in the batch is an insert above the version, cannot be in the
replica yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.avro.decode import OK, REASONS, WIRE, BatchDecoder, Frames
from lance_cdf.errors import RegistryError, ReplicateError
from lance_cdf.replicate.consumers import DeadLetters
from lance_cdf.replicate.replica import SOURCE_ROWID
from lance_cdf.replicate.replica_identity import SOURCE_FIELDS, ReplicaIdentity, distinct_sources
from lance_cdf.replicate.writer_schemas import SchemaDecoder

if TYPE_CHECKING:
    from confluent_kafka import Message

OPS = ("c", "u", "d", "r")


class FinalStates(NamedTuple):
    """What a batch of records leaves behind: the last state of each key."""

    upserts: pa.Table | None  # the rows to write (one per key)
    deletes: pa.Table | None  # the keys to delete
    tombstones: int  # Kafka tombstones in the batch (nothing to apply)
    version: int  # the highest source commit version among the records (0: none)
    new_rows: np.ndarray | None  # per upsert row: a key that needs no lookup (module doc)


class RecordMeta(NamedTuple):
    """Per decoded record (one row each): where it stands in source and Kafka order."""

    versions: np.ndarray  # its source commit version
    is_delete: np.ndarray
    parts: np.ndarray  # its Kafka partition
    offsets: np.ndarray  # its offset, or a rank ordering its partition's records
    rowids: np.ndarray  # its source row ID
    is_insert: np.ndarray  # op "c"


class FinalStatesDecoder:
    """The final states (`FinalStates`) of batches of `topic`'s records, keyed by `key`."""

    def __init__(
        self,
        topic: str,
        key: list[str],
        schemas: SchemaDecoder,
        dead_letters: DeadLetters,
        identity: ReplicaIdentity,
    ):
        self.topic, self.key = topic, list(key)
        self.schemas, self.dead_letters, self.identity = schemas, dead_letters, identity

    def final_states(
        self,
        msgs: list[Message],
        parts: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
        fresh: tuple[int, int] | None = None,
    ) -> FinalStates:
        """(upsert rows, deleted keys, tombstones, highest source version, new-row flags)
        of a batch: the last state of each key in source commit order; the flags (one
        per upsert row, or None) mark keys that need no lookup, given the replica's
        `fresh` bounds (None: every key is looked up). `parts`, `offsets`: each
        message's partition and offset (or a rank ordering a partition's records as
        their offsets do), when known."""
        fast = self.final_states_vectorized(msgs, parts, offsets, fresh)
        return fast if fast is not None else self.final_states_fastavro(msgs, fresh)

    def final_states_vectorized(
        self,
        msgs: list[Message],
        parts: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
        fresh: tuple[int, int] | None = None,
    ) -> FinalStates | None:
        """`final_states` with avro_decode; None (nothing done, nothing sent to the
        dead-letter topic) when some schema of the batch needs the fastavro path."""
        if parts is None or offsets is None:  # (given together or not at all)
            parts = np.fromiter((m.partition() for m in msgs), np.int64, len(msgs))
            offsets = np.fromiter((m.offset() for m in msgs), np.int64, len(msgs))
        values = [m.value() for m in msgs]
        tombstones = values.count(None)
        if tombstones == len(values):
            return FinalStates(None, None, tombstones, 0, None)
        bodies = [v for v in values if v is not None]  # the records, tombstones dropped
        if tombstones:
            live = [i for i, v in enumerate(values) if v is not None]
            msgs = [msgs[i] for i in live]
            parts, offsets = parts[live], offsets[live]
        frames = Frames.of(bodies)
        schema_ids, wire = frames.confluent()
        errors: dict[int, Exception] = {}  # record index -> why it is set aside
        for i in np.flatnonzero(wire != OK):
            errors[int(i)] = ValueError(REASONS[WIRE])
        decoders = self._batch_decoders(schema_ids, wire, errors)
        if decoders is None:
            return None
        newest = self.schemas.rows[max(decoders)] if decoders else None
        tables: list[pa.Table] = []
        meta: list[RecordMeta] = []
        for sid, decoder in decoders.items():
            rows_idx = np.flatnonzero((wire == OK) & (schema_ids == sid))
            env, err = decoder.decode(frames, rows_idx)
            good, image, is_delete = self._checked(env, err, rows_idx, errors)
            table = _image_table(image.filter(pa.array(good)) if not good.all() else image, newest)
            if table is None:
                return None
            source, kept = env.field("source"), rows_idx[good]
            self.identity.check_sources(
                [(s, msgs[kept[i]]) for s, i in distinct_sources(source, good)]
            )
            tables.append(table)
            op = env.field("op").to_numpy(zero_copy_only=False)[good]
            meta.append(
                RecordMeta(
                    source.field("commit_version").to_numpy()[good],
                    is_delete[good],
                    parts[kept],
                    offsets[kept],
                    source.field("rowid").to_numpy()[good],
                    op == "c",
                )
            )
        for at in sorted(errors):  # in Kafka order: without a dead-letter topic the first stops
            self.dead_letters.send(msgs[at], errors[at])
        rows = [t for t in tables if t.num_rows]
        if not rows:
            return FinalStates(None, None, tombstones, 0, None)
        joined = pa.concat_tables(rows) if len(rows) > 1 else rows[0]
        together = RecordMeta(*(np.concatenate(x) for x in zip(*meta, strict=True)))
        return self._last_states(joined, together, tombstones, fresh)

    def _batch_decoders(
        self, schema_ids: np.ndarray, wire: np.ndarray, errors: dict[int, Exception]
    ) -> dict[int, BatchDecoder] | None:
        """The vectorized decoder of each schema id of the batch's well-framed records
        (those of an id the registry does not know into `errors`, as fastavro's path
        does); None when some schema needs the fastavro path."""
        decoders: dict[int, BatchDecoder] = {}
        for sid in np.unique(schema_ids[wire == OK]).tolist():
            try:
                decoder = self.schemas.batch_decoder(sid)
            except RegistryError:
                raise  # the registry's fault, not the record's: nothing is set aside
            except Exception as exc:  # an id the registry does not know: like fastavro's path
                for i in np.flatnonzero(schema_ids == sid):
                    errors[int(i)] = exc
                continue
            if decoder is None:
                return None
            decoders[sid] = decoder
        return decoders

    def _checked(
        self,
        env: pa.StructArray,
        err: np.ndarray,
        rows_idx: np.ndarray,
        errors: dict[int, Exception],
    ) -> tuple[np.ndarray, pa.Array, np.ndarray]:
        """(good mask, row image, is-delete) of decoded envelopes; the errors of the
        others into `errors` (the fastavro path's checks, in its order)."""
        bad = err != OK
        for i in np.flatnonzero(bad):
            errors[int(rows_idx[i])] = ValueError(REASONS[int(err[i])])
        op = env.field("op")
        known = pc.fill_null(pc.is_in(op, pa.array(OPS)), False).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(~known & ~bad):
            errors[int(rows_idx[i])] = ValueError(f"unknown op {op[int(i)].as_py()!r}")
        bad |= ~known
        is_delete = pc.fill_null(pc.equal(op, "d"), False).to_numpy(zero_copy_only=False)
        if not is_delete.any():
            image = env.field("after")
        elif is_delete.all():
            image = env.field("before")
        else:
            image = pc.if_else(pa.array(is_delete), env.field("before"), env.field("after"))
        missing = image.is_null().to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(missing & ~bad):
            errors[int(rows_idx[i])] = ValueError(
                f"op {op[int(i)].as_py()!r} without its row image"
            )
        bad |= missing
        names = {image.type.field(i).name for i in range(image.type.num_fields)}
        key_nulls = {
            c: (
                image.field(c).is_null().to_numpy(zero_copy_only=False)
                if c in names
                else np.ones(len(image), bool)
            )
            for c in self.key
            if c != SOURCE_ROWID
        }
        if key_nulls:
            any_null = np.logical_or.reduce(list(key_nulls.values()))
            for i in np.flatnonzero(any_null & ~bad):
                nulls = [c for c, null in key_nulls.items() if null[i]]
                errors[int(rows_idx[i])] = ValueError(f"key column(s) {nulls} missing or null")
            bad |= any_null
        return ~bad, image, is_delete

    def final_states_fastavro(
        self, msgs: list[Message], fresh: tuple[int, int] | None = None
    ) -> FinalStates:
        """`final_states` record by record with fastavro (any schema)."""
        images: list[dict[str, Any]] = []
        kept: list[Message] = []
        # per record: source version, delete?, partition, offset, source row ID, insert?
        meta: list[tuple[int, bool, int | None, int | None, int, bool]] = []
        schema_id: int | None = None
        tombstones = 0
        sources: dict[tuple[Any, ...], Message] = {}  # distinct source tables, first record
        for m in msgs:
            value = m.value()
            if value is None:
                tombstones += 1  # compaction marker after a delete: nothing to apply
                continue
            try:
                sid, rec = self.schemas.decode(value)
                op = rec.get("op")
                if op not in OPS:
                    raise ValueError(f"unknown op {op!r}")
                image = rec["before"] if op == "d" else rec["after"]
                if image is None:
                    raise ValueError(f"op {op!r} without its row image")
                nulls = [c for c in self.key if c != SOURCE_ROWID and image.get(c) is None]
                if nulls:
                    raise ValueError(f"key column(s) {nulls} missing or null")
                source = rec["source"]
                sources.setdefault(tuple(source.get(f) for f in SOURCE_FIELDS), m)
                version, rowid = source["commit_version"], source["rowid"]
                meta.append((version, op == "d", m.partition(), m.offset(), rowid, op == "c"))
            except RegistryError:
                raise  # the registry's fault, not the record's: never a dead letter
            except Exception as exc:  # a record that does not decode with its schema
                self.dead_letters.send(m, exc)
                continue
            images.append(image)
            kept.append(m)
            schema_id = sid if schema_id is None else max(schema_id, sid)
        self.identity.check_sources(
            [(dict(zip(SOURCE_FIELDS, s, strict=True)), m) for s, m in sources.items()]
        )
        if not images or schema_id is None:  # (no image: no schema id either)
            return FinalStates(None, None, tombstones, 0, None)
        rows, bad = self._to_arrow(images, self.schemas.rows[schema_id], kept)
        if bad:
            meta = [x for i, x in enumerate(meta) if i not in bad]
            if not meta:
                return FinalStates(None, None, tombstones, 0, None)
        versions, is_delete, parts, offsets, rowids, is_insert = np.array(meta, np.int64).T
        columns = (versions, is_delete.astype(bool), parts, offsets, rowids, is_insert.astype(bool))
        return self._last_states(rows, RecordMeta(*columns), tombstones, fresh)

    def _last_states(
        self, rows: pa.Table, meta: RecordMeta, tombstones: int, fresh: tuple[int, int] | None
    ) -> FinalStates:
        """The last state of each key of `rows` (one row per record, `meta` its place in
        source and Kafka order), and which of the upserted keys need no lookup."""
        if self.key == [SOURCE_ROWID]:
            rows = rows.append_column(
                pa.field(SOURCE_ROWID, pa.int64(), False), pa.array(meta.rowids)
            )
        missing = [c for c in self.key if c not in rows.column_names]
        if missing:
            raise ReplicateError(
                f"key column(s) {missing} are not in the records of {self.topic!r} "
                f"(columns: {rows.column_names}); pick --key from those columns"
            )
        is_delete, is_insert, versions = meta.is_delete, meta.is_insert, meta.versions
        # commit order; within a commit deletes first (a key deleted and re-inserted by
        # one commit under another row ID ends inserted), then Kafka order
        order = np.lexsort((meta.offsets, meta.parts, ~is_delete, versions))
        if (order != np.arange(order.size)).any():
            rows = rows.take(pa.array(order))
            is_delete, is_insert, versions = is_delete[order], is_insert[order], versions[order]
        groups = (
            rows.select(self.key)
            .append_column("_i", pa.array(np.arange(rows.num_rows)))
            .group_by(self.key, use_threads=False)
            .aggregate([("_i", "max"), ("_i", "min")])
        )
        last, first = groups["_i_max"].to_numpy(), groups["_i_min"].to_numpy()
        by_last = np.argsort(last)
        last, first = last[by_last], first[by_last]
        final = rows if last.size == rows.num_rows else rows.take(pa.array(last))
        final_delete = is_delete[last]
        upserts = final.filter(pa.array(~final_delete))
        deletes = final.filter(pa.array(final_delete)).select(self.key)
        new_rows = None
        if self.key == [SOURCE_ROWID] and fresh is not None:
            held_version, held_rowid = fresh
            # above every row ID the replica ever held, or first inserted here above the
            # source version the replica held (see the module doc)
            key = rows[SOURCE_ROWID].to_numpy()
            new = (key[last] > held_rowid) | (is_insert[first] & (versions[first] > held_version))
            new_rows = new[~final_delete]
        return FinalStates(upserts, deletes, tombstones, int(versions.max()), new_rows)

    def _to_arrow(
        self, images: list[dict[str, Any]], schema: pa.Schema, msgs: list[Message]
    ) -> tuple[pa.Table, set[int]]:
        """The images as one Arrow table in the newest writer schema of the batch; if
        that fails, the records that do not fit are found one by one and set aside."""
        try:
            return pa.Table.from_pylist(images, schema=schema), set()
        except (pa.ArrowException, TypeError, ValueError):
            pass
        bad: set[int] = set()
        for i, (image, m) in enumerate(zip(images, msgs, strict=True)):
            try:
                pa.Table.from_pylist([image], schema=schema)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                bad.add(i)
                self.dead_letters.send(m, exc)
        good = [image for i, image in enumerate(images) if i not in bad]
        return pa.Table.from_pylist(good, schema=schema), bad


def _image_table(image: pa.StructArray, schema: pa.Schema | None) -> pa.Table | None:
    """Row images (a struct array) as a table in `schema`, the newest writer schema of the
    batch (an older writer schema's rows: missing nullable columns null, others cast); None
    when that is not clearly possible."""
    fields = image.type
    table = pa.Table.from_arrays(
        image.flatten(), names=[fields.field(i).name for i in range(fields.num_fields)]
    )
    if schema is None or table.schema == schema:
        return table
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            if not f.nullable:
                return None
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        col = table[f.name]
        try:
            columns.append(col if col.type == f.type else col.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        if not f.nullable and columns[-1].null_count:
            return None
    return pa.Table.from_arrays(columns, schema=schema)
