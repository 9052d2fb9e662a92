"""The row-image read paths agree with each other and with a snapshot diff.

Images are read by physical offset from the data files (takes for scattered rows, ranges
for dense runs) or, for layouts that path does not handle, through pylance's fragment API.
Forcing each path over the same random histories must give the same events, equal to the
brute-force oracle.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import lance
import lance.file
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
import lance_cdf.core.feed as feed
import lance_cdf.core.rows as rows_mod
from lance_cdf.ops import internals
from tests.support.oracle import feed_events_renamed, snapshot_events
from tests.support.workload import Workload


def _events(uri: str) -> pa.Table:
    return lance_cdf.read_changes(uri, 1).read_all()


def _history(tmp_path, seed: int, ops: list[str], random_steps: int):
    """A 3,000-row table in 1,000-row files, then `ops` and `random_steps` random steps."""
    uri = str(tmp_path / "t.lance")
    w = Workload(uri, seed, rows=3000, rows_per_file=1000)
    for op in ops:
        w.step(op)
    for _ in range(random_steps):
        w.step()
    return uri, w


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_forced_paths_agree_with_oracle(tmp_path, monkeypatch, seed):
    uri, w = _history(
        tmp_path,
        seed,
        ["update", "delete_dense", "upsert", "add_column", "delete_sparse", "update"],
        8,
    )
    physical = []
    take_physical = rows_mod._take_physical
    monkeypatch.setattr(
        rows_mod, "_take_physical", lambda *a: physical.append(1) or take_physical(*a)
    )
    default = _events(uri)
    assert physical, "no image was read by physical offset"
    for version in range(1, w.ds.version + 1):
        assert feed_events_renamed(
            uri, default, version, lance.dataset(uri).version
        ) == snapshot_events(uri, version)

    monkeypatch.setattr(rows_mod, "_MIN_RUN", 1)
    monkeypatch.setattr(rows_mod, "_DENSE_GAP", 1 << 40)  # every fragment's rows: one range
    assert _events(uri).equals(default)
    monkeypatch.setattr(rows_mod, "_max_rows", lambda fields: 7)  # ranges split into calls
    assert _events(uri).equals(default)
    monkeypatch.setattr(rows_mod, "_MIN_RUN", 1 << 40)  # every fragment's rows: takes of 7
    assert _events(uri).equals(default)
    monkeypatch.undo()
    monkeypatch.setattr(rows_mod, "_MIN_RUN", 1 << 40)  # every fragment's rows: one take
    assert _events(uri).equals(default)
    monkeypatch.setattr(rows_mod, "_file_columns", lambda *a: None)  # pylance's fragment API
    assert _events(uri).equals(default)


def test_one_data_file_read_by_several_threads_at_once(tmp_path):
    """A data file's readers are lent one per call (pylance's reader serves one call at a
    time): threads reading the same file at once each get their own reader, opened only
    when every open one is busy, and read the right rows; and a commit whose images are
    read in many concurrent chunks of one file gives the same events as one chunk."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(
        pa.table({"id": np.arange(4000), "x": np.arange(4000) * 0.5}),
        uri,
        enable_stable_row_ids=True,
    )
    ds = lance.dataset(uri)
    path = f"{uri}/data/{ds.get_fragments()[0].data_files()[0].path}"
    opened = []

    def open_reader():
        opened.append(1)
        return lance.file.LanceFileReader(path, columns=["id"])

    readers = rows_mod._Readers(open_reader(), open_reader)
    barrier = threading.Barrier(4)

    def hold_and_read(k):
        with readers.borrow() as reader:
            barrier.wait(timeout=30)  # all four hold a reader at once
            rows = np.arange(k, 4000, 97, dtype=np.uint64)
            raw = internals.raw_file_reader(reader)
            got = raw.take_rows(rows, 1024, 16).read_all()["id"].to_numpy()
            return id(reader), np.array_equal(got, rows.astype(np.int64))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(hold_and_read, range(4)))
    assert len({r for r, _ in results}) == 4 and all(ok for _, ok in results)
    assert len(opened) == 4
    with readers.borrow():
        pass
    assert len(opened) == 4  # a free reader is lent again, none opened

    ds.update({"x": "x + 1"}, where="id % 3 = 0")
    lance.dataset(uri).delete("id % 7 = 0")
    whole = lance_cdf.read_changes(uri, 1).read_all()
    assert lance_cdf.read_changes(uri, 1, batch_size=64).read_all().equals(whole)
    latest = lance.dataset(uri).version
    for version in range(1, latest + 1):
        assert feed_events_renamed(uri, whole, version, latest) == snapshot_events(uri, version)


