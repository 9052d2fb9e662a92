"""Independent oracles for change events.

`snapshot_events` diffs two full table snapshots (scanned through pylance with
`_rowid` and `_row_last_updated_at_version`), knowing nothing of manifests.
"""

from __future__ import annotations

import lance
import pyarrow as pa

SYSTEM = ["_rowid", "_row_last_updated_at_version"]


def snapshot(uri: str, version: int, storage_options=None) -> dict[int, dict]:
    """rowid -> {column: value, ..., "_row_last_updated_at_version": v} at a version."""
    if version == 0:
        return {}
    ds = lance.dataset(uri, version=version, storage_options=storage_options)
    table = ds.to_table(columns=ds.schema.names + SYSTEM)
    rows = table.to_pylist()
    return {r.pop("_rowid"): r for r in rows}


def snapshot_events(uri: str, version: int, storage_options=None) -> list[tuple]:
    """Events of commit `version` as sorted (change_type, rowid, values) tuples.

    A row present in both snapshots is updated when its last-updated version moved;
    in a restore that adds or removes columns, when its values differ as the restored
    version presents the row (its columns; one the version before lacks reads as null
    there, one the restored version lacks is no change)."""
    before = snapshot(uri, version - 1, storage_options)
    after = snapshot(uri, version, storage_options)
    by_values = _restore_reshaping(uri, version, storage_options)
    events = []
    for rid, row in after.items():
        if rid not in before:
            events.append(("insert", rid, _values(row)))
        elif (
            _common_differ(before[rid], row, *by_values)
            if by_values
            else row["_row_last_updated_at_version"] != before[rid]["_row_last_updated_at_version"]
        ):
            events.append(("update_preimage", rid, _values(before[rid])))
            events.append(("update_postimage", rid, _values(row)))
    for rid, row in before.items():
        if rid not in after:
            events.append(("delete", rid, _values(row)))
    return sorted(events, key=_key)


def _restore_reshaping(uri: str, version: int, storage_options=None):
    """(fields before, fields after) when commit `version` is a restore whose top-level
    columns differ from version-1's, else None (pylance's lance_schema fields)."""
    if version < 2:
        return None
    ds = lance.dataset(uri, version=version, storage_options=storage_options)
    prev = lance.dataset(uri, version=version - 1, storage_options=storage_options)
    if set(ds.schema.names) == set(prev.schema.names):
        return None
    if type(ds.read_transaction(version).operation).__name__ != "Restore":
        return None
    return prev.lance_schema.fields(), ds.lance_schema.fields()


def _leaves(row: dict, fields) -> dict:
    """Lance field id -> value of every leaf field of `row` (struct subfields by their
    own ids: a renamed column or subfield is the same field)."""
    out: dict = {}

    def walk(value, field):
        kids = field.children()
        if kids:
            for kid in kids:
                walk(value.get(kid.name()) if isinstance(value, dict) else None, kid)
        else:
            out[field.id()] = value

    for field in fields:
        if field.name() in row:
            walk(row[field.name()], field)
    return out


def _common_differ(a: dict, b: dict, fields_a, fields_b) -> bool:
    """Whether the later row `b` differs from `a` in any of `b`'s fields (by field id; a
    field `a` lacks is null there)."""
    va, vb = _leaves(a, fields_a), _leaves(b, fields_b)
    # a retyped column (cast: a new field id under the same name, the old id gone) is the
    # same column: its values before are under the old id
    ids_a = {f.name(): f.id() for f in fields_a}
    ids_b = {f.id() for f in fields_b}
    alias = {
        f.id(): ids_a[f.name()]
        for f in fields_b
        if f.id() not in va and f.name() in ids_a and ids_a[f.name()] not in ids_b
    }
    return any(va.get(alias.get(i, i)) != vb[i] for i in vb)


def changed_values_without_version_bump(uri: str, version: int, storage_options=None) -> list[int]:
    """Row IDs whose user values differ between version-1 and version although
    their last-updated version did not move (should be none outside schema changes)."""
    before = snapshot(uri, version - 1, storage_options)
    after = snapshot(uri, version, storage_options)
    out = []
    for rid, row in after.items():
        old = before.get(rid)
        if (
            old is None
            or old["_row_last_updated_at_version"] != row["_row_last_updated_at_version"]
        ):
            continue
        common = set(_values(row)) & set(_values(old))
        if any(_values(row)[c] != _values(old)[c] for c in common):
            out.append(rid)
    return out


def _values(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("_row")}


def _key(event: tuple):
    kind, rid, _ = event
    return (rid, kind)


