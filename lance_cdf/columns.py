"""Columns across versions: which field of one version holds a range's column, and
shaping a version's values to the range's schema."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.errors import LanceCdfError

# -- columns across versions ------------------------------------------------------
#
# Lance gives every field (nested ones too) a stable id that survives renames. The
# schemas lance-cdf works with carry each field's id in its metadata under FIELD_ID
# ("7" or, for a name dropped and later re-added, "9,7": the ids holding that name,
# newest first); events go out without these keys (`strip`).
FIELD_ID = b"lance-cdf:field-id"
BLOB = b"lance-cdf:blob"  # a blob column: its values are read with take_blobs
_PRIVATE = (FIELD_ID, BLOB)


class LanceField(Protocol):
    """A field of a Lance manifest's schema (`lance_cdf.format`'s `file_pb2.Field`), as
    far as columns reads it."""

    @property
    def id(self) -> int: ...
    @property
    def parent_id(self) -> int: ...  # -1: a top-level field
    @property
    def name(self) -> str: ...


def _ids(field: pa.Field) -> list[int]:
    raw = (field.metadata or {}).get(FIELD_ID)
    return [int(x) for x in raw.split(b",")] if raw else []


def is_blob(field: pa.Field) -> bool:
    return bool(field.metadata and field.metadata.get(BLOB))


def _lance_blob(field: pa.Field) -> bool:
    """A blob column as pylance describes it: storage 2.1 marks it with
    `lance-encoding:blob` metadata, 2.2 with the `lance.blob.v2` extension type."""
    meta = field.metadata or {}
    if meta.get(b"lance-encoding:blob", b"").lower() in (b"true", b"1", b"yes"):
        return True
    return getattr(field.type, "extension_name", "").startswith("lance.blob")


def _tag(field: pa.Field, fid: int | None, extra: dict[bytes, bytes] | None = None) -> pa.Field:
    meta = {k: v for k, v in (field.metadata or {}).items() if k not in _PRIVATE}
    if fid is not None:
        meta[FIELD_ID] = str(fid).encode()
    meta.update(extra or {})
    return field.with_metadata(meta)


def annotate(schema: pa.Schema, lance_fields: Iterable[LanceField]) -> pa.Schema:
    """`schema` (pylance's) with each field's Lance id (from the manifest's fields)
    in its metadata; blob columns become large_binary marked BLOB."""
    children: dict[int, list[LanceField]] = {}
    for lf in lance_fields:
        children.setdefault(lf.parent_id, []).append(lf)

    def walk(field: pa.Field, lf: LanceField | None) -> pa.Field:
        fid = lf.id if lf is not None else None
        if lf is not None and lf.parent_id == -1 and _lance_blob(field):
            meta = {k: v for k, v in (field.metadata or {}).items() if not k.startswith(b"lance-")}
            blob = pa.field(field.name, pa.large_binary(), field.nullable, meta)
            return _tag(blob, fid, {BLOB: b"1"})
        kids = {c.name: c for c in children.get(fid, [])} if fid is not None else {}
        t = field.type
        if pa.types.is_struct(t):
            t = pa.struct(
                [walk(t.field(i), kids.get(t.field(i).name)) for i in range(t.num_fields)]
            )
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            only = next(iter(kids.values()), None) if len(kids) == 1 else None
            value = walk(t.value_field, only)
            t = pa.list_(value) if pa.types.is_list(t) else pa.large_list(value)
        return _tag(field.with_type(t), fid)

    top = {lf.name: lf for lf in children.get(-1, [])}
    return pa.schema([walk(f, top.get(f.name)) for f in schema], metadata=schema.metadata)


def _strip_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([_strip_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_list(t):
        return pa.list_(_strip_field(t.value_field))
    if pa.types.is_large_list(t):
        return pa.large_list(_strip_field(t.value_field))
    return t


def _strip_field(field: pa.Field) -> pa.Field:
    meta = {k: v for k, v in (field.metadata or {}).items() if k not in _PRIVATE}
    return field.with_type(_strip_type(field.type)).with_metadata(meta or None)


def strip(schema: pa.Schema) -> pa.Schema:
    """`schema` without lance-cdf's private field metadata (ids, blob marks)."""
    return pa.schema([_strip_field(f) for f in schema], metadata=schema.metadata)


def column_sources(schema: pa.Schema, at: pa.Schema) -> list[pa.Field | None]:
    """For each field of `schema` (a range's columns), the field of `at` (one
    version's annotated columns) that holds its values there, or None: matched by
    Lance field id, so a renamed column is found under its old name; by name for
    schemas without ids."""
    by_id = {i: f for f in at for i in _ids(f)[:1]}
    out: list[pa.Field | None] = []
    for field in schema:
        ids = _ids(field)
        if ids:
            out.append(next((by_id[i] for i in ids if i in by_id), None))
        else:
            out.append(at.field(field.name) if field.name in at.names else None)
    return out


def _shape(
    col: pa.Array | pa.ChunkedArray, source: pa.Field, target: pa.Field
) -> pa.Array | pa.ChunkedArray:
    """Values of `source` (one version's field) as `target`'s type: struct
    children matched by field id (a renamed subfield keeps its values), other
    types cast."""
    t, st = target.type, source.type
    if isinstance(col, pa.ChunkedArray):
        if col.type == _strip_type(t) and not _nested_struct(t):
            return col  # already the type wanted: chunks kept (combining copies every value)
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_struct(t) and pa.types.is_struct(st):
        by_id = {i: st.field(k) for k in range(st.num_fields) for i in _ids(st.field(k))[:1]}
        arrays, fields = [], []
        for k in range(t.num_fields):
            tf = t.field(k)
            ids = _ids(tf)
            sf = next((by_id[i] for i in ids if i in by_id), None) if ids else None
            if (
                sf is None
                and not ids
                and tf.name in [st.field(j).name for j in range(st.num_fields)]
            ):
                sf = st.field(tf.name)
            if sf is None:
                arrays.append(pa.nulls(len(col), _strip_type(tf.type)))
                fields.append(_strip_field(tf))
                continue
            child = col.field(st.get_field_index(sf.name))
            arrays.append(_shape(child, sf, tf))
            fields.append(_strip_field(tf))
        mask = col.is_null() if col.null_count else None
        return pa.StructArray.from_arrays(arrays, fields=fields, mask=mask)
    if (
        (pa.types.is_list(t) or pa.types.is_large_list(t))
        and (pa.types.is_list(st) or pa.types.is_large_list(st))
        and _nested_struct(t)
    ):
        values = _shape(col.values, st.value_field, t.value_field)
        offsets = col.offsets.cast(pa.int64() if pa.types.is_large_list(t) else pa.int32())
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        mask = col.is_null() if col.null_count else None
        return cls.from_arrays(offsets, values, type=_strip_type(t), mask=mask)
    want = _strip_type(t)
    return col if col.type == want else pc.cast(col, want)


def _nested_struct(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _nested_struct(t.value_type)
    return False


def conform(
    table: pa.Table | None,
    schema: pa.Schema,
    n: int,
    sources: list[pa.Field | None] | None = None,
) -> pa.Table:
    """Shape `table` (columns named as at the version read) to `schema`: columns
    are found through `sources` (see column_sources; default: by name), missing
    ones become nulls, types are cast, private metadata is dropped."""
    out = strip(schema)
    if sources is None:
        names = table.column_names if table is not None else []
        sources = [f if f.name in names else None for f in schema]
    arrays = []
    for field, source in zip(schema, sources, strict=True):
        if table is not None and source is not None and source.name in table.column_names:
            col = table.column(source.name)
            try:
                col = _shape(col, source.with_type(col.type) if not _ids(source) else source, field)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise LanceCdfError(
                    f"column {field.name!r} changed type to {field.type} within the "
                    f"requested range and older values ({col.type}) cannot be cast ({exc}); "
                    "read the range before and after the type change separately."
                ) from None
            arrays.append(col)
        else:
            arrays.append(pa.nulls(n, out.field(field.name).type))
    if not arrays:  # no user columns (columns=[]): keep the row count
        return pa.table({"_": pa.nulls(n)}).drop_columns(["_"])
    return pa.Table.from_arrays(arrays, schema=out)


def union_schema(schemas: list[pa.Schema]) -> pa.Schema:
    """Columns of all `schemas` (oldest first), one per Lance field id: the newest
    name, type and position win (a renamed column is one column under its newest
    name), columns dropped along the way follow; a column missing anywhere is
    nullable. A name dropped and re-added (a new id) stays one column. Schemas
    without ids are combined by name."""
    fields: dict[object, pa.Field | None] = {}  # None: merged into an older id
    names: dict[str, object] = {}
    seen: dict[object, int] = {}
    for schema in reversed(schemas):
        for field in schema:
            ids = _ids(field)
            key = ids[0] if ids else field.name
            seen[key] = seen.get(key, 0) + 1
            if key in fields:
                continue
            if field.name in names and names[field.name] not in [key]:
                # an older column that had this name: same column for the reader
                owner = names[field.name]
                merged = _ids(fields[owner]) + [i for i in ids if i not in _ids(fields[owner])]
                if merged:
                    fields[owner] = _tag(fields[owner], None, {FIELD_ID: _id_list(merged)})
                seen[owner] = seen[owner] + 1
                fields[key] = None
                continue
            fields[key] = field
            names[field.name] = key
    out = []
    for key, field in fields.items():
        if field is None:
            continue
        if seen[key] < len(schemas):
            field = field.with_nullable(True)
        out.append(field)
    return pa.schema(out)


def _id_list(ids: list[int]) -> bytes:
    return ",".join(str(i) for i in ids).encode()
