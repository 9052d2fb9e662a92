"""The private interfaces of pylance and PySpark that lance-cdf relies on, in one place.

Each is used for speed or for a behaviour the public API does not offer, and each has a
test in `test_internals` that fails loudly when an upgrade of pylance or PySpark
changes it (rather than lance-cdf silently falling back, or breaking somewhere else):

- `raw_file_reader`: pylance's `LanceFileReader._reader`, whose `take_rows(offsets,
  batch_size, batch_readahead)` and `read_range(start, count, batch_size,
  batch_readahead)` take numpy offsets as they are (the public `take_rows` checks the
  order of the offsets row by row in Python).
- `delete_rows`: `LanceFragment._fragment.delete_rows(offsets)`, the same call as the
  public `LanceFragment.delete_rows` without its per-offset `int()` pass, a noticeable
  part of a large replica batch (docs/benchmarks.md, "Inside the replicator").
- `PYSPARK_STREAMING_RUNNERS`: the modules PySpark runs a Python streaming source's and
  sink's driver-side methods in (`lance_cdf.spark.source.hangup` recognises them).

Nothing here imports pylance or PySpark at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from lance_cdf.errors import LanceCdfError

if TYPE_CHECKING:
    import lance
    import lance.file
    from lance.fragment import FragmentMetadata

# pylance's native file reader (`LanceFileReader._reader`): a Rust object pylance gives no
# type, so Any (its `take_rows` / `read_range` are tested in test_internals)
RawFileReader = Any

# PySpark's `python -m` entry points of the long-lived driver-side processes of a Python
# data source's stream reader (latestOffset / partitions / commit) and stream writer
PYSPARK_STREAMING_RUNNERS = frozenset(
    {
        "pyspark.sql.streaming.python_streaming_source_runner",
        "pyspark.sql.worker.python_streaming_sink_runner",
    }
)


def raw_file_reader(reader: lance.file.LanceFileReader) -> RawFileReader | None:
    """The native reader behind a `lance.file.LanceFileReader`, or None where this pylance
    has none (callers then use the public methods)."""
    return getattr(reader, "_reader", None)


def delete_rows(
    fragment: lance.LanceFragment | None, offsets: list[int]
) -> FragmentMetadata | None:
    """`fragment.delete_rows(offsets)` (a `lance.LanceFragment`): the new fragment's
    `FragmentMetadata`, or None when every row of the fragment is deleted."""
    if fragment is None:
        raise LanceCdfError("internal error: delete_rows of a fragment the table does not have")
    inner = getattr(getattr(fragment, "_fragment", None), "delete_rows", None)
    if inner is None:
        return fragment.delete_rows(offsets)
    raw = inner(offsets)
    return None if raw is None else cast("FragmentMetadata", raw.metadata())
