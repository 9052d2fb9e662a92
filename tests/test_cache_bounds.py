"""pylance's metadata cache is bounded where lance-cdf keeps a session across versions
(issue 32): the RowReader's datasets and the replicator's replica table."""

import lance
import pyarrow as pa

import lance_cdf.replicate.replica as replica_mod
import lance_cdf.rows as rows_mod
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
    monkeypatch.setattr(rows_mod, "METADATA_CACHE_BYTES", BOUND)
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
