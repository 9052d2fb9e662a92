"""ReplicaTable.apply without Kafka: random batches against a dict model of the replica.

Both key lookups (probes of the BTREE key index, one scan of the key column) are forced in
turn, with compaction and index upkeep in between; the oracle is a plain dict of key ->
row, and with `keep_row_ids` the replica's `_rowid` of a key must never change.
"""

import random

import lance
import numpy as np
import pyarrow as pa
import pytest

from lance_cdf.errors import DuplicateKeysError, LanceCdfError
from lance_cdf.replicate import key_lookup
from lance_cdf.replicate.key_lookup import KeyLookup
from lance_cdf.replicate.keymap import GONE, KeyMap
from lance_cdf.replicate.replica import OFFSETS_PROPERTY, ORIGIN_PROPERTY, ReplicaTable


def rows_of(model: dict, keys: list, key_type: pa.DataType) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys, key_type),
            "v": pa.array([model[k] for k in keys], pa.int64()),
        }
    )


@pytest.mark.parametrize("lookup", ["probe", "scan", "map"])
@pytest.mark.parametrize("key_type", [pa.int64(), pa.string()])
@pytest.mark.parametrize("keep_row_ids", [False, True])
def test_random_batches_equal_model(tmp_path, monkeypatch, lookup, key_type, keep_row_ids):
    # probe: every batch through the index; scan: every batch through the key column;
    # map: the in-memory key map (integer keys without keep_row_ids; else the index)
    monkeypatch.setattr(key_lookup, "INDEX_PROBE_ROWS_PER_KEY", 0 if lookup == "probe" else 10**9)
    monkeypatch.setattr(key_lookup, "PROBE_CHUNK", 7)  # several IN lists per batch
    uri = str(tmp_path / "replica.lance")
    rep = ReplicaTable(
        uri, ["k"], index_rows_max=50, keep_row_ids=keep_row_ids, key_map=lookup == "map"
    )
    assert rep.lookup.key_map_enabled == (lookup == "map" and not keep_row_ids)
    rng = random.Random(hash((lookup, str(key_type), keep_row_ids)) & 0xFFFF)

    def key(i):
        return i if key_type == pa.int64() else f"k'{i}"  # a quote: SQL literal escaping

    model: dict = {}
    rowids: dict = {}
    for step in range(25):
        live = list(model)
        deleted = rng.sample(live, min(len(live), rng.randint(0, 15)))
        for k in deleted:
            del model[k]
        upserted = [key(rng.randrange(400)) for _ in range(rng.randint(0, 40))]
        upserted = [k for k in dict.fromkeys(upserted) if k not in deleted]
        for k in upserted:
            model[k] = step
        props = {OFFSETS_PROPERTY: f'{{"t": {{"0": {step}}}}}'}
        up = rows_of(model, upserted, key_type) if upserted else None
        dl = pa.table({"k": pa.array(deleted, key_type)}) if deleted else None
        rep.apply(up, dl, props)
        if step % 6 == 5:
            rep.maintain(compact=True)
        else:
            rep.maintain()
        ds = lance.dataset(uri) if (up is not None or lance_exists(uri)) else None
        if ds is None:
            continue
        got = ds.to_table(with_row_id=True).to_pylist()
        keys = [r["k"] for r in got]
        assert len(keys) == len(set(keys)), f"duplicate keys after step {step}"
        assert {r["k"]: r["v"] for r in got} == model, f"step {step}"
        assert rep.position()[OFFSETS_PROPERTY] == props[OFFSETS_PROPERTY]
        if keep_row_ids:
            for r in got:
                assert rowids.setdefault(r["k"], r["_rowid"]) == r["_rowid"], r
            for k in deleted:
                rowids.pop(k, None)
    assert rep.lookup.indexed and rep.unindexed_rows() <= 50
    assert rep.lookup.key_map_enabled == (
        lookup == "map" and not keep_row_ids and key_type == pa.int64()
    )


def random_round(
    rng,
    model: dict,
    next_key: int,
    step: int,
    max_deleted: int,
    max_updated: int,
    min_new: int,
    back: int = 0,
):
    """One random batch against the dict model (changed in place, values = `step`): up to
    `max_deleted` live keys deleted, up to `max_updated` others updated, up to `back` of the
    deleted upserted again (a delete then an upsert), `min_new`..30 new keys from `next_key`.
    Returns (deleted, updated, back, new, the upserted keys in random order)."""
    live = list(model)
    deleted = rng.sample(live, min(len(live), rng.randint(0, max_deleted)))
    for k in deleted:
        del model[k]
    updated = [
        k for k in rng.sample(live, min(len(live), rng.randint(0, max_updated))) if k not in deleted
    ]
    again = rng.sample(deleted, min(len(deleted), rng.randint(0, back))) if back else []
    new = list(range(next_key, next_key + rng.randint(min_new, 30)))
    keys = updated + again + new
    rng.shuffle(keys)
    for k in keys:
        model[k] = step
    return deleted, updated, again, new, keys


