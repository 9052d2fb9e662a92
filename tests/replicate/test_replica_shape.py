"""The replica's shape under a stream of small batches (replicate/replica_shape.py): every
index in at most INDEX_SEGMENTS_MAX segments and the fragments within a small bound of
what the source has after its owner's optimize, after every batch, not only after a
compaction on a batch count. No Kafka: the batches go through `ReplicaTable.apply` and the
upkeep the replicator runs after each (`maintain` as `BatchApplier.maintain` calls it by
default). The oracle is a source table given the same rows and optimized as a LanceDB
owner would (`compact_files`, then every index merged into one segment). Without the
bound the replica held a delta segment per few batches and a fragment per batch."""

from __future__ import annotations

from types import SimpleNamespace

import lance
import numpy as np
import pyarrow as pa

from lance_cdf.format.definitions import IndexDefinition, TableDefinition
from lance_cdf.replicate.applier import BatchApplier
from lance_cdf.replicate.index_keeper import IndexKeeper, unindexed_rows
from lance_cdf.replicate.replica import OFFSETS_PROPERTY, ReplicaTable
from lance_cdf.replicate.replica_shape import (
    DELETED_ROWS_SHARE_MAX,
    EXCESS_FRAGMENTS_MAX,
    INDEX_SEGMENTS_MAX,
    compaction_due,
    fragment_rows,
    merge_count,
    segment_rows,
)
from lance_cdf.replicate.replicate_settings import ReplicaSettings

DIM = 16
BASE = 3000
BATCHES = 36
BATCH = 60  # rows per batch: 2% of the replica, so every batch's upkeep indexes them
DEFINITION = TableDefinition.of(
    [
        IndexDefinition.of("cat_idx", "BITMAP", ("cat",), {}),
        IndexDefinition.of("tags_idx", "LABEL_LIST", ("tags",), {}),
        IndexDefinition.of(
            "vec_idx",
            "IVF_PQ",
            ("vec",),
            {"metric": "l2", "num_partitions": 4, "num_sub_vectors": 4},
        ),
    ],
    {},
    {},
    {},
)


def rows(ids: np.ndarray, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "cat": pa.array([f"c{i % 5}" for i in ids]),
            "tags": pa.array([[f"t{i % 3}", f"u{(i + seed) % 7}"] for i in ids]),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(len(ids) * DIM, dtype=np.float32)), DIM
            ),
        }
    )


def segments(ds: lance.LanceDataset) -> dict[str, int]:
    count: dict[str, int] = {}
    for s in ds.list_indices():
        count[s["name"]] = count.get(s["name"], 0) + 1
    return count


def optimized_source(uri: str, table: pa.Table) -> lance.LanceDataset:
    """The source as its owner keeps it: the same rows, compacted, one segment per index."""
    ds = lance.write_dataset(table, uri, mode="overwrite", enable_stable_row_ids=True)
    ds.create_scalar_index("id", "BTREE")
    ds.create_scalar_index("cat", "BITMAP", name="cat_idx")
    ds.create_scalar_index("tags", "LABEL_LIST", name="tags_idx")
    ds.create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=4, num_sub_vectors=4)
    ds.optimize.compact_files()
    ds.optimize.optimize_indices(num_indices_to_merge=len(ds.list_indices()))
    return lance.dataset(uri)


