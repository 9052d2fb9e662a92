"""BTREE indexes on a replica that LanceDB can use.

pylance 14 writes a BTREE index in its index format version 1, and so does its
`optimize_indices` when it merges new rows into an older one; LanceDB 0.40 reads BTREE
indexes of version 0 only and ignores a newer one with a warning ("has version 1, which
is not supported"), so a filter through LanceDB would scan. Where `lancedb` is installed
(where a replica is served from) and the replica is at a `<name>.lance` path (as LanceDB
names its tables), the replicator builds a source's BTREE index through
LanceDB's own API, whose Lance writes version 0, and keeps it current by building it
again rather than merging (a BTREE build sorts one column). Otherwise it is built by
pylance and LanceDB 0.40 will not use it; that is said once per replica.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import lance

from lance_cdf.errors import in_words

log = logging.getLogger("lance_cdf.replicate")

_said: set[str] = set()


def _lancedb_table(ds: lance.LanceDataset) -> tuple[Any | None, str]:
    """The replica opened through LanceDB, or None and why not."""
    try:
        import lancedb
    except ImportError:
        return None, "lancedb is not installed where lance-cdf replicate runs"
    parent, _, leaf = ds.uri.rstrip("/").rpartition("/")
    if not leaf.endswith(".lance"):
        return None, "LanceDB opens tables at <name>.lance paths only"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (LanceDB's deprecation notices)
            db = lancedb.connect(parent, storage_options=_storage_options(ds))
            return db.open_table(leaf.removesuffix(".lance")), ""
    except Exception as exc:  # noqa: BLE001 - any refusal: pylance builds it
        return None, f"LanceDB cannot open it ({in_words(exc)})"


def _storage_options(ds: lance.LanceDataset) -> dict[str, str] | None:
    options = ds.latest_storage_options()
    return dict(options) if options else None


def build_btree(ds: lance.LanceDataset, column: str, name: str) -> bool:
    """Build (or build again) BTREE index `name` on `column` so that LanceDB 0.40 can read
    it; `ds` is moved to the commit. False where LanceDB cannot (not installed, a path
    it does not open): the caller builds it with pylance."""
    table, why = _lancedb_table(ds)
    if table is None:
        if ds.uri not in _said:
            _said.add(ds.uri)
            log.warning(
                "BTREE index %r on the replica %s is built by pylance, whose index format "
                "LanceDB 0.40 does not read (it ignores the index): %s",
                name,
                ds.uri,
                why,
            )
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table.create_scalar_index(column, index_type="BTREE", name=name, replace=True)
    ds.checkout_latest()  # type: ignore[no-untyped-call]
    return True
