"""The private pylance and PySpark interfaces lance-cdf uses (`lance_cdf.ops.internals`) are
still there and still behave as the public ones: an upgrade that changes one fails here,
by name, instead of silently falling back or breaking elsewhere."""

import importlib.util

import lance
import lance.file
import numpy as np
import pyarrow as pa
import pytest

from lance_cdf.ops import internals


@pytest.fixture
def table(tmp_path):
    uri = str(tmp_path / "t.lance")
    data = pa.table({"id": pa.array(range(5000), pa.int64()), "s": [str(i) for i in range(5000)]})
    lance.write_dataset(data, uri, enable_stable_row_ids=True, data_storage_version="2.1")
    return uri


def test_raw_file_reader_takes_and_reads_ranges_as_the_public_reader(table):
    ds = lance.dataset(table)
    path = f"{table}/data/{ds.get_fragments()[0].data_files()[0].path}"
    reader = lance.file.LanceFileReader(path, columns=["id", "s"])
    raw = internals.raw_file_reader(reader)
    assert raw is not None, (
        "pylance's LanceFileReader has no _reader: update lance_cdf.ops.internals"
    )
    rng = np.random.default_rng(7)
    offsets = np.unique(rng.integers(0, 5000, 300)).astype(np.uint64)
    public = reader.take_rows(offsets.tolist()).to_table()
    assert raw.take_rows(offsets, 1024, 16).read_all().equals(public)
    assert (
        raw.read_range(100, 250, 8192, 16).read_all().equals(reader.read_range(100, 250).to_table())
    )


def test_fragment_delete_rows_is_the_public_call(table):
    offsets = [1, 5, 4000]
    public = lance.dataset(table).get_fragment(0).delete_rows(offsets)
    fragment = lance.dataset(table).get_fragment(0)
    assert getattr(getattr(fragment, "_fragment", None), "delete_rows", None) is not None, (
        "pylance's LanceFragment._fragment.delete_rows is gone: update lance_cdf.ops.internals"
    )
    private = internals.delete_rows(fragment, offsets)
    assert private.deletion_file.num_deleted_rows == public.deletion_file.num_deleted_rows == 3
    assert private.physical_rows == public.physical_rows
    # a fragment whose every row is deleted: None, as the public call says
    assert internals.delete_rows(fragment, list(range(5000))) is None


@pytest.mark.parametrize("module", sorted(internals.PYSPARK_STREAMING_RUNNERS))
def test_pyspark_streaming_runners_exist(module):
    assert importlib.util.find_spec(module) is not None, (
        f"PySpark has no module {module}: update lance_cdf.ops.internals.PYSPARK_STREAMING_RUNNERS"
    )


_CORE_ONLY = """
import sys
import lance_cdf
t = lance_cdf.read_changes(sys.argv[1], 1).read_all()
assert t.num_rows == 2, t
feed = lance_cdf.ChangeFeed(sys.argv[1])
feed.plan(1)
# (not pandas: pylance itself imports it where it is installed)
extras = ("pyspark", "confluent_kafka", "fastavro", "prometheus_client")
print(sorted(m for m in sys.modules if m.split(".")[0] in extras))
"""


def test_read_changes_needs_only_the_core_install(tmp_path):
    """The core install (pyproject's `dependencies`) is what `read_changes` needs: it
    loads none of the modules of the `spark` and `kafka` extras."""
    import subprocess
    import sys

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2]}), uri, enable_stable_row_ids=True)
    out = subprocess.run(
        [sys.executable, "-c", _CORE_ONLY, uri], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
