"""pylance's metadata cache is bounded where lance-cdf keeps a session across versions:
the RowReader's datasets and the replicator's replica table."""

import lance
import pyarrow as pa

import lance_cdf.core.rows as rows_mod
import lance_cdf.core.table_schemas as schemas_mod
import lance_cdf.replicate.replica as replica_mod
from lance_cdf.format.table import TableLog
from lance_cdf.replicate.replica import ReplicaTable

BOUND = 256 << 10  # small enough that the versions below overflow it


def _many_versions(uri: str, n: int) -> int:
    data = pa.table({"id": pa.array(range(1000), pa.int64()), "s": ["x" * 20] * 1000})
    lance.write_dataset(data, uri, enable_stable_row_ids=True, max_rows_per_file=50)
    for i in range(n):
        lance.write_dataset(pa.table({"id": [10_000 + i], "s": ["y"]}), uri, mode="append")
    return lance.dataset(uri).version


def _check_out_all(ds: lance.LanceDataset, latest: int) -> int:
    for v in range(1, latest + 1):
        ds.checkout_version(v).count_rows()  # loads the version's manifest and file metadata
    return int(ds.session().size_bytes())


def test_an_unbounded_session_outgrows_the_bound(tmp_path):
    """The oracle for the two tests below: without a bound the same checkouts hold more."""
    uri = str(tmp_path / "t.lance")
    latest = _many_versions(uri, 60)
    assert _check_out_all(lance.dataset(uri), latest) > 2 * BOUND


def test_the_row_readers_session_stays_within_its_bound(tmp_path, monkeypatch):
    uri = str(tmp_path / "t.lance")
    latest = _many_versions(uri, 60)
    monkeypatch.setattr(schemas_mod, "METADATA_CACHE_BYTES", BOUND)
    reader = rows_mod.RowReader(TableLog(uri))
    for v in range(1, latest + 1):
        reader.dataset(v).count_rows()  # each a checkout sharing the first one's session
    assert reader.dataset(latest).session().size_bytes() <= BOUND


def test_the_replicas_session_stays_within_its_bound(tmp_path, monkeypatch):
    uri = str(tmp_path / "replica.lance")
    latest = _many_versions(uri, 60)
    monkeypatch.setattr(replica_mod, "METADATA_CACHE_BYTES", BOUND)
    replica = ReplicaTable(uri, ["id"])
    ds = replica.open()
    assert ds is not None
    assert _check_out_all(ds, latest) <= BOUND
    again = replica.open()  # later opens share the session, and its bound
    assert again is not None and again.session().is_same_as(ds.session())
    assert _check_out_all(again, latest) <= BOUND


def test_the_manifests_kept_stay_within_their_fragment_budget(tmp_path, monkeypatch):
    """A table that grows in fragments: the manifests a TableLog keeps hold at most
    MANIFEST_CACHE_FRAGMENTS entries in all, and the two newest always stay."""
    import lance_cdf.format.table as table_mod

    uri = str(tmp_path / "t.lance")
    latest = _many_versions(uri, 60)  # 20 fragments, then one more per version

    def held(log: TableLog) -> list[int]:
        return [len(m.fragments) for m in log._manifests.values()]

    unbounded = TableLog(uri)
    for v in range(1, latest + 1):
        unbounded.manifest(v)
    assert sum(held(unbounded)) > 1000  # the oracle: without a budget all 61 are kept

    monkeypatch.setattr(table_mod, "MANIFEST_CACHE_FRAGMENTS", 500)
    log = TableLog(uri)
    for v in range(1, latest + 1):
        log.manifest(v)
        assert sum(held(log)) <= 500 or len(held(log)) == 2
    assert list(log._manifests)[-2:] == [latest - 1, latest]
    monkeypatch.setattr(table_mod, "MANIFEST_CACHE_FRAGMENTS", 1)  # smaller than one diff
    log.manifest(1)  # not kept any more: read again, and the newest other one stays
    assert list(log._manifests) == [latest, 1]


def test_the_deletion_vectors_kept_stay_within_their_byte_budget(tmp_path, monkeypatch):
    """A fragment that keeps losing rows: a larger deletion file at every commit; the
    vectors a TableLog keeps hold at most DELETION_CACHE_BYTES (the newest 64 always)."""
    import lance_cdf.format.table as table_mod

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": pa.array(range(100_000), pa.int64())}), uri, enable_stable_row_ids=True
    )
    for i in range(80):  # one fragment, 500 more rows deleted at each commit
        lance.dataset(uri).delete(f"id % 200 = {i}")
    latest = lance.dataset(uri).version

    def vectors(log: TableLog) -> None:
        for v in range(2, latest + 1):
            for frag in log.manifest(v, operation=False).fragments:
                log.deletions(frag)

    unbounded = TableLog(uri)
    vectors(unbounded)
    held = sum(d.bitmap.__sizeof__() for d in unbounded._deletions.values())
    assert len(unbounded._deletions) == latest - 1 and held > 400_000  # the oracle

    monkeypatch.setattr(table_mod, "DELETION_CACHE_BYTES", 100_000)
    monkeypatch.setattr(table_mod, "_DELETION_CACHE_FLOOR", 4)
    log = TableLog(uri)
    vectors(log)
    kept = log._deletions
    assert 4 <= len(kept) < latest - 1
    assert kept.held == sum(d.bitmap.__sizeof__() for d in kept.values()) <= 100_000
    # what it keeps is what the table says: the newest vector, read again from the file
    frag = log.manifest(latest, operation=False).fragments[0]
    assert set(log.deletions(frag).bitmap) == set(TableLog(uri).deletions(frag).bitmap)


def test_the_replicas_caches_do_not_keep_the_key_index_segments_compaction_replaced(tmp_path):
    """Each compaction merges the key index into a new segment; pylance's index cache is
    keyed by segment, so a session kept across compactions holds every replaced one
    (the replicator grew at each compaction). Measured just before
    each compaction, the replica's caches must not grow with the number of compactions."""
    import numpy as np

    from lance_cdf.replicate.replica import OFFSETS_PROPERTY

    uri = str(tmp_path / "replica.lance")
    rng = np.random.default_rng(7)
    replica = ReplicaTable(uri, ["k"], key_map=False)  # lookups through the key index
    n = 40_000

    def rows(keys: np.ndarray, step: int) -> pa.Table:
        return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(np.full(len(keys), step))})

    replica.apply(rows(np.arange(n), 0), None, {OFFSETS_PROPERTY: '{"t": {"0": 0}}'})
    held = []
    for step in range(1, 25):
        touched = rng.choice(n, 300, replace=False)
        replica.apply(rows(touched, step), None, {OFFSETS_PROPERTY: f'{{"t": {{"0": {step}}}}}'})
        if step % 3 == 0:
            held.append(replica.cache_bytes())
            replica.maintain(compact=True)
        else:
            replica.maintain()
    segment = n * 8  # a key-index segment holds at least the keys (8 bytes each)
    # the oracle: eight compactions; a cache keeping each replaced segment grows by
    # several segments between the second sample and the last
    assert held[-1] - held[1] < segment, held
    assert lance.dataset(uri).count_rows() == n  # every batch applied
