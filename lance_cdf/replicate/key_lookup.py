"""How the replica finds the rows that hold a batch's keys (a single key column).

In order of preference: the in-memory key map (keymap.py; integer keys: kept current by
each apply, rebuilt from one scan of the key column after a compaction or a commit of
another writer); else probes of a BTREE index on the key (`key IN (...)`, small pages of
KEY_INDEX_ZONE_ROWS rows, loaded into the session's index cache up front so a probe reads
no page from storage); or, for a batch so large that probing key by key would cost more,
one scan of the key column. The key index is built on the first batch the map does not
serve (none while it serves: LanceDB cannot read the BTREE format pylance writes) and kept
current by the replica's upkeep (`index_upkeep`), in at most INDEX_SEGMENTS_MAX segments.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.dataset import IndexInformation
from lance.fragment import FragmentMetadata

from lance_cdf.errors import DuplicateKeysError, LanceCdfError
from lance_cdf.replicate.keymap import GONE, KeyMap
from lance_cdf.replicate.replica_shape import (
    INDEX_SEGMENTS_MAX,
    fragment_rows,
    merge_count,
    segment_rows,
)

if TYPE_CHECKING:
    from lance.indices.builder import IndexConfig

log = logging.getLogger("lance_cdf.replicate")

# A key-index probe (`key IN (...)`) costs about as much per key as scanning ~750 rows
# of the key column (bench_replica_apply): above that the batch scans instead.
INDEX_PROBE_ROWS_PER_KEY = 750
PROBE_CHUNK = 2048  # keys per IN list
# Rows per page of the key index the replicator builds. A probe of a random key visits
# one whole page, so small pages make probes about twice as fast as Lance's default 4096,
# for a longer preload; the index size is the same (docs/benchmarks.md, "Inside the
# replicator").
KEY_INDEX_ZONE_ROWS = 256


class KeyLookup:
    """The replica's lookups of key column `key[0]`; `indexed`: a single key (through the
    key index or the map; else the replica applies with merge_insert)."""

    def __init__(self, key: list[str], keep_row_ids: bool, prewarm: bool, key_map: bool):
        self.key = list(key)
        self.keep_row_ids, self.prewarm = keep_row_ids, prewarm
        self.indexed = len(self.key) == 1  # False also once the index was refused
        self.warm: set[str] = set()  # key-index segments loaded into the index cache
        # key -> row address in memory (keymap.py), for one integer key; None: not
        # built yet, or dropped because the replica moved without it
        self.key_map_enabled = key_map and self.indexed and not keep_row_ids
        self.map: KeyMap | None = None
        self.map_builds = 0  # how often the map was (re)built from a scan

    def locate(
        self,
        ds: lance.LanceDataset,
        keys: pa.Array | None,
        data: pa.Table | None,
        deletes: pa.Table | None,
    ) -> tuple[pa.Table | None, np.ndarray | None, KeyMap | None]:
        """The replica rows holding `keys` (the batch's looked-up upserts `data`, then its
        `deletes`) as (`_rowaddr`, with `keep_row_ids` also key and `_rowid`), the slots
        where the map met them, and the map used (None: the key index served)."""
        key_map = self.current_map(ds, ds.schema.field(self.key[0]).type, data, deletes)
        if key_map is not None:  # O(batch log replica), in memory
            addr, slots = (
                key_map.find(keys.to_numpy())
                if keys is not None
                else (np.empty(0, np.uint64), np.empty(0, np.int64))
            )
            return pa.table({"_rowaddr": addr[addr != GONE]}), slots, key_map
        if keys is not None:
            return self.find(ds, keys, with_keys=self.keep_row_ids), None, None
        return None, None, None

    # -- the in-memory key map (keymap.py) --------------------------------------------
    def current_map(
        self,
        ds: lance.LanceDataset,
        key_type: pa.DataType,
        data: pa.Table | None,
        deletes: pa.Table | None,
    ) -> KeyMap | None:
        """The key map of `ds`'s version, built from one scan of the key column when
        there is none (first batch, or the replica moved without the map: compaction,
        another writer); None when the map cannot serve (not enabled, a key type other
        than integers, null keys, a key held twice): then the key index serves."""
        if not self.map_serves(key_type):
            self.key_map_enabled = False
            return None
        if any(t is not None and t[self.key[0]].null_count for t in (data, deletes)):
            self.map = None  # a null key: let the index path decide what it means
            return None
        if self.map is not None and self.map.version == ds.version:
            return self.map
        self.map = None
        table = ds.to_table(columns=[self.key[0]], with_row_address=True)
        keys = table[self.key[0]]
        if keys.null_count:
            log.warning("the replica holds null keys: looking keys up through the index")
            self.key_map_enabled = False
            return None
        try:
            self.map = KeyMap(keys.to_numpy(), table["_rowaddr"].to_numpy(), ds.version)
        except DuplicateKeysError as exc:
            log.warning("%s: looking keys up through the index", exc)
            self.key_map_enabled = False
            return None
        self.map_builds += 1
        log.info("key map of %d rows built (%d MB)", table.num_rows, self.map.nbytes >> 20)
        return self.map

    def map_serves(self, key_type: pa.DataType) -> bool:
        """Whether the key map looks keys of `key_type` up (enabled, and integers it can
        hold: not uint64); it gives itself up later on null or duplicate keys."""
        return self.key_map_enabled and pa.types.is_integer(key_type) and key_type != pa.uint64()

    def advance_map(
        self,
        ds: lance.LanceDataset,
        committed: lance.LanceDataset,
        new: list[FragmentMetadata],
        deletes: pa.Table | None,
        data: pa.Table | None,
        slots: np.ndarray | None,
        fresh: np.ndarray | None,
    ) -> None:
        """Tell the map what the commit just made did: the deleted keys are gone, the
        written rows live in the new fragments, row i of `data` at offset i. Dropped
        (rebuilt by the next batch) when the commit is not exactly ours on top of
        `ds` or its new fragments are not the ones written. `slots`: where `find`
        met the looked-up keys (the non-fresh upserts, then the deletes)."""
        self.map, key_map = None, self.map
        if key_map is None or committed.version != ds.version + 1:
            return
        if slots is None:  # the map was used for the lookup: `find` gave slots
            raise LanceCdfError(
                "internal error: the key map looked no keys up for the batch it applied; "
                "please report it."
            )
        before = {f.fragment_id for f in ds.get_fragments()}
        added = sorted(
            (f.metadata for f in committed.get_fragments() if f.fragment_id not in before),
            key=lambda m: m.id,
        )
        if [m.physical_rows for m in added] != [f.physical_rows for f in new]:
            return
        addrs = [
            (np.uint64(m.id) << np.uint64(32)) + np.arange(m.physical_rows, dtype=np.uint64)
            for m in added
        ]
        key = self.key[0]
        gone = deletes[key].to_numpy() if deletes is not None else np.empty(0, np.int64)
        written = data[key].to_numpy() if data is not None else np.empty(0, np.int64)
        probed = written.size if fresh is None else int((~fresh).sum())
        written_slots = np.full(written.size, -1, np.int64)  # fresh: searched as new
        if fresh is None:
            written_slots[:] = slots[:probed]
        else:
            written_slots[~fresh] = slots[:probed]
        try:
            key_map.update(
                gone,
                written,
                np.concatenate(addrs) if addrs else np.empty(0, np.uint64),
                committed.version,
                deleted_slots=slots[probed:],
                slots=written_slots,
            )
        except DuplicateKeysError:
            return  # the rebuild finds the key twice and gives the map up
        self.map = key_map

    # -- the key index ----------------------------------------------------------------
    def find(self, ds: lance.LanceDataset, keys: pa.Array, with_keys: bool) -> pa.Table:
        """(_rowaddr, and with `with_keys` key and _rowid) of the replica rows holding
        `keys`: probes of the key index while that is cheaper than one scan of the key
        column, else that scan. Without `with_keys` a probe reads no data page: the
        addresses come from the index alone, a fraction of the cost per key
        (docs/benchmarks.md, "Inside the replicator")."""
        key = self.key[0]
        cols: dict[str, Any] = dict(columns=[key], with_row_id=with_keys, with_row_address=True)
        probe_cols = cols if with_keys else dict(columns=[], with_row_address=True)
        small = len(keys) * INDEX_PROBE_ROWS_PER_KEY <= ds.count_rows()
        probe = _sql_literals(keys) if small else None
        if probe is not None:
            parts = [
                ds.to_table(filter=f"{_quoted(key)} IN ({', '.join(chunk)})", **probe_cols)
                for chunk in (probe[i : i + PROBE_CHUNK] for i in range(0, len(probe), PROBE_CHUNK))
            ]
            return pa.concat_tables(parts)
        table = ds.to_table(**cols)  # one hash set of the keys, one pass over the column
        return table.filter(pc.is_in(table[key], value_set=keys))

    def with_key_index(
        self, ds: lance.LanceDataset, reopen: Callable[[], lance.LanceDataset]
    ) -> lance.LanceDataset:
        """`ds` with a BTREE index on the key (built once, on the first batch that finds
        none; `reopen`: the table after that commit), its segments loaded into the index
        cache; a key type the index cannot take keeps the merge_insert path. No index is
        built while the key map serves the key: LanceDB (its own, older Lance) ignores
        the BTREE format pylance writes, with a warning on every open, and the map
        needs none."""
        segments = self.key_index(ds)
        if not segments and self.map_serves(ds.schema.field(self.key[0]).type):
            return ds
        if not segments:
            try:
                ds.create_scalar_index(self.key[0], key_index_config())
            except Exception as exc:  # noqa: BLE001 - any refusal: fall back, do not fail
                log.warning(
                    "no BTREE index on %r (%s); applying with merge_insert", self.key[0], exc
                )
                self.indexed = False
                return ds
            ds = reopen()
            segments = self.key_index(ds)
        self._prewarm(ds, segments)
        return ds

    def _prewarm(self, ds: lance.LanceDataset, segments: list[IndexInformation]) -> None:
        """Load the key-index segments not loaded yet into the session's index cache
        (once per segment): a probe of a cold page costs a storage read, one per key of a
        large replica (docs/benchmarks.md, "Inside the replicator")."""
        cold = [s["uuid"] for s in segments if s["uuid"] not in self.warm]
        if not self.prewarm or not cold or self.key_map_enabled:  # the map serves
            return
        try:
            ds.prewarm_index(segments[0]["name"], index_segments=cold)
        except Exception as exc:  # noqa: BLE001 - only speed is at stake
            log.warning("could not preload the key index (%s); probing it from storage", exc)
            self.prewarm = False
            return
        self.warm.update(cold)

    def key_index(self, ds: lance.LanceDataset) -> list[IndexInformation]:
        """The segments of the BTREE index on the key (a base and at most one delta:
        `index_upkeep`); [] when there is none."""
        return [i for i in ds.list_indices() if i["fields"] == self.key and i["type"] == "BTree"]

    def owns_key_index(self, ds: lance.LanceDataset) -> bool:
        """Whether a BTREE on the key is the replicator's own (its lookups use one); with
        the key map serving, one there is the source's index, kept like the others."""
        return self.indexed and not self.map_serves(ds.schema.field(self.key[0]).type)

    def unindexed_rows(self, ds: lance.LanceDataset) -> int:
        """Rows in fragments the key index does not cover yet (each lookup scans them)."""
        if not self.indexed:
            return 0
        segments = self.key_index(ds)
        if not segments:
            return 0
        covered: set[int] = set().union(*(set(s["fragment_ids"]) for s in segments))
        return sum(f.count_rows() for f in ds.get_fragments() if f.fragment_id not in covered)

    def index_upkeep(
        self, ds: lance.LanceDataset, compact: bool, index_rows_max: int
    ) -> dict[str, int]:
        """Before a compaction (`compact`) the key index merged into one segment covering
        every fragment (pylance's compaction merges only fragments every index covers
        alike); else the fragments outside it indexed once they hold more than
        `index_rows_max` rows: a delta segment, or merged as replica_shape.merge_count
        says (at most INDEX_SEGMENTS_MAX segments; also when a replica has more).
        Returns what was done."""
        segments = self.key_index(ds) if self.owns_key_index(ds) else []
        if not segments:
            return {}
        unindexed = self.unindexed_rows(ds)
        if compact:
            if not unindexed and len(segments) == 1:
                return {}
            merge = len(segments)  # one segment again: O(replica), once per compaction
        elif unindexed > index_rows_max or len(segments) > INDEX_SEGMENTS_MAX:
            merge = merge_count(segment_rows(segments, fragment_rows(ds)), unindexed)
        else:
            return {}
        before = ds.version  # (optimize_indices moves `ds` to its commit)
        ds.optimize.optimize_indices(index_names=[segments[0]["name"]], num_indices_to_merge=merge)
        # the index commit's own version (not the latest, which another writer may have
        # moved past it): right after the map's, it moved no row
        after = ds.version
        if self.map is not None and self.map.version == before == after - 1:
            self.map.version = after
        return {"indexed_rows": unindexed}

    def after_compaction(self, reopen: Callable[[], lance.LanceDataset]) -> dict[str, int]:
        """A compaction moved rows and replaced every key-index segment: the segments
        loaded again as needed, the key map (if any) rebuilt now rather than by the next
        batch, from the table as `reopen` gives it."""
        self.warm.clear()
        if self.map is None:
            return {}
        self.map = None
        ds = reopen()
        self.current_map(ds, ds.schema.field(self.key[0]).type, None, None)
        return {"key_map_rows": len(self.map) if self.map is not None else 0}


def key_index_config() -> IndexConfig:
    """The BTREE index the replicator builds on its key (KEY_INDEX_ZONE_ROWS-row pages)."""
    from lance.indices.builder import IndexConfig

    return IndexConfig(index_type="btree", parameters={"zone_size": KEY_INDEX_ZONE_ROWS})


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _sql_literals(keys: pa.Array) -> list[str] | None:
    """The keys as SQL literals (integers, strings); None for other types (scanned)."""
    if pa.types.is_integer(keys.type):
        return list(map(str, keys.to_numpy(zero_copy_only=False).tolist()))
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        return ["'" + k.replace("'", "''") + "'" for k in keys.to_pylist()]
    return None