def count_merges(monkeypatch) -> list[int]:
    """The number of data files each RowReader.merge_reads call read together."""
    merged: list[int] = []
    merge_reads = rows_mod.RowReader.merge_reads

    def counted(self, requests, schema):
        merge_reads(self, requests, schema)
        merged.append(len(self._merged))

    monkeypatch.setattr(rows_mod.RowReader, "merge_reads", counted)
    return merged


@pytest.mark.parametrize("seed", [6, 7])
def test_merged_reads_of_consecutive_versions_agree_with_oracle(tmp_path, monkeypatch, seed):
    """read_changes reads the images of small consecutive versions that lie in the same
    data files with one take per file (RowReader.merge_reads): the events are the same
    with any grouping of versions, with merging off, and equal to the snapshot diff."""
    uri, w = _history(
        tmp_path,
        seed,
        ["update", "delete_sparse", "upsert", "delete_dense", "update", "delete_sparse"],
        6,
    )
    merged = count_merges(monkeypatch)
    default = _events(uri)
    assert sum(merged) > 0, "no two reads shared a data file"
    latest = lance.dataset(uri).version
    for version in range(1, latest + 1):
        assert feed_events_renamed(uri, default, version, latest) == snapshot_events(uri, version)
    for versions, images in [(2, 1 << 20), (3, 1 << 20), (8, 700), (1, 1 << 20), (8, 0)]:
        monkeypatch.setattr(feed, "_GROUP_VERSIONS", versions)
        monkeypatch.setattr(feed, "_GROUP_IMAGES", images)  # 0: merging off
        assert _events(uri).equals(default), (versions, images)


def test_several_data_files_and_renamed_columns(tmp_path):
    """add_columns puts new fields in their own data file (joined per fragment); a rename
    leaves the old name in the data file (read through the fragment API)."""
    uri = str(tmp_path / "t.lance")
    rng = np.random.default_rng(7)
    data = pa.table({"id": np.arange(2000), "x": rng.random(2000)})
    lance.write_dataset(data, uri, enable_stable_row_ids=True, max_rows_per_file=500)
    ds = lance.dataset(uri)
    ds.add_columns({"y": "id * 2"})
    assert len(lance.dataset(uri).get_fragments()[0].data_files()) == 2
    lance.dataset(uri).update({"x": "x + 1"}, where="id % 7 = 0")
    lance.dataset(uri).delete("id % 11 = 0 OR (id >= 600 AND id < 1500)")
    lance.dataset(uri).alter_columns({"path": "y", "name": "z"})
    lance.dataset(uri).update({"z": "z + 1"}, where="id % 5 = 0")
    lance.dataset(uri).delete("id % 3 = 0")
    events = _events(uri)
    for version in range(1, lance.dataset(uri).version + 1):
        assert feed_events_renamed(
            uri, events, version, lance.dataset(uri).version
        ) == snapshot_events(uri, version)


def test_swapped_names_read_by_physical_offset_follow_field_ids(tmp_path, monkeypatch):
    """Two columns swap names: the data file still calls them by their old names, so the
    physical path must tie file columns to field ids, not to names."""
    uri = str(tmp_path / "t.lance")
    n = 600
    data = pa.table({"id": np.arange(n), "x": np.arange(n) * 10, "y": np.arange(n) * -1})
    lance.write_dataset(data, uri, enable_stable_row_ids=True, max_rows_per_file=200)
    lance.dataset(uri).alter_columns({"path": "x", "name": "tmp"})
    lance.dataset(uri).alter_columns({"path": "y", "name": "x"})
    lance.dataset(uri).alter_columns({"path": "tmp", "name": "y"})
    lance.dataset(uri).update({"x": "x - 1"}, where="id % 9 = 0")  # x holds the old y
    physical = []
    take_physical = rows_mod._take_physical
    monkeypatch.setattr(
        rows_mod, "_take_physical", lambda *a: physical.append(1) or take_physical(*a)
    )
    latest = lance.dataset(uri).version
    events = lance_cdf.read_changes(uri, latest, latest).read_all()
    assert physical, "the pre-images were not read by physical offset"
    pre = events.filter(pa.compute.equal(events["_change_type"], "update_preimage"))
    ids = np.asarray(pre["id"])
    assert len(ids) == len(range(0, n, 9))
    assert pre["x"].to_pylist() == (ids * -1).tolist()  # the column first called y
    assert pre["y"].to_pylist() == (ids * 10).tolist()
    assert feed_events_renamed(uri, events, latest, latest) == snapshot_events(uri, latest)


