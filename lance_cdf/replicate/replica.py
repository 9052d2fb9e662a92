"""The replica side of replication: apply one batch of final row states to a Lance table.

A batch is one Lance commit whose cost follows the batch, not the replica:

  1. the replica rows holding the batch's keys are found (`KeyLookup`: the in-memory
     key map of an integer key, else the BTREE key index, else one scan of the key
     column). Upserts the caller knows to be new (`fresh`: a source insert of a row ID
     the replica cannot hold yet, see `fresh_bounds`) are not looked up at all;
  2. those rows are marked deleted in the deletion vectors of just the fragments
     they live in (`LanceFragment.delete_rows`);
  3. the upserted rows are written as new fragments. A row that replaces a replica
     row gets a new stable row ID of the replica, so the replica's own change feed
     shows a delete and an insert; with `keep_row_ids` it keeps the old one
     (`row_id_meta`) and the feed shows an update, but Lance then looks every carried
     row ID up in a row-ID index of the whole table at commit: O(replica), seconds per
     commit on a large replica (docs/benchmarks.md, "Inside the replicator");
  4. all of it is committed as one `LanceOperation.Update` whose transaction
     properties carry the Kafka position the batch reached (`lance-cdf.offsets`).

The data and the position it describes land in the same atomic commit, which is
what makes replication exactly once in effect; a crash before the commit leaves
only unreferenced files, and the batch is replayed. Composite keys go through
`merge_insert` (a delete commit, then an upsert commit carrying the position;
both idempotent). `maintain` compacts the small fragments batches leave (when the
replica's shape calls for it, `compaction_due`) and keeps the indexes current in few
segments; its commits change no rows, and the position is read from the newest commit
that carries one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.dataset import LanceOperation, Transaction
from lance.fragment import FragmentMetadata, RowIdSequence, write_fragments

from lance_cdf.errors import LanceCdfError, ReplicaError
from lance_cdf.ops import internals
from lance_cdf.replicate.index_keeper import ROWLESS_OPERATIONS, IndexKeeper
from lance_cdf.replicate.key_lookup import KeyLookup
from lance_cdf.replicate.replica_shape import MATERIALIZE_DELETIONS_THRESHOLD, compaction_due

if TYPE_CHECKING:
    from lance.lance import _Session

log = logging.getLogger("lance_cdf.replicate")

OFFSETS_PROPERTY = "lance-cdf.offsets"
SOURCE_VERSION_PROPERTY = "lance-cdf.source-version"
# The highest `_source_rowid` ever upserted into the replica (replicas keyed by it):
# a key above it cannot be in the replica.
MAX_ROWID_PROPERTY = "lance-cdf.max-source-rowid"
SOURCE_ROWID = "_source_rowid"
# Set to "records" in the commits of a replica the replicator created itself (from its
# first commit on, carried forward like the offsets): then every row came from a
# record, and a key above the recorded row ID / version cannot be there yet (see
# `ReplicaTable.fresh_bounds`). A replica created any other way is always looked up.
ORIGIN_PROPERTY = "lance-cdf.replica-origin"
# Whose replica it is, recorded on the first apply and carried forward like the
# offsets: the topic it follows, and the source table as its records name it (JSON of
# `source.name` / `source.table` / `source.db`); records of another are refused.
TOPIC_PROPERTY = "lance-cdf.topic"
SOURCE_TABLE_PROPERTY = "lance-cdf.source-table"
# Fault injection for the crash tests: the process exits hard at the named point.
CRASH_ENV = "LANCE_CDF_REPLICATOR_CRASH_AT"
# `maintain` adds fragments to the key index once they hold more rows than this: the
# rows outside the index are scanned by every lookup.
UNINDEXED_ROWS_MAX = 100_000


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os._exit(137)


# Whole versions (`VersionGate`): the transaction topic's next
# offset after the END of the recorded source version; per partition, where the records
# after that version start; the first version after it when the replica holds part of
# what follows (a piece of a version larger than the replicator's bound); and, without
# transaction metadata (no source version recorded: completeness is not known), the
# highest source version of any record applied.
TRANSACTION_OFFSET_PROPERTY = "lance-cdf.transaction-offset"
VERSION_OFFSETS_PROPERTY = "lance-cdf.version-offsets"
INSIDE_VERSION_PROPERTY = "lance-cdf.inside-version"
RECORDS_THROUGH_PROPERTY = "lance-cdf.records-through-version"
# The source table's definition (indexes, config, metadata) as of the recorded source
# version, carried forward like the offsets once an END brought one (as
# `replica_definition.definition_json` writes it): the upkeep makes the replica's equal to
# it, after a restart too.
DEFINITION_PROPERTY = "lance-cdf.table-definition"


def describe_position(position: dict[str, str]) -> str:
    """What a recorded position says the replica holds, in words (for `status`)."""
    version = source_version_of(position)
    inside = position.get(INSIDE_VERSION_PROPERTY)
    through = position.get(RECORDS_THROUGH_PROPERTY)
    if version is None:
        if inside is not None:
            return (
                f"holds part of source version {inside} and later (no whole version yet: "
                "a version larger than the replicator's --max-pending-records)"
            )
        if through is not None:
            return (
                f"records through source version {through} applied, but no transaction "
                "metadata was read, so no version is known to be complete"
            )
        return "nothing applied yet"
    text = f"equals the source at version {version}"
    if inside is not None:
        text = (
            f"holds source version {version} plus part of version {inside} and later "
            f"(a version larger than the replicator's --max-pending-records, being applied "
            "in pieces)"
        )
    return text


def source_version_of(position: dict[str, str]) -> int | None:
    """The source version a recorded position reached (None: not recorded)."""
    value = position.get(SOURCE_VERSION_PROPERTY)
    return int(value) if value is not None else None


def offsets_of(position: dict[str, str], topic: str) -> dict[int, int]:
    offsets = json.loads(position.get(OFFSETS_PROPERTY, "{}")).get(topic, {})
    return {int(p): int(o) for p, o in offsets.items()}


def topics_of(position: dict[str, str]) -> set[str]:
    """The topics a recorded position names (its topic, and those it holds offsets of)."""
    topics = set(json.loads(position.get(OFFSETS_PROPERTY, "{}")))
    if TOPIC_PROPERTY in position:
        topics.add(position[TOPIC_PROPERTY])
    return topics


def source_table_of(position: dict[str, str]) -> dict[str, str | None] | None:
    """The source table a recorded position names (None: not recorded)."""
    value = position.get(SOURCE_TABLE_PROPERTY)
    return None if value is None else dict(json.loads(value))


# pylance's metadata cache of the session the replicator keeps across batches: pylance's
# default bound, 1 GiB, let it hold every replica version's manifest it opened, growing
# for as long as it ran. An apply needs the newest manifest and the touched files' metadata
# (docs/benchmarks.md, "Inside the replicator" has their size per fragment), so 16 MiB
# holds the working set of a replica of thousands of fragments; beyond, the files' footers
# are read again, not the rows.
# The index cache (the key index) is left at pylance's default: it is what lookups need.
METADATA_CACHE_BYTES = 16 << 20


class ReplicaTable:
    """The target Lance table of a replicator, keyed by `key` (found through `lookup`)."""

    def __init__(
        self,
        uri: str,
        key: list[str],
        storage_options: dict[str, str] | None = None,
        index_rows_max: int = UNINDEXED_ROWS_MAX,
        keep_row_ids: bool = False,
        prewarm: bool = True,
        key_map: bool = True,
        keeper: IndexKeeper | None = None,
    ):
        self.uri, self.key, self.storage_options = uri, list(key), storage_options
        # the source's indexes and settings, and the replica-only indexes (None: none kept)
        self.keeper = keeper
        self.index_rows_max, self.keep_row_ids = index_rows_max, keep_row_ids
        self._session: _Session | None = None  # one index / metadata cache across batches
        self.lookup = KeyLookup(self.key, keep_row_ids, prewarm, key_map)
        # seconds spent per phase of `apply` since start (open: opening the table and
        # conforming the batch; lookup; delete: deletion vectors; write: new fragments;
        # commit; map: bringing the key map up to date)
        self.timings: dict[str, float] = {}
        self._t = 0.0

    @property
    def map_builds(self) -> int:
        """How often the in-memory key map was (re)built from a scan of the key column."""
        return self.lookup.map_builds

    def _clock(self, phase: str | None = None) -> None:
        now = time.perf_counter()
        if phase is not None:
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self._t
        self._t = now

    def open(self) -> lance.LanceDataset | None:
        try:
            if self._session is None:  # the session's caches are set when it is made
                ds = lance.dataset(
                    self.uri,
                    storage_options=self.storage_options,
                    metadata_cache_size_bytes=METADATA_CACHE_BYTES,
                )
            else:
                ds = lance.dataset(
                    self.uri, storage_options=self.storage_options, session=self._session
                )
        except (ValueError, FileNotFoundError, OSError) as exc:
            if "not found" in str(exc).lower() or isinstance(exc, FileNotFoundError):
                return None
            raise LanceCdfError(f"cannot open the replica table {self.uri}: {exc}") from exc
        if self._session is None:
            self._session = ds.session()
        return ds

    def cache_bytes(self) -> int:
        """Bytes held by the pylance session's caches (0 before the first open)."""
        return 0 if self._session is None else int(self._session.size_bytes())

    def _reopen(self) -> lance.LanceDataset:
        """The replica table again, after a commit of ours to it: it exists."""
        ds = self.open()
        if ds is None:
            raise ReplicaError(
                f"the replica table {self.uri} disappeared while being written "
                "(deleted by another process?); start the replicator again"
            )
        return ds

    def position(self) -> dict[str, str]:
        """The transaction properties of the newest replica commit that recorded a
        position ({} for a new replica: Kafka's committed offsets then decide).
        Compaction and index commits in between carry none and are stepped over."""
        ds = self.open()
        if ds is None:
            return {}
        versions = sorted((v["version"] for v in ds.versions()), reverse=True)
        for version in versions:  # those cleanup left; none with a position: Kafka's
            try:
                tx = ds.read_transaction(version)
            except TypeError as exc:
                # pylance 14 cannot decode a compaction's transaction on an indexed
                # table (TypeError in RewrittenIndex): not a commit of ours (those are
                # appends/updates/deletes), step over it; any other failure to read a
                # transaction propagates (a position must not be guessed)
                log.debug("replica version %d: transaction not decodable (%s)", version, exc)
                continue
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

    def fresh_bounds(self, position: dict[str, str] | None = None) -> tuple[int, int] | None:
        """(source version, highest `_source_rowid`) the replica recorded: a source
        insert above that version, or any key above that row ID, cannot be in the
        replica ((0, -1) for a replica not created yet). None when the replica was not
        created by the replicator (seeded by other means, or by an older lance-cdf: its
        rows need not have come from records) or recorded no source version: then
        every upsert is looked up."""
        if self.open() is None:
            return 0, -1
        position = self.position() if position is None else position
        if position.get(ORIGIN_PROPERTY) != "records":
            return None
        # the highest version of any record applied (a whole-version replica may hold
        # records of a version it does not claim yet, a piece of a large one)
        through = position.get(RECORDS_THROUGH_PROPERTY)
        version = int(through) if through is not None else source_version_of(position)
        if version is None:
            return None
        max_rowid = position.get(MAX_ROWID_PROPERTY)
        return version, int(max_rowid) if max_rowid is not None else np.iinfo(np.int64).max

    def apply(
        self,
        upserts: pa.Table | None,
        deletes: pa.Table | None,
        props: dict[str, str],
        fresh: np.ndarray | None = None,
    ) -> bool:
        """Delete the keys in `deletes`, upsert `upserts`, and record `props`, in one
        Lance commit (two with a composite key). `fresh` (one bool per upsert row):
        rows whose key the caller knows the replica does not hold; they are written
        without a lookup (a wrong True leaves a duplicate key, so only a caller that
        can prove it passes one). A batch with no rows to change (tombstones, dead
        letters) still commits its position. False when nothing could be written (no
        table yet and no rows to create it from): the caller then relies on Kafka's
        committed offsets, which can only replay no-ops."""
        if upserts is not None and upserts.num_rows == 0:
            upserts = None  # nothing to upsert
        has_upserts = upserts is not None
        has_deletes = deletes is not None and deletes.num_rows > 0
        self._clock()
        ds = self.open()
        if ds is None:
            if not has_upserts:
                return False  # only deletes of rows the replica never had
            crash_point("before-lance-commit")
            lance.write_dataset(
                upserts,
                self.uri,
                enable_stable_row_ids=True,
                transaction_properties=props,
                storage_options=self.storage_options,
            )
            return True
        if upserts is not None:
            ds = self._add_new_columns(ds, upserts.schema)
        data = self._conform(upserts, ds.schema) if upserts is not None else None
        if self.lookup.indexed:
            ds = self.lookup.with_key_index(ds, self._reopen)
        if self.lookup.indexed:
            n_upserts = upserts.num_rows if upserts is not None else 0
            if fresh is not None and len(fresh) != n_upserts:
                raise LanceCdfError(
                    f"fresh has {len(fresh)} flags for {n_upserts} "
                    "upsert rows: pass one per row (or None to look every key up)"
                )
            fresh = fresh if has_upserts and fresh is not None and fresh.any() else None
            self._clock("open")
            self._apply_by_address(ds, data, deletes if has_deletes else None, props, fresh)
        else:
            self._apply_merge_insert(ds, data, deletes if has_deletes else None, props)
        return True

    # -- one commit: deletion vectors of the touched fragments + new fragments ---------
    def _apply_by_address(
        self,
        ds: lance.LanceDataset,
        data: pa.Table | None,
        deletes: pa.Table | None,
        props: dict[str, str],
        fresh: np.ndarray | None = None,
    ) -> None:
        key = self.key[0]
        key_type = ds.schema.field(key).type
        probed = data if fresh is None or data is None else data.filter(pa.array(~fresh))
        # (chunks, not ChunkedArrays: pa.chunked_array converts a ChunkedArray element
        # value by value)
        chunks = [
            c
            for t in (probed, deletes)
            if t is not None and t.num_rows
            for c in t[key].cast(key_type).chunks
        ]
        keys = pa.chunked_array(chunks, key_type).combine_chunks() if chunks else None
        found, slots, key_map = self.lookup.locate(ds, keys, data, deletes)
        self._clock("lookup")
        crash_point("before-lance-commit")
        removed: list[int] = []
        updated: list[FragmentMetadata] = []
        if found is not None and found.num_rows:
            addr = found["_rowaddr"].to_numpy()
            fragment, offset = addr >> 32, addr & 0xFFFFFFFF
            for fid in np.unique(fragment).tolist():
                meta = internals.delete_rows(ds.get_fragment(fid), offset[fragment == fid].tolist())
                (removed.append(fid) if meta is None else updated.append(meta))
        self._clock("delete")
        new: list[FragmentMetadata] = []
        if data is not None and self.keep_row_ids and found is not None and found.num_rows:
            pos = pc.index_in(data[key], value_set=found[key].combine_chunks())
            matched = pc.is_valid(pos)
            ids = found["_rowid"].combine_chunks().take(pos.drop_null()).to_numpy()
            new += self._write(ds, data.filter(matched), ids)
            data = data.filter(pc.invert(matched))
        if data is not None:
            new += self._write(ds, data, None)
        self._clock("write")
        crash_point("between-commits")  # files written, nothing committed yet
        op = LanceOperation.Update(
            removed_fragment_ids=removed, updated_fragments=updated, new_fragments=new
        )
        committed = lance.LanceDataset.commit(
            self.uri,
            Transaction(ds.version, op, transaction_properties=props),
            storage_options=self.storage_options,
        )
        self._clock("commit")
        if key_map is not None:
            self.lookup.advance_map(ds, committed, new, deletes, data, slots, fresh)
            self._clock("map")

    def _write(
        self, ds: lance.LanceDataset, rows: pa.Table, row_ids: np.ndarray | None
    ) -> list[FragmentMetadata]:
        """`rows` as new (uncommitted) fragments; with `row_ids`, the rows keep those
        stable row IDs (a replaced row stays the same row)."""
        if rows.num_rows == 0:
            return []
        fragments = write_fragments(rows, ds, storage_options=self.storage_options)
        if row_ids is not None:
            start = 0
            for f in fragments:
                ids = row_ids[start : start + f.physical_rows].tolist()
                f.row_id_meta = RowIdSequence(ids).to_inline_metadata()
                start += f.physical_rows
        return fragments

    # -- upkeep -----------------------------------------------------------------------
    def unindexed_rows(self, ds: lance.LanceDataset | None = None) -> int:
        """Rows in fragments the key index does not cover yet (each lookup scans them)."""
        ds = ds or self.open()
        return 0 if ds is None else self.lookup.unindexed_rows(ds)

    def maintain(self, compact: bool | None = False, batch_rows: int = 0) -> dict[str, int]:
        """Keep the replica's shape (`replica_shape`'s bounds): its indexes current in at most
        INDEX_SEGMENTS_MAX segments each (the key index once more than `index_rows_max`
        rows are outside it; the source's definition and the other indexes through
        `keeper` (`IndexKeeper`), `batch_rows`: the last batch's rows, a bound on
        unindexed rows), and its small fragments compacted (`compact`: True always, None
        when its shape calls for it, False never), every index merged into one segment
        first. Neither changes a row nor the recorded position: the position is read from
        the newest commit that carries one. Returns what was done (`fragments_removed`
        and `fragments_added`: a compaction)."""
        done: dict[str, int] = {}
        ds = self.open()
        if ds is None:
            return done
        if compact is None:
            why = compaction_due(ds)
            compact = why is not None
            if why is not None:
                log.info("replica compaction: %s", why)
        done.update(self.lookup.index_upkeep(ds, compact, self.index_rows_max))
        if self.keeper is not None:
            ds = self._reopen()
            before = ds.version
            lookup = self.lookup  # (with the key map serving, a BTREE on the key is the source's)
            protected = (
                {s["name"] for s in lookup.key_index(ds)} if lookup.owns_key_index(ds) else set()
            )
            done.update(self.keeper.upkeep(ds, protected, compact, batch_rows))
            self._after_rowless_commits(before)
        if compact:
            ds = self._reopen()
            metrics = ds.optimize.compact_files(
                materialize_deletions_threshold=MATERIALIZE_DELETIONS_THRESHOLD
            )
            done["fragments_removed"] = metrics.fragments_removed
            done["fragments_added"] = metrics.fragments_added
            # a compaction replaces the index segments of the fragments it rewrote, but
            # pylance's index cache keeps the replaced ones (keyed by segment, unbounded
            # by default: it grew at every compaction): a fresh session from the next
            # open on
            self._session = None
            done.update(self.lookup.after_compaction(self._reopen))
        return done

    def _after_rowless_commits(self, before: int) -> None:
        """The key map of version `before` carried over the index and settings commits
        made on top of it (they move no row), so the next batch does not rebuild it."""
        key_map = self.lookup.map
        if key_map is None or key_map.version != before:
            return
        ds = self._reopen()
        for version in range(before + 1, ds.version + 1):
            tx = ds.read_transaction(version)
            if tx is None or type(tx.operation).__name__ not in ROWLESS_OPERATIONS:
                return
        key_map.version = ds.version

    # -- composite keys: merge_insert ------------------------------------------------
    def _apply_merge_insert(
        self,
        ds: lance.LanceDataset,
        data: pa.Table | None,
        deletes: pa.Table | None,
        props: dict[str, str],
    ) -> None:
        """A delete commit, then an upsert commit carrying `props`; both idempotent, so
        a crash between them replays to the same table."""
        if deletes is not None or data is None:  # deletes, or a position-only commit
            key_schema = pa.schema([ds.schema.field(c) for c in self.key])
            keys = (
                deletes.select(self.key).cast(key_schema)
                if deletes is not None
                else (key_schema.empty_table())
            )
            crash_point("before-lance-commit")
            tx, _ = ds.merge_insert(self.key).when_matched_delete().execute_uncommitted(keys)
            if data is None:
                tx.transaction_properties = props
            ds = lance.LanceDataset.commit(
                self.uri, tx, read_version=ds.version, storage_options=self.storage_options
            )
            crash_point("between-commits")
        if data is not None:
            crash_point("before-lance-commit")
            builder = ds.merge_insert(self.key).when_matched_update_all()
            tx, _ = builder.when_not_matched_insert_all().execute_uncommitted(data)
            tx.transaction_properties = props
            lance.LanceDataset.commit(
                self.uri, tx, read_version=ds.version, storage_options=self.storage_options
            )

    def _add_new_columns(self, ds: lance.LanceDataset, schema: pa.Schema) -> lance.LanceDataset:
        missing = [f.with_nullable(True) for f in schema if f.name not in ds.schema.names]
        if not missing:
            return ds
        ds.add_columns(missing)  # all-null columns: rows written before had no value
        return self._reopen()

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
                        "the source retyped a column; publish it from a snapshot into a new "
                        "topic (lance-cdf publish --snapshot) and replicate that into a new "
                        f"--target ({exc})"
                    ) from exc
            else:
                columns.append(pa.nulls(data.num_rows, f.type))
        return pa.Table.from_arrays(columns, schema=target)