def lance_exists(uri: str) -> bool:
    try:
        lance.dataset(uri)
        return True
    except (ValueError, FileNotFoundError, OSError):
        return False


@pytest.mark.parametrize("keep_row_ids,key_map", [(False, False), (True, False), (False, True)])
def test_fresh_rows_are_not_looked_up(tmp_path, monkeypatch, keep_row_ids, key_map):
    """Upserts flagged fresh (keys the replica does not hold) skip the key lookup; the
    others are still found and replaced, against a dict model over random batches."""
    monkeypatch.setattr(key_lookup, "INDEX_PROBE_ROWS_PER_KEY", 0)  # always probe
    probed: list = []
    find, map_find = KeyLookup.find, KeyMap.find

    def spy(self, ds, keys, with_keys):
        probed.append(set(keys.to_pylist()))
        return find(self, ds, keys, with_keys)

    def map_spy(self, keys):
        probed.append(set(np.asarray(keys).tolist()))
        return map_find(self, keys)

    monkeypatch.setattr(KeyLookup, "find", spy)
    monkeypatch.setattr(KeyMap, "find", map_spy)
    uri = str(tmp_path / "replica.lance")
    rep = ReplicaTable(uri, ["k"], index_rows_max=30, keep_row_ids=keep_row_ids, key_map=key_map)
    rng = random.Random(7 + keep_row_ids)
    model: dict = {}
    next_key = 0
    for step in range(20):
        deleted, updated, _, new, keys = random_round(rng, model, next_key, step, 10, 20, 1)
        next_key += len(new)
        probed.clear()
        fresh = np.array([k >= next_key - len(new) for k in keys])
        dl = pa.table({"k": pa.array(deleted, pa.int64())}) if deleted else None
        rep.apply(rows_of(model, keys, pa.int64()), dl, {OFFSETS_PROPERTY: str(step)}, fresh=fresh)
        rep.maintain(compact=step % 7 == 6)
        looked_up = set().union(*probed)
        assert not looked_up & set(new), step  # fresh keys never probed ...
        if step:  # ... the others always (the first batch creates the table)
            assert looked_up == set(updated) | set(deleted), step
        got = lance.dataset(uri).to_table().to_pylist()
        assert len(got) == len(model) and {r["k"]: r["v"] for r in got} == model, step
    assert (rep.lookup.map is not None) == key_map


def test_fresh_flags_must_match_the_rows(tmp_path):
    uri = str(tmp_path / "replica.lance")
    rep = ReplicaTable(uri, ["k"])
    rows = pa.table({"k": pa.array([1, 2], pa.int64()), "v": pa.array([0, 0], pa.int64())})
    rep.apply(rows, None, {OFFSETS_PROPERTY: "0"})
    with pytest.raises(LanceCdfError, match="one per row"):
        rep.apply(rows, None, {OFFSETS_PROPERTY: "1"}, fresh=np.array([True]))


def test_only_a_replica_the_replicator_created_allows_fresh_inserts(tmp_path):
    made, seeded = str(tmp_path / "made.lance"), str(tmp_path / "seeded.lance")
    rows = pa.table({"k": pa.array([1, 2], pa.int64()), "v": pa.array([0, 0], pa.int64())})
    rep = ReplicaTable(made, ["k"])
    assert rep.fresh_bounds() == (0, -1)  # not created yet: nothing to match
    position = {
        OFFSETS_PROPERTY: "{}",
        "lance-cdf.source-version": "4",
        "lance-cdf.max-source-rowid": "2",
        ORIGIN_PROPERTY: "records",
    }
    rep.apply(rows, None, position)  # as the replicator creates it: marked in the commit
    assert rep.fresh_bounds() == (4, 2)
    rep.maintain(compact=True)  # upkeep commits carry no position: stepped over
    assert rep.fresh_bounds() == (4, 2)
    unmarked = {k: v for k, v in position.items() if k != ORIGIN_PROPERTY}
    lance.write_dataset(rows, seeded, enable_stable_row_ids=True, transaction_properties=unmarked)
    assert ReplicaTable(seeded, ["k"]).fresh_bounds() is None  # rows of unknown origin


def map_contents(km: KeyMap) -> dict:
    out = {}
    for keys, addrs in ((km.keys, km.addrs), (km.dkeys, km.daddrs)):
        live = addrs != GONE
        out.update(zip(keys[live].tolist(), addrs[live].tolist(), strict=True))
    return out