def feed_events(batches: pa.Table, version: int, columns: list[str] | None = None) -> list[tuple]:
    """Events from read_changes output for one version, in the oracle's shape.

    Columns that are null because they did not exist at that version are
    dropped so the comparison sees the schema of that version only.
    """
    t = batches.filter(pa.compute.equal(batches["_commit_version"], version))
    out = []
    for row in t.to_pylist():
        kind, rid = row.pop("_change_type"), row.pop("_rowid")
        row.pop("_commit_version")
        row.pop("_commit_timestamp")
        if columns is not None:
            row = {k: v for k, v in row.items() if k in columns}
        out.append((kind, rid, row))
    return sorted(out, key=_key)


def feed_events_as_of(
    uri: str, events: pa.Table, version: int, storage_options=None
) -> list[tuple]:
    """feed_events with each image cut to the columns that existed where it was
    read (pre-images at version-1, post-images at version): columns padded with
    nulls because they did not exist then are not part of the oracle's answer."""
    cols = {
        at: set(lance.dataset(uri, version=at, storage_options=storage_options).schema.names)
        if at > 0
        else set()
        for at in (version - 1, version)
    }
    out = []
    for kind, rid, vals in feed_events(events, version):
        at = version - 1 if kind in ("delete", "update_preimage") else version
        out.append((kind, rid, {c: v for c, v in vals.items() if c in cols[at]}))
    return out


def names_by_field_id(uri: str, versions, storage_options=None) -> dict[int, dict[int, str]]:
    """version -> {Lance field id: top-level column name}, from pylance's own
    `lance_schema` (the field ids Lance keeps across renames)."""
    out = {}
    for v in versions:
        ds = lance.dataset(uri, version=v, storage_options=storage_options)
        out[v] = {f.id(): f.name() for f in ds.lance_schema.fields()}
    return out


def feed_events_renamed(
    uri: str, events: pa.Table, version: int, latest: int, storage_options=None
) -> list[tuple]:
    """feed_events_as_of for a feed whose columns carry their newest names (the
    names of versions 1..latest, last seen): each image's columns are renamed to
    what they were called at the version it was read at, and cut to those."""
    names = names_by_field_id(uri, range(1, latest + 1), storage_options)
    newest: dict[int, str] = {}
    for v in range(1, latest + 1):
        newest.update(names[v])
    ids: dict[str, list[int]] = {}  # a cast gives a column a new field id under its name
    for fid, name in newest.items():
        ids.setdefault(name, []).append(fid)
    out = []
    for kind, rid, vals in feed_events(events, version):
        at = version - 1 if kind in ("delete", "update_preimage") else version
        there = names.get(at, {}) if at > 0 else {}
        row = {}
        for c, v in vals.items():
            hit = [there[i] for i in ids.get(c, []) if i in there]
            if hit:
                row[hit[0]] = v
        out.append((kind, rid, row))
    return sorted(out, key=_key)


def _sorted_ids(rows) -> list[int]:
    table = rows.read_all() if hasattr(rows, "read_all") else rows
    return sorted(table["_rowid"].to_pylist())


def lance_delta_ids(uri: str, version: int, storage_options=None) -> tuple[list, list, list]:
    """(inserted, updated, deleted) row IDs of one commit by Lance's own Dataset.delta()."""
    ds = lance.dataset(uri, version=version, storage_options=storage_options)
    d = ds.delta(begin_version=version - 1, end_version=version)
    return (
        _sorted_ids(d.get_inserted_rows()),
        _sorted_ids(d.get_updated_rows()),
        _sorted_ids(d.get_deleted_row_ids()),
    )


def feed_ids(events: pa.Table, version: int | None = None) -> tuple[list, list, list]:
    """(inserted, updated, deleted) row IDs in read_changes output."""
    if version is not None:
        events = events.filter(pa.compute.equal(events["_commit_version"], version))

    def by(kind):
        return sorted(
            events.filter(pa.compute.equal(events["_change_type"], kind))["_rowid"].to_pylist()
        )

    return by("insert"), by("update_postimage"), by("delete")


# -- feed modes ----------------------------------------------------------------------


def net_snapshot_events(uri: str, start: int, end: int) -> list[tuple]:
    """Net events of versions start..end from full snapshots of every version:
    (change_type, rowid, last version that touched the row, values), sorted.

    A row is touched at version v if it appears, disappears or has its
    last-updated version move between snapshots v-1 and v."""
    snaps = {v: snapshot(uri, v) for v in range(start - 1, end + 1)}
    last_touch: dict[int, int] = {}
    for v in range(start, end + 1):
        a, b = snaps[v - 1], snaps[v]
        changed = a.keys() ^ b.keys()
        changed |= {
            rid
            for rid in a.keys() & b.keys()
            if a[rid]["_row_last_updated_at_version"] != b[rid]["_row_last_updated_at_version"]
        }
        for rid in changed:
            last_touch[rid] = v
    before, after = snaps[start - 1], snaps[end]
    events = []
    for rid, v in last_touch.items():
        if rid in before and rid in after:
            events.append(("update_preimage", rid, v, _values(before[rid])))
            events.append(("update_postimage", rid, v, _values(after[rid])))
        elif rid in before:
            events.append(("delete", rid, v, _values(before[rid])))
        elif rid in after:
            events.append(("insert", rid, v, _values(after[rid])))
    return sorted(events, key=_key4)


