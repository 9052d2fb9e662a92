"""An in-memory map from an integer key to the replica row holding it.

The replica's key lookup, for single integer keys: sorted int64 keys beside the uint64
row addresses (`fragment_id << 32 | offset`) of the rows holding them, ~16 bytes per
replica row. Built once per process from one scan of the key column with `_rowaddr`;
looked up with `np.searchsorted`, O(batch · log replica); kept current by the apply
that changes the replica (the addresses it deleted, the new fragment's keys and
addresses), so no batch reads the key column or the key index again.

Two sorted levels keep an update O(batch + delta) instead of O(replica): `main` and
a small `delta` of keys added since the last merge. A deleted key keeps its slot with
the address `GONE` (a key that comes back reuses it); a merge folds the delta into
main and drops the gone slots once the delta outgrows `max(MERGE_MIN, len(main) /
MERGE_FRACTION)`.

The map describes exactly one replica version (`version`). Whoever owns it must drop
it (`ReplicaTable` does) when the replica moves past that version in a way the map was
not told about: another writer's commit, compaction (rows move), a schema change.
"""

from __future__ import annotations

import numpy as np

from lance_cdf.errors import DuplicateKeysError

GONE = np.uint64(np.iinfo(np.uint64).max)  # the address of a deleted key
MERGE_MIN = 1 << 16
MERGE_FRACTION = 64


class KeyMap:
    def __init__(self, keys: np.ndarray, addrs: np.ndarray, version: int):
        """From the key column and `_rowaddr` of one replica version (any order)."""
        keys = np.asarray(keys, np.int64)
        order = np.argsort(keys, kind="stable")  # timsort: fast on the mostly sorted
        self.keys, self.addrs = keys[order], np.asarray(addrs, np.uint64)[order]
        if self.keys.size > 1 and bool((self.keys[1:] == self.keys[:-1]).any()):
            raise DuplicateKeysError("the replica holds some key more than once")
        self.dkeys = np.empty(0, np.int64)
        self.daddrs = np.empty(0, np.uint64)
        self.version = version

    def __len__(self) -> int:
        """Live keys."""
        return int((self.addrs != GONE).sum() + (self.daddrs != GONE).sum())

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.addrs.nbytes + self.dkeys.nbytes + self.daddrs.nbytes

    @staticmethod
    def _slots(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index, present) of `keys` in `sorted_keys`. The keys are searched in sorted
        order: numpy then starts each search where the previous one ended, faster than
        unsorted (docs/benchmarks.md, "Inside the replicator")."""
        if keys.size > 1 and not bool((keys[1:] >= keys[:-1]).all()):
            order = np.argsort(keys)
            idx_sorted, present_sorted = KeyMap._slots(sorted_keys, keys[order])
            idx, present = np.empty_like(idx_sorted), np.empty_like(present_sorted)
            idx[order], present[order] = idx_sorted, present_sorted
            return idx, present
        idx = np.searchsorted(sorted_keys, keys)
        present = idx < sorted_keys.size
        present[present] = sorted_keys[idx[present]] == keys[present]
        return idx, present

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The row address of each key (`GONE`: not in the replica)."""
        return self.find(keys)[0]

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row address of each key, `GONE`: not in the replica; its slot: i >= 0 in
        main, -2 - j in the delta, -1 none). Slots stay valid until the next `update`,
        which takes them back so that it need not search the same keys again."""
        keys = np.asarray(keys, np.int64)
        out = np.full(keys.size, GONE, np.uint64)
        slot = np.full(keys.size, -1, np.int64)
        idx, hit = self._slots(self.keys, keys)
        out[hit], slot[hit] = self.addrs[idx[hit]], idx[hit]
        if self.dkeys.size:
            idx, dhit = self._slots(self.dkeys, keys)
            dhit &= ~hit
            out[dhit], slot[dhit] = self.daddrs[idx[dhit]], -2 - idx[dhit]
        return out, slot

    def _put(self, slots: np.ndarray, addrs: np.ndarray) -> None:
        main, delta = slots >= 0, slots <= -2
        self.addrs[slots[main]] = addrs[main]
        self.daddrs[-2 - slots[delta]] = addrs[delta]

    def _set(self, keys: np.ndarray, addrs: np.ndarray) -> np.ndarray:
        """Set the address of the keys already holding a slot; the others' mask."""
        idx, hit = self._slots(self.keys, keys)
        self.addrs[idx[hit]] = addrs[hit]
        missing = ~hit
        if self.dkeys.size and missing.any():
            idx, dhit = self._slots(self.dkeys, keys)
            dhit &= missing
            self.daddrs[idx[dhit]] = addrs[dhit]
            missing &= ~dhit
        return missing

    def update(
        self,
        deleted: np.ndarray,
        keys: np.ndarray,
        addrs: np.ndarray,
        version: int,
        deleted_slots: np.ndarray | None = None,
        slots: np.ndarray | None = None,
    ) -> None:
        """What one apply did: the keys in `deleted` are gone, then `keys` live at
        `addrs` (unique keys); the map now describes `version`. `deleted_slots` /
        `slots`: the keys' slots from `find` since the last update (-1: not found,
        or not looked up), so that found keys are not searched again; keys without
        a slot are searched, then added."""
        deleted = np.asarray(deleted, np.int64)
        if deleted_slots is not None:
            found = deleted_slots != -1
            self._put(deleted_slots[found], np.full(int(found.sum()), GONE, np.uint64))
            deleted = deleted[~found]
        if deleted.size:
            self._set(deleted, np.full(deleted.size, GONE, np.uint64))
        keys, addrs = np.asarray(keys, np.int64), np.asarray(addrs, np.uint64)
        if keys.size > 1 and bool((np.diff(np.sort(keys)) == 0).any()):
            raise DuplicateKeysError("a key written twice in one batch")
        if slots is not None:
            found = slots != -1
            self._put(slots[found], addrs[found])
            keys, addrs = keys[~found], addrs[~found]
        if keys.size:
            order = np.argsort(keys)  # one sort serves the search and the insert
            keys, addrs = keys[order], addrs[order]
            missing = self._set(keys, addrs)
            if missing.any():
                self.dkeys, self.daddrs = _merged(
                    self.dkeys, self.daddrs, keys[missing], addrs[missing]
                )
        if self.dkeys.size > max(MERGE_MIN, self.keys.size // MERGE_FRACTION):
            live = self.addrs != GONE
            self.keys, self.addrs = _merged(
                self.keys[live], self.addrs[live], self.dkeys, self.daddrs
            )
            self.dkeys, self.daddrs = self.dkeys[:0], self.daddrs[:0]
        self.version = version


def _merged(
    k1: np.ndarray, a1: np.ndarray, k2: np.ndarray, a2: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted key arrays (disjoint) and their addresses as one sorted pair."""
    if not k2.size:
        return k1, a1
    if not k1.size or k1[-1] < k2[0]:  # new keys above all others: the common case
        return np.concatenate([k1, k2]), np.concatenate([a1, a2])
    at = np.searchsorted(k1, k2)
    return np.insert(k1, at, k2), np.insert(a1, at, a2)
