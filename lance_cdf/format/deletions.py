"""Deletion files: which physical offsets of a fragment are deleted.

`_deletions/{fragment_id}-{read_version}-{id}.arrow` holds an Arrow IPC file
with one 32-bit integer column (pylance 14: a non-null UInt32 `row_id`, one
record batch, zstd-compressed buffers or stored ones where zstd does not pay);
`.bin` holds a portable 32-bit roaring bitmap.
"""

from __future__ import annotations

import array

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from lance_cdf.errors import CorruptFileError
from lance_cdf.format._proto import table_pb2
from lance_cdf.format.io import FileSystem

ARROW = table_pb2.DeletionFile.ARROW_ARRAY
BITMAP = table_pb2.DeletionFile.BITMAP


def deletion_file_path(fragment_id: int, deletion: table_pb2.DeletionFile) -> str:
    ext = "bin" if deletion.file_type == BITMAP else "arrow"
    return f"_deletions/{fragment_id}-{deletion.read_version}-{deletion.id}.{ext}"


class DeletionVector:
    """The deleted physical offsets of one fragment, as a roaring bitmap."""

    def __init__(self, bitmap: BitMap):
        self.bitmap = bitmap

    @classmethod
    def empty(cls) -> DeletionVector:
        return cls(BitMap())

    def __len__(self) -> int:
        return len(self.bitmap)

    def beyond(self, physical_rows: int) -> int:
        """How many deleted offsets lie past the fragment's `physical_rows` rows."""
        if not self.bitmap or self.bitmap.max() < physical_rows:
            return 0
        inside = self.bitmap.rank(physical_rows - 1) if physical_rows else 0
        return len(self.bitmap) - inside

    def clipped(self, physical_rows: int) -> DeletionVector:
        """This vector without offsets past the fragment's `physical_rows` rows."""
        keep = BitMap(self.bitmap)
        keep.remove_range(physical_rows, int(self.bitmap.max()) + 1)
        return DeletionVector(keep)

    def to_numpy(self) -> np.ndarray:
        """Deleted offsets, sorted ascending, as uint32."""
        return np.frombuffer(self.bitmap.to_array(), dtype=np.uint32)

    def live_offsets(self, physical_rows: int) -> np.ndarray:
        """Offsets of the rows that are not deleted (int64, ascending)."""
        keep = np.ones(physical_rows, dtype=bool)
        deleted = self.to_numpy()
        keep[deleted[deleted < physical_rows]] = False
        return np.flatnonzero(keep)

    def logical_offsets(self, physical: np.ndarray) -> np.ndarray:
        """Map physical offsets of live rows to their index among live rows.

        pylance's `LanceFragment.take` addresses rows by that index.
        """
        deleted = self.to_numpy().astype(np.int64)
        physical = np.asarray(physical, dtype=np.int64)
        return physical - np.searchsorted(deleted, physical, side="left")


# Deletion files are small and zstd-compressed: decompressing on Arrow's thread pool costs
# more in hand-offs than it saves (docs/benchmarks.md, "Reading the format")
_IPC_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)


def _decode(data: bytes, file_type: int) -> BitMap:
    """The deleted offsets of a deletion file's bytes.

    `.arrow` files are read by pyarrow's IPC reader only. A hand decoder of pylance's
    layout (flatbuffers, zstd) stood beside it once: it saved a small part of each file's
    decode, at most a few percent of a `read_changes` call or a followed micro-batch
    (docs/benchmarks.md, "Reading the format"), so it went."""
    if file_type == BITMAP:
        return BitMap.deserialize(data)
    values = _offsets_with_pyarrow(data)
    if len(values) > 512:
        # pyroaring adds unsorted values one container search at a time: sorting first
        # costs less (docs/benchmarks.md, "Reading the format")
        values = array.array("I", np.sort(np.frombuffer(values, np.uint32)).tobytes())
    # pyroaring builds from array.array in bulk; from numpy it iterates element by element
    return BitMap(values)


def _offsets_with_pyarrow(data: bytes) -> array.array[int]:
    reader = pa.ipc.open_file(data, options=_IPC_OPTIONS)
    if len(reader.schema) != 1 or not pa.types.is_integer(reader.schema.field(0).type):
        raise ValueError(f"expected one integer column, found {reader.schema}")
    # batch by batch, each batch's column straight to numpy (no table, no chunked column)
    parts = [reader.get_batch(i).column(0) for i in range(reader.num_record_batches)]
    if any(p.null_count for p in parts):
        raise ValueError("the deleted offsets hold nulls")
    values = (
        np.concatenate([p.to_numpy() for p in parts]) if parts else np.zeros(0, np.uint32)
    ).astype(np.uint32, copy=False)
    return array.array("I", values.tobytes())


# What reading damaged bytes raises (found by fuzzing real files with random byte changes,
# insertions and truncations; test_format keeps doing so): pyarrow's IPC reader,
# zstd included, raises pa.ArrowInvalid (a ValueError), OSError (a footer that fails
# verification), UnicodeDecodeError (a ValueError: a field name), ArrowNotImplementedError
# or ArrowMemoryError (pa.ArrowException); `_offsets_with_pyarrow` raises ValueError;
# pyroaring's BitMap.deserialize raises ValueError or IndexError. Anything else would be a
# bug, not a damaged file, and is not reported as one.
_GARBAGE = (ValueError, OSError, IndexError, pa.ArrowException)


def read_deletion_vector(
    fs: FileSystem, fragment_id: int, deletion: table_pb2.DeletionFile | None
) -> DeletionVector:
    """The deletion vector a fragment's manifest entry points to (empty if none)."""
    if deletion is None or deletion.num_deleted_rows == 0 and deletion.id == 0:
        return DeletionVector.empty()
    path = deletion_file_path(fragment_id, deletion)
    try:
        data = fs.read(path)
    except FileNotFoundError:
        raise CorruptFileError(
            f"deletion file {fs.root}/{path} is missing although the manifest lists it; the "
            "table is damaged (files removed by hand?). Restore the file or read other versions."
        ) from None
    try:
        bitmap = _decode(data, deletion.file_type)
    except _GARBAGE as exc:
        raise CorruptFileError(
            f"deletion file {fs.root}/{path} is corrupt or truncated ({exc}); restore it from "
            "a backup or read versions that do not use it."
        ) from None
    if deletion.num_deleted_rows and len(bitmap) != deletion.num_deleted_rows:
        raise CorruptFileError(
            f"deletion file {fs.root}/{path} lists {len(bitmap)} rows but the manifest says "
            f"{deletion.num_deleted_rows}; the file is damaged. Restore it from a backup."
        )
    return DeletionVector(bitmap)
