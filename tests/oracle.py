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
    """Events of commit `version` as sorted (change_type, rowid, values) tuples."""
    before = snapshot(uri, version - 1, storage_options)
    after = snapshot(uri, version, storage_options)
    events = []
    for rid, row in after.items():
        if rid not in before:
            events.append(("insert", rid, _values(row)))
        elif row["_row_last_updated_at_version"] != before[rid]["_row_last_updated_at_version"]:
            events.append(("update_preimage", rid, _values(before[rid])))
            events.append(("update_postimage", rid, _values(row)))
    for rid, row in before.items():
        if rid not in after:
            events.append(("delete", rid, _values(row)))
    return sorted(events, key=_key)


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
