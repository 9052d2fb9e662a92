"""Columns across versions: which column of one version is which column of another, which
field of one version holds a range's column, and shaping a version's values to the range's
schema.

Column identity
---------------
Lance gives every field (nested ones too) an id, and a rename keeps it; but pylance hands
ids out again: after `drop_columns`, after a `restore` and on an `overwrite` a new column
can get an id an earlier column held. So a bare field id does not say which column a field
is. lance-cdf follows each column through consecutive manifests instead (`ColumnHistory`,
`follow_columns`), counting from a range's first version (its *origin*):

- between two versions with the same fields nothing changes;
- a field whose id the previous version had (under the same parent column) is that
  column, renamed or not;
- a field with an id new to the version, whose name a field of the previous version had
  that is gone from this one, is that column retyped (pylance's cast gives a new id);
- an `Overwrite` replaces every column: a field is the column of the previous version
  with its name (under the same parent), if any;
- a `Restore` brings back the columns of the version restored: each field is the column
  its id named there (followed from that version when it is before the origin; where the
  versions in between are gone and the id names another column now, the range is
  refused rather than guessed);
- anything else is a new column: a column added under an old id (or an old name) is not
  the one that had it.

Each column of a walk gets a *token*: its field id where no other column held that id
since the origin (so most tables' tokens are their ids), else `id@version` (the version
that made it). The schemas lance-cdf works with carry each field's token in its metadata
under FIELD_ID ("7", or for one name held by several columns over a range "9@12,7": the
tokens holding that name, newest first) and the origin under ORIGIN; events go out
without these keys (`strip`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from lance_cdf.errors import LanceCdfError, VersionNotFoundError
from lance_cdf.format.operations import Operation

FIELD_ID = b"lance-cdf:field-id"
ORIGIN = b"lance-cdf:origin"  # the version a schema's tokens are counted from
BLOB = b"lance-cdf:blob"  # a blob column: its values are read with take_blobs
_PRIVATE = (FIELD_ID, ORIGIN, BLOB)


class LanceField(Protocol):
    """A field of a Lance manifest's schema (`lance_cdf.format`'s `file_pb2.Field`), as
    far as columns reads it."""

    @property
    def id(self) -> int: ...
    @property
    def parent_id(self) -> int: ...  # -1: a top-level field
    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class FieldState:
    """One Lance field of one version, as identity needs it."""

    id: int
    parent_id: int
    name: str
    type: str  # Lance's logical type


@dataclass(frozen=True)
class Commit:
    """What made a version, as identity needs it: the operation's name and, for a
    `Restore`, the version restored."""

    operation: str
    restored: int | None = None


def follow_columns(
    prev: Sequence[FieldState],
    prev_tokens: Mapping[int, str],
    cur: Sequence[FieldState],
    overwrite: bool,
    fresh: Callable[[int], str],
) -> dict[int, str]:
    """The token of each field of `cur` (field id -> token), given the fields of the
    version before and their tokens (see the module doc); `fresh(id)` names a new column."""
    cur_ids = {f.id for f in cur}
    prev_by_id = {f.id: f for f in prev}
    prev_by_name: dict[tuple[str, str | None], FieldState] = {}
    for f in prev:
        parent = prev_tokens.get(f.parent_id) if f.parent_id != -1 else None
        prev_by_name[(f.name, parent)] = f
    tokens: dict[int, str] = {}
    for f in _parents_first(cur):
        parent = tokens.get(f.parent_id) if f.parent_id != -1 else None
        match = None
        if overwrite:
            match = prev_by_name.get((f.name, parent))
        else:
            same = prev_by_id.get(f.id)
            if same is not None and _parent_token(same, prev_tokens) == parent:
                match = same
            else:
                named = prev_by_name.get((f.name, parent))
                if named is not None and named.id not in cur_ids:
                    match = named  # retyped: a new id under the name of a field now gone
        tokens[f.id] = prev_tokens[match.id] if match is not None else fresh(f.id)
    return tokens


def _parent_token(f: FieldState, tokens: Mapping[int, str]) -> str | None:
    return tokens.get(f.parent_id) if f.parent_id != -1 else None


def _parents_first(fields: Sequence[FieldState]) -> list[FieldState]:
    ids = {f.id for f in fields}
    parent = {f.id: f.parent_id for f in fields}

    def depth(f: FieldState) -> int:
        d, at = 0, f.parent_id
        while at != -1 and at in ids and d < 64:
            d, at = d + 1, parent[at]
        return d

    return sorted(fields, key=depth)


class ColumnHistory:
    """The tokens of a table's columns at each version from `origin` on (module doc).

    `fields_of(v)` gives a version's fields, `commit_of(v)` what made it; both read
    manifests (and raise VersionNotFoundError for a version that is gone)."""

    def __init__(
        self,
        origin: int,
        fields_of: Callable[[int], tuple[FieldState, ...]],
        commit_of: Callable[[int], Commit],
        where: str = "the table",
    ):
        self.origin = origin
        self._fields_of = fields_of
        self._commit_of = commit_of
        self._where = where
        first = fields_of(origin)
        self._tokens: dict[int, dict[int, str]] = {origin: {f.id: str(f.id) for f in first}}
        self._fields: dict[int, tuple[FieldState, ...]] = {origin: first}
        self._used = set(self._tokens[origin].values())

    def tokens(self, version: int) -> dict[int, str]:
        """field id -> token of every field of `version` (VersionNotFoundError if gone)."""
        if version < self.origin:
            return self._before_origin(version, version, self._fields_of(version))
        if version not in self._tokens:
            for v in range(max(self._tokens) + 1, version + 1):
                try:
                    cur = self._fields_of(v)
                except VersionNotFoundError:
                    if v == version:
                        raise
                    continue  # removed by cleanup: the next version there steps over it
                self._step(v, cur)
        return self._tokens[version]

    def _fresh(self, version: int) -> Callable[[int], str]:
        def fresh(fid: int) -> str:
            token = str(fid) if str(fid) not in self._used else f"{fid}@{version}"
            self._used.add(token)
            return token

        return fresh

    def _step(self, v: int, cur: tuple[FieldState, ...]) -> None:
        prev = max(self._tokens)  # v - 1, or the last version before a gap
        prev_fields, prev_tokens = self._fields[prev], self._tokens[prev]
        self._fields[v] = cur
        if cur == prev_fields:
            self._tokens[v] = prev_tokens
            return
        if prev < v - 1:  # the commits in between are gone: only what the fields say
            self._tokens[v] = self._matched(cur, prev, v, f"versions {prev + 1}..{v - 1}")
            return
        commit = self._commit_of(v)
        if commit.operation == Operation.RESTORE and commit.restored is not None:
            r = commit.restored
            if r in self._tokens:
                there = self._tokens[r]
            elif r < self.origin:
                there = self._before_origin(r, v, cur)  # (a restore copies r's fields)
            else:  # restored a version cleaned up since: what the fields say
                there = self._matched(cur, prev, v, f"version {r}, which {v} restored,")
            fresh = self._fresh(v)
            self._tokens[v] = {f.id: there.get(f.id) or fresh(f.id) for f in cur}
            return
        self._tokens[v] = follow_columns(
            prev_fields, prev_tokens, cur, commit.operation == Operation.OVERWRITE, self._fresh(v)
        )

    def _before_origin(self, r: int, at: int, r_fields: tuple[FieldState, ...]) -> dict[int, str]:
        """Tokens (of this history) of the fields of version `r` < origin, as met at
        version `at` (a restore of `r`, or a read of `r` itself): followed from `r` to the
        origin where those versions are there; else what the fields say (`_matched`)."""
        try:
            walk = ColumnHistory(r, self._fields_of, self._commit_of, self._where)
            theirs = walk.tokens(self.origin)
        except LanceCdfError:
            walk = None
        if walk is None:
            gone = f"the versions between {r} and {self.origin}"
            return self._matched(r_fields, max(self.origin, at - 1), at, gone)
        fresh = self._fresh(at)
        ours = {theirs[fid]: tok for fid, tok in self._tokens[self.origin].items()}
        return {f.id: ours.get(walk.tokens(r)[f.id]) or fresh(f.id) for f in r_fields}

    def _matched(
        self, fields: Sequence[FieldState], near: int, at: int, gone: str
    ) -> dict[int, str]:
        """Tokens of `fields` (met at version `at`) where the commits that would tell are
        gone, from what the fields of version `near` (followed) say: a field with the id,
        name, type and parent of one there is that column; a new id under the name of a
        field of `near` whose id is gone is that column retyped (or one in its place: the
        same column of the events either way); a new id under a new name is a new column.
        A field whose id names a field of another name or type there cannot be told
        (renamed, or the id handed out again?): refused, naming it."""
        near_fields = {f.id: f for f in self._fields[near]}
        near_tokens = self._tokens[near]
        ids = {f.id for f in fields}
        by_name = {(f.name, f.parent_id): f for f in near_fields.values() if f.id not in ids}
        fresh = self._fresh(at)
        out: dict[int, str] = {}
        unsure = []
        for f in fields:
            g = near_fields.get(f.id)
            if g is None:
                h = by_name.get((f.name, f.parent_id))
                out[f.id] = near_tokens[h.id] if h is not None else fresh(f.id)
            elif (g.name, g.type, g.parent_id) == (f.name, f.type, f.parent_id):
                out[f.id] = near_tokens[f.id]
            else:
                unsure.append(f"{f.name!r} (field id {f.id}; {g.name!r} at version {near})")
        if unsure:
            raise LanceCdfError(
                f"cannot tell which columns of {self._where} at version {at} are which at "
                f"version {near}: {', '.join(unsure)}. Lance reuses field ids, and {gone} "
                "that would tell are gone. Read the versions before and after as separate "
                "ranges."
            )
        return out

    def tokens_fields(self, version: int) -> tuple[FieldState, ...]:
        self.tokens(version)
        return self._fields[version]


def _ids(field: pa.Field) -> list[str]:
    """The column tokens a field of a tagged schema holds (module doc), newest first."""
    raw = (field.metadata or {}).get(FIELD_ID)
    return raw.decode().split(",") if raw else []


def origin_of(schema: pa.Schema) -> int | None:
    """The version the tokens of a tagged schema were counted from (None: untagged)."""
    for field in schema:
        raw = (field.metadata or {}).get(ORIGIN)
        if raw:
            return int(raw)
    return None


def is_blob(field: pa.Field) -> bool:
    return bool(field.metadata and field.metadata.get(BLOB))


def _lance_blob(field: pa.Field) -> bool:
    """A blob column as pylance describes it: storage 2.1 marks it with
    `lance-encoding:blob` metadata, 2.2 with the `lance.blob.v2` extension type."""
    meta = field.metadata or {}
    if meta.get(b"lance-encoding:blob", b"").lower() in (b"true", b"1", b"yes"):
        return True
    return getattr(field.type, "extension_name", "").startswith("lance.blob")


def _tag(field: pa.Field, token: str | None, extra: dict[bytes, bytes] | None = None) -> pa.Field:
    meta = {k: v for k, v in (field.metadata or {}).items() if k != FIELD_ID}
    if token is not None:
        meta[FIELD_ID] = token.encode()
    meta.update(extra or {})
    return field.with_metadata(meta)


def annotate(
    schema: pa.Schema,
    lance_fields: Iterable[LanceField],
    tokens: Mapping[int, str] | None = None,
    origin: int | None = None,
) -> pa.Schema:
    """`schema` (pylance's) with each field's column token in its metadata (`tokens`:
    field id -> token, from a ColumnHistory; default: the Lance field id) and, top-level,
    the `origin` the tokens count from; blob columns become large_binary marked BLOB."""
    children: dict[int, list[LanceField]] = {}
    for lf in lance_fields:
        children.setdefault(lf.parent_id, []).append(lf)

    def token(lf: LanceField | None) -> str | None:
        if lf is None:
            return None
        return tokens[lf.id] if tokens is not None else str(lf.id)

    def walk(field: pa.Field, lf: LanceField | None) -> pa.Field:
        fid = lf.id if lf is not None else None
        if lf is not None and lf.parent_id == -1 and _lance_blob(field):
            meta = {k: v for k, v in (field.metadata or {}).items() if not k.startswith(b"lance-")}
            blob = pa.field(field.name, pa.large_binary(), field.nullable, meta)
            return _tag(blob, token(lf), {BLOB: b"1"})
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
        return _tag(field.with_type(t), token(lf))

    top = {lf.name: lf for lf in children.get(-1, [])}
    fields = [walk(f, top.get(f.name)) for f in schema]
    if origin is not None:
        fields = [
            f.with_metadata({**(f.metadata or {}), ORIGIN: str(origin).encode()}) for f in fields
        ]
    return pa.schema(fields, metadata=schema.metadata)


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
    """Columns of all `schemas` (oldest first, tagged by one ColumnHistory), one per
    column token: the newest name, type and position win (a renamed or retyped column
    is one column under its newest name), columns dropped along the way follow with
    the values they had; a column missing anywhere is nullable. Columns that held one
    name at different times (one dropped, another added under its name) come out as
    one column of that name: each image shows the column that had the name at the
    version it was read at, never another's values. Schemas without tokens are
    combined by name."""
    fields: dict[object, pa.Field | None] = {}  # None: merged into an older column
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


def _id_list(ids: list[str]) -> bytes:
    return ",".join(ids).encode()