def test_key_map_against_dict(monkeypatch):
    """KeyMap.update / lookup against a plain dict over random operations, merges of
    the delta included (a small MERGE_MIN)."""
    from lance_cdf.replicate import keymap

    monkeypatch.setattr(keymap, "MERGE_MIN", 40)
    rng = np.random.default_rng(5)
    keys = rng.choice(1000, 300, replace=False)
    model = dict(zip(keys.tolist(), range(300), strict=True))
    km = KeyMap(keys, np.arange(300, dtype=np.uint64), version=1)
    for step in range(300):
        live = np.array(sorted(model), np.int64)
        gone = rng.choice(live, min(live.size, rng.integers(0, 8)), replace=False)
        for k in gone.tolist():
            del model[k]
        written = np.unique(rng.integers(-50, 1500, rng.integers(0, 30)))  # old, gone, new
        addrs = rng.integers(0, 2**40, written.size).astype(np.uint64)
        model.update(zip(written.tolist(), addrs.tolist(), strict=True))
        if step % 2:  # as an apply does: the slots its lookup found, some keys not looked up
            gone_slots, slots = km.find(gone)[1], km.find(written)[1]
            slots[rng.random(slots.size) < 0.3] = -1
            km.update(gone, written, addrs, step + 2, deleted_slots=gone_slots, slots=slots)
        else:
            km.update(gone, written, addrs, version=step + 2)
        probe = rng.integers(-100, 1600, 200)
        expect = [model.get(k, int(GONE)) for k in probe.tolist()]
        assert km.lookup(probe).tolist() == expect, step
        assert map_contents(km) == model and len(km) == len(model) and km.version == step + 2
    with pytest.raises(DuplicateKeysError):
        KeyMap(np.array([3, 1, 3]), np.arange(3, dtype=np.uint64), version=1)
    with pytest.raises(DuplicateKeysError):  # a key written twice by one apply
        km.update(np.empty(0), np.array([7, 2000, 7]), np.arange(3, dtype=np.uint64), 999)


def test_key_map_follows_the_replica(tmp_path, monkeypatch):
    """The replica's key map against a fresh scan of the replica (key -> _rowaddr) and
    the replica against a dict model, over random batches with fresh inserts, keys that
    come back after a delete, compaction, index upkeep, commits of another writer (a
    delete, an update that moves rows) and restarts (a new ReplicaTable)."""
    from lance_cdf.replicate import keymap

    monkeypatch.setattr(keymap, "MERGE_MIN", 25)
    uri = str(tmp_path / "replica.lance")

    def new_replica():
        return ReplicaTable(uri, ["k"], index_rows_max=40)

    rep = new_replica()
    builds, checked = 0, 0
    rng = random.Random(11)
    model: dict = {}
    next_key = 0
    for step in range(40):
        deleted, updated, back, new, keys = random_round(
            rng, model, next_key, step, 12, 25, 0, back=2
        )
        next_key += len(new)
        fresh = np.array([k in new for k in keys], bool)
        up = rows_of(model, keys, pa.int64()) if keys else None
        dl = pa.table({"k": pa.array(deleted, pa.int64())}) if deleted else None
        rep.apply(up, dl, {OFFSETS_PROPERTY: str(step)}, fresh=fresh if keys else None)
        event = rng.random()
        if step and event < 0.15:
            rep.maintain(compact=True)
        elif event < 0.25 and model:  # another writer: a delete and an update
            ds = lance.dataset(uri)
            victim = rng.choice(list(model))
            ds.delete(f"k = {victim}")
            del model[victim]
            moved = rng.choice(list(model)) if model else None
            if moved is not None:
                lance.dataset(uri).update({"v": "-1"}, where=f"k = {moved}")
                model[moved] = -1
        elif event < 0.35:
            builds += rep.map_builds
            rep = new_replica()  # a restart: the map is built again
        else:
            rep.maintain()
        if not lance_exists(uri):
            continue
        ds = lance.dataset(uri)
        got = ds.to_table(columns=["k", "v"], with_row_address=True)
        pairs = dict(zip(got["k"].to_pylist(), got["_rowaddr"].to_pylist(), strict=True))
        assert len(pairs) == got.num_rows, f"duplicate keys after step {step}"
        assert dict(zip(got["k"].to_pylist(), got["v"].to_pylist(), strict=True)) == model, step
        km = rep.lookup.map
        if km is not None and km.version == ds.version:  # the map claims this version
            assert map_contents(km) == pairs, step
            checked += 1
    assert rep.lookup.key_map_enabled and builds + rep.map_builds >= 5 and checked >= 30
