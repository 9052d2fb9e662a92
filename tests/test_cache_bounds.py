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