def without_unchanged_pairs(events: list[tuple]) -> list[tuple]:
    """`events` (sorted, pre before post per row ID) less the update pairs whose two
    images hold equal values."""
    out, i = [], 0
    while i < len(events):
        e = events[i]
        if e[0] == "update_preimage" and events[i + 1][0] == "update_postimage":
            pre, post = e, events[i + 1]
            assert pre[1] == post[1]
            if pre[-1] != post[-1]:
                out += [pre, post]
            i += 2
            continue
        out.append(e)
        i += 1
    return out


_RANK = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3, "snapshot": 4}


def _key4(event: tuple):
    return (event[1], _RANK[event[0]])


def feed_events_with_version(events: pa.Table) -> list[tuple]:
    """read_changes output as (change_type, rowid, commit_version, values), sorted."""
    out = []
    for row in events.to_pylist():
        kind, rid = row.pop("_change_type"), row.pop("_rowid")
        version = row.pop("_commit_version")
        row.pop("_commit_timestamp")
        out.append((kind, rid, version, row))
    return sorted(out, key=_key4)


def apply_events(events: pa.Table, replica: dict[int, dict] | None = None) -> dict[int, dict]:
    """A replica keyed by rowid after applying `events` in order: snapshot, insert and
    update_postimage upsert the row, delete removes it. Checks that updates and deletes
    hit rows the replica has and inserts do not."""
    replica = {} if replica is None else replica
    for row in events.to_pylist():
        kind, rid = row.pop("_change_type"), row.pop("_rowid")
        row.pop("_commit_version")
        row.pop("_commit_timestamp")
        if kind == "insert":
            assert rid not in replica, f"insert of rowid {rid} already in the replica"
            replica[rid] = row
        elif kind == "snapshot":
            replica[rid] = row
        elif kind == "update_postimage":
            assert rid in replica, f"update of rowid {rid} missing from the replica"
            replica[rid] = row
        elif kind == "update_preimage":
            assert replica.get(rid) == row, f"preimage of rowid {rid} differs from the replica"
        elif kind == "delete":
            assert replica.pop(rid, None) == row, f"delete of rowid {rid} does not match"
    return replica


def table_state(uri: str, version: int) -> dict[int, dict]:
    """rowid -> user values at a version (what a replica should hold)."""
    return {rid: _values(row) for rid, row in snapshot(uri, version).items()}


# -- values-only oracle (tables whose writers recorded no row versions) --------------


def value_snapshot(uri: str, version: int) -> tuple[dict[int, dict], list[str]]:
    """(rowid -> user values, user column names) at a version, from a full pylance scan."""
    if version == 0:
        return {}, []
    ds = lance.dataset(uri, version=version)
    rows = ds.to_table(columns=ds.schema.names + ["_rowid"]).to_pylist()
    return {r.pop("_rowid"): r for r in rows}, list(ds.schema.names)


def values_events(uri: str, version: int, columns: list[str] | None = None) -> list[tuple]:
    """Events of commit `version` from values alone: a row ID that appears is an insert,
    one that disappears a delete, one whose values differ in any user column of the later
    version an update pair (a column the earlier version lacks is null there; one the
    later version lacks is no change). Images are cut to `columns` (default: the union
    of both versions' columns, a column missing from one version null there)."""
    before, cols_before = value_snapshot(uri, version - 1)
    after, cols_after = value_snapshot(uri, version)
    union = list(dict.fromkeys(cols_after + cols_before))

    def full(row):
        return {c: row.get(c) for c in union}

    def cut(row):
        return {c: row[c] for c in (columns if columns is not None else union)}

    events = []
    for rid, row in after.items():
        if rid not in before:
            events.append(("insert", rid, cut(full(row))))
        elif any(row[c] != before[rid].get(c) for c in cols_after):
            events.append(("update_preimage", rid, cut(full(before[rid]))))
            events.append(("update_postimage", rid, cut(full(row))))
    for rid, row in before.items():
        if rid not in after:
            events.append(("delete", rid, cut(full(row))))
    return sorted(events, key=_key)