def test_small_batches_keep_segments_and_fragments_bounded_at_every_step(tmp_path):
    keeper = IndexKeeper()
    # the replicator's own key index (no key map) kept too, indexed every 100 rows
    replica = ReplicaTable(
        str(tmp_path / "replica"), ["id"], key_map=False, index_rows_max=100, keeper=keeper
    )
    model = rows(np.arange(BASE), 0)
    replica.apply(model, None, {OFFSETS_PROPERTY: '{"t": {"0": 0}}'})
    keeper.want(DEFINITION)
    rng = np.random.default_rng(1)
    compactions = 0
    for step in range(1, BATCHES + 1):
        # new rows and updates of old ones (a delete in an old fragment each), some deletes
        ids = model["id"].to_numpy()
        new = np.arange(BASE + (step - 1) * BATCH, BASE + step * BATCH)
        updated = rng.choice(ids, 20, replace=False)
        gone = rng.choice(np.setdiff1d(ids, updated), 5, replace=False)
        batch = rows(np.concatenate([new, updated]), step)
        replica.apply(
            batch, pa.table({"id": gone}), {OFFSETS_PROPERTY: f'{{"t": {{"0": {step}}}}}'}
        )
        keep = ~np.isin(ids, np.concatenate([updated, gone]))
        model = pa.concat_tables([model.filter(pa.array(keep)), batch])
        done = replica.maintain(compact=None, batch_rows=batch.num_rows)
        compactions += "fragments_removed" in done

        ds = replica.open()
        count = segments(ds)
        assert count.keys() == {"id_idx", "cat_idx", "tags_idx", "vec_idx"}, count
        assert max(count.values()) <= INDEX_SEGMENTS_MAX, (step, count)
        # the source has one fragment (all its rows fit one, test end); the replica at
        # most EXCESS_FRAGMENTS_MAX more
        fragments = ds.get_fragments()
        assert len(fragments) <= 1 + EXCESS_FRAGMENTS_MAX, (step, len(fragments))
        physical = sum(f.metadata.physical_rows for f in fragments)
        assert physical - ds.count_rows() <= physical * DELETED_ROWS_SHARE_MAX
        loose = unindexed_rows(ds)
        assert all(n <= max(ds.count_rows() // 100, batch.num_rows) for n in loose.values()), loose
    assert compactions >= 3  # by shape alone: 36 batches, no batch count asked for one

    # the replica holds the model's rows and answers its indexed queries as the source
    source = optimized_source(str(tmp_path / "source"), model)
    assert len(source.get_fragments()) == 1 and set(segments(source).values()) == {1}
    ds = replica.open()
    assert sorted(ds.to_table(columns=["id"])["id"].to_pylist()) == sorted(model["id"].to_pylist())
    for flt in ("cat = 'c2'", "array_has_any(tags, ['u3'])", "id BETWEEN 100 AND 400"):
        a = sorted(source.to_table(filter=flt, columns=["id"])["id"].to_pylist())
        b = sorted(ds.to_table(filter=flt, columns=["id"])["id"].to_pylist())
        assert a == b, flt


def test_merge_count_keeps_a_base_and_one_delta():
    assert merge_count([1000], 10) == 0  # a first delta segment
    assert merge_count([1000, 50], 10) == 1  # the delta merged with the new rows, base kept
    assert merge_count([1000, 120], 10) == 2  # past an eighth of the base: one segment
    assert merge_count([1000, 10, 10, 10], 10) == 3  # a replica with more: back to two


class FakeReplica:
    def __init__(self, compacts_when_asked: bool):
        self.asked: list[bool | None] = []
        self.keeper = None
        self.compacts = compacts_when_asked

    def maintain(self, compact: bool | None, batch_rows: int) -> dict[str, int]:
        self.asked.append(compact)
        return {"fragments_removed": 2} if compact or (compact is None and self.compacts) else {}


def upkeeps(compact_every: int | None, by_shape: bool, batches: int) -> list[bool | None]:
    replica = FakeReplica(by_shape)
    applier = BatchApplier.__new__(BatchApplier)
    applier.replica = replica  # type: ignore[assignment]
    applier.settings = ReplicaSettings(compact_every=compact_every)
    applier.since_compaction, applier.batch_rows = 0, 0
    applier.counters = SimpleNamespace()  # type: ignore[assignment]
    for _ in range(batches):
        applier.maintain()
    return replica.asked


def test_compaction_follows_shape_by_default_and_compact_every_overrides_it():
    assert ReplicaSettings().compact_every is None
    assert upkeeps(None, True, 5) == [None] * 5  # the shape decides every time
    assert upkeeps(0, True, 3) == [False] * 3  # 0: never
    # N: every N batches, the shape not asked
    assert upkeeps(3, True, 7) == [False, False, True, False, False, True, False]


def test_reading_the_shape_costs_no_storage_request(s3_server, s3_uri):
    """What the upkeep reads of the replica's shape after every batch (fragments, their
    deletion counts, the index segments) comes from the manifest it opened: the S3
    server counts no request for it."""
    opts = s3_server.storage_options()
    ds = lance.write_dataset(rows(np.arange(2000), 0), s3_uri, storage_options=opts)
    ds.create_scalar_index("cat", "BITMAP", name="cat_idx")
    for i in range(3):
        lance.write_dataset(
            rows(np.arange(2000 + i * 10, 2010 + i * 10), i),
            s3_uri,
            mode="append",
            storage_options=opts,
        )
    ds = lance.dataset(s3_uri, storage_options=opts)
    ds.delete("id < 300")
    ds = lance.dataset(s3_uri, storage_options=opts)
    s3_server.request_counts(reset=True)
    why = compaction_due(ds)
    rows_of = fragment_rows(ds)
    covered = segment_rows(ds.list_indices(), rows_of)
    assert not s3_server.request_counts()
    assert why is not None and "300 of 2030 rows deleted" in why  # and what it read is right
    assert covered == [1700] and sum(rows_of.values()) == 1730