@pytest.mark.parametrize("options", [{}, {"keyHash": "_rowid"}, {"netChanges": "true"}])
def test_spark_source_partitions_read_merged_as_separately(tmp_path, monkeypatch, options):
    """The Spark source's partitions pack small consecutive versions; their image reads
    are merged per data file too (ChangeFeed.reading_together): every partition reads the
    same events, routing columns included, as with each version read on its own."""
    from lance_cdf.spark.source.data_source import LanceCdfDataSource

    uri, _ = _history(
        tmp_path,
        8,
        ["update", "delete_sparse", "upsert", "delete_sparse", "update", "delete_dense"],
        6,
    )
    latest = lance.dataset(uri).version
    source = LanceCdfDataSource(
        {"path": uri, "startingVersion": "2", "endingVersion": str(latest), **options}
    )
    reader = source.reader(source.schema())
    partitions = reader.partitions()

    def read_all() -> pa.Table:
        return pa.Table.from_batches([b for p in partitions for b in reader.read(p)])

    merged = count_merges(monkeypatch)
    together = read_all()
    assert sum(merged) > 0, "no two reads of a partition shared a data file"
    monkeypatch.setattr(feed, "_GROUP_IMAGES", 0)  # merging off
    assert together.num_rows and together.equals(read_all())


_MMAPPED_AFTER_READ = """
import ctypes, platform, sys
if platform.libc_ver()[0] != "glibc":
    print("not-glibc")
    sys.exit(0)
import lance_cdf
lance_cdf.keep_freed_memory()  # the documented opt-in
lance_cdf.read_changes(sys.argv[1], 1).read_all()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
block = libc.malloc(16 << 20)
# glibc marks a block it mapped apart (and unmaps on free) with bit 2 of its size word
print(bool(ctypes.c_size_t.from_address(block - 8).value & 2))
libc.free(block)
"""


def test_reading_rows_leaves_malloc_alone_unless_asked(tmp_path, monkeypatch):
    """Reading rows changes no process-wide state by itself: the threshold raise runs only
    for a process that opted in (the call, or the variable lance-cdf's commands set)."""
    from lance_cdf.ops import malloc

    calls = []
    monkeypatch.setattr(malloc, "keep_freed_memory", lambda: calls.append(1))
    monkeypatch.delenv(malloc.ENV, raising=False)
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    assert lance_cdf.read_changes(uri, 1).read_all().num_rows == 2
    assert calls == []
    monkeypatch.setenv(malloc.ENV, "1")
    assert lance_cdf.read_changes(uri, 1).read_all().num_rows == 2
    assert calls


def test_opted_in_process_keeps_freed_decode_buffers_in_the_heap(tmp_path):
    """In a fresh process glibc maps every block of 128 KiB or more apart and hands it
    back on free, so each 8 MiB read call would page-fault its buffers in again; once a
    process opted in (`lance_cdf.keep_freed_memory()`) and read rows, a 16 MiB block
    comes from the heap (as after any large freed block). One probe only, in a fresh
    process: freeing a mapped block raises the threshold."""
    import subprocess
    import sys

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    out = subprocess.run(
        [sys.executable, "-c", _MMAPPED_AFTER_READ, uri],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if out == "not-glibc":
        pytest.skip("glibc's malloc only")
    assert out == "False"


def test_a_call_leaves_no_reader_for_the_cyclic_collector(tmp_path):
    """Everything a fresh read_changes call builds (its reader, the table's parsed
    manifests and decoded sequences) is freed when the call ends, by reference counts: a
    reference cycle through the reader once kept them for the cyclic collector, and calls
    on an aged 10M-row table ran 50-60% slower in the memory they held."""
    import gc

    from lance_cdf.core.rows import RowReader
    from lance_cdf.format.table import TableLog

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    lance.dataset(uri).update({"id": "id + 10"}, where="id = 1")

    def ours() -> set[int]:  # (other tests' readers may live on in their caches)
        return {id(o) for o in gc.get_objects() if isinstance(o, RowReader | TableLog)}

    gc.collect()
    before = ours()
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            assert lance_cdf.read_changes(uri, 1, 2).read_all().num_rows == 4
            assert lance_cdf.read_changes(uri, 2, snapshot=True).read_all().num_rows == 2
        left = ours() - before
    finally:
        if was:
            gc.enable()
    assert left == set()
