"""The Lance table format, read-only: versions, manifests, row-ID and version
sequences, deletion files. Knows nothing about changes, Spark or Kafka."""

from lance_cdf.format.deletions import DeletionVector, read_deletion_vector
from lance_cdf.format.io import FileSystem, LocalFileSystem, open_filesystem
from lance_cdf.format.manifest import FragmentInfo, Manifest, parse_manifest
from lance_cdf.format.rowids import RowIdSequence, VersionSequence
from lance_cdf.format.table import TableLog
from lance_cdf.format.versions import list_versions

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
