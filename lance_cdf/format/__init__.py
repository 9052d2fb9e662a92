"""The Lance table format, read-only: versions, manifests, row-ID and version sequences,
deletion files, and the tables of a LanceDB directory. Knows nothing about changes, Spark
or Kafka.

The names below load their module on first use: a process that needs only this package's
small helpers (its cache, its pools) does not load pyarrow or numpy."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded lazily by __getattr__; named here for type checkers
    from lance_cdf.format.deletions import DeletionVector, read_deletion_vector
    from lance_cdf.format.io import FileSystem, LocalFileSystem, open_filesystem
    from lance_cdf.format.manifest import FragmentInfo, Manifest, parse_manifest
    from lance_cdf.format.rowids import RowIdSequence, VersionSequence
    from lance_cdf.format.table import TableLog
    from lance_cdf.format.versions import list_versions

_HOMES = {
    "DeletionVector": "deletions",
    "read_deletion_vector": "deletions",
    "FileSystem": "io",
    "LocalFileSystem": "io",
    "open_filesystem": "io",
    "FragmentInfo": "manifest",
    "Manifest": "manifest",
    "parse_manifest": "manifest",
    "RowIdSequence": "rowids",
    "VersionSequence": "rowids",
    "TableLog": "table",
    "list_versions": "versions",
}

__all__ = [
    "DeletionVector",
    "FileSystem",
    "FragmentInfo",
    "LocalFileSystem",
    "Manifest",
    "RowIdSequence",
    "TableLog",
    "VersionSequence",
    "list_versions",
    "open_filesystem",
    "parse_manifest",
    "read_deletion_vector",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'lance_cdf.format' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lance_cdf.format.{home}"), name)
