"""Deletion files: which physical offsets of a fragment are deleted.

`_deletions/{fragment_id}-{read_version}-{id}.arrow` holds an Arrow IPC file
with one 32-bit integer column (pylance 14: a non-null UInt32 `row_id`, one
record batch, zstd-compressed buffers or stored ones where zstd does not pay);
`.bin` holds a portable 32-bit roaring bitmap.
"""

from __future__ import annotations

import array
import struct

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
# more in hand-offs than it saves (63 vs 99 us per file, best of 5, pyarrow 26)
_IPC_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)


def _decode(data: bytes, file_type: int, path: str) -> BitMap:
    if file_type == BITMAP:
        return BitMap.deserialize(data)
    values = _offsets_by_hand(data)
    if values is None:  # a layout the hand decoder does not know: pyarrow's reader
        values = _offsets_with_pyarrow(data)
    if len(values) > 512:
        # pyroaring adds unsorted values one container search at a time: sorting first
        # costs less (1,200 offsets: 110 -> 67 us; 5,000: 790 -> 160 us)
        values = array.array("I", np.sort(np.frombuffer(values, np.uint32)).tobytes())
    # pyroaring builds from array.array in bulk; from numpy it iterates element by element
    return BitMap(values)


def _offsets_with_pyarrow(data: bytes) -> array.array:
    reader = pa.ipc.open_file(data, options=_IPC_OPTIONS)
    if len(reader.schema) != 1:
        raise ValueError(f"expected one column, found {len(reader.schema)}")
    # batch by batch, each batch's column straight to numpy (no table, no chunked column)
    parts = [reader.get_batch(i).column(0) for i in range(reader.num_record_batches)]
    if any(p.null_count for p in parts):
        raise ValueError("the deleted offsets hold nulls")
    values = (
        np.concatenate([p.to_numpy() for p in parts]) if parts else np.zeros(0, np.uint32)
    ).astype(np.uint32, copy=False)
    return array.array("I", values.tobytes())


# -- the Arrow IPC file of an `.arrow` deletion file, read by hand ----------------------
# pyarrow's IPC reader costs ~60-190 us per file (reader, schema, batch objects); the file
# pylance writes is one 32-bit integer column without nulls in one or a few record batches,
# its buffers zstd-compressed or stored. `_offsets_by_hand` reads exactly that layout from
# the flatbuffers of the footer and the batch messages (format/Schema.fbs, Message.fbs,
# File.fbs of Arrow) and returns None for anything else (other types, nulls, other codecs,
# dictionaries, big-endian, ...), which then goes to pyarrow: never a guess.

_ARROW_MAGIC = b"ARROW1"
_HEADER_RECORD_BATCH = 3
_TYPE_INT = 2
_CODEC_ZSTD = 1
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_I64 = struct.Struct("<q").unpack_from
_U16 = struct.Struct("<H").unpack_from
_I16 = struct.Struct("<h").unpack_from
_BLOCK = struct.Struct("<qi4xq").unpack_from  # struct Block { offset, metaDataLength, bodyLength }
_NODE_BUFFERS = struct.Struct("<qqqqqq").unpack_from  # FieldNode, then 2 Buffer structs
_SLOT_OFFSETS = [struct.Struct(f"<{n}H").unpack_from for n in range(8)]


class _Unknown(Exception):
    """The bytes are not the one layout the hand decoder reads."""


def _table(buf: bytes, ref: int) -> int:
    """The position of the flatbuffer table an offset field at `ref` points to."""
    return ref + _U32(buf, ref)[0]


def _slots(buf: bytes, pos: int, count: int) -> list[int]:
    """Absolute positions of fields 0..count-1 of the table at `pos` (0: absent)."""
    vt = pos - _I32(buf, pos)[0]
    have = min(count, (_U16(buf, vt)[0] - 4) // 2)
    offsets = _SLOT_OFFSETS[have](buf, vt + 4) if have > 0 else ()
    out = [pos + o if o else 0 for o in offsets]
    return out + [0] * (count - len(out))


def _check_schema(buf: bytes, schema: int) -> None:
    """One field, an unsigned 32-bit integer, no dictionary, no children, little-endian."""
    endianness, fields = _slots(buf, schema, 2)
    if endianness and _I16(buf, endianness)[0] != 0:  # 0: Little (the default)
        raise _Unknown
    if not fields:
        raise _Unknown
    fields = _table(buf, fields)
    if _U32(buf, fields)[0] != 1:
        raise _Unknown
    _, _, type_type, type_, dictionary, children = _slots(buf, _table(buf, fields + 4), 6)
    if not type_type or buf[type_type] != _TYPE_INT or dictionary or not type_:
        raise _Unknown
    if children and _U32(buf, _table(buf, children))[0]:
        raise _Unknown
    bit_width, signed = _slots(buf, _table(buf, type_), 2)
    if not bit_width or _I32(buf, bit_width)[0] != 32:
        raise _Unknown
    if signed and buf[signed]:  # signed: negative values would not be offsets
        raise _Unknown


def _buffer(data: bytes, start: int, end: int, compressed: bool) -> bytes | memoryview:
    """The bytes of one body buffer, decompressed."""
    view = memoryview(data)[start:end]
    if not compressed or not len(view):
        return view
    if len(view) < 8:
        raise _Unknown
    size = _I64(data, start)[0]
    if size == -1:  # stored uncompressed
        return view[8:]
    if size < 0:
        raise _Unknown
    # a codec per call (~1 us): the one-shot call needs no shared state between the
    # threads that fetch deletion files from object storage
    return pa.decompress(view[8:], decompressed_size=size, codec="zstd", asbytes=True)


def _offsets_by_hand(data: bytes) -> array.array | None:
    try:
        return _read_ipc_file(data)
    except (_Unknown, struct.error, IndexError, ValueError, OSError, MemoryError,
            pa.ArrowException):  # fmt: skip
        return None


def _read_ipc_file(data: bytes) -> array.array:
    size = len(data)
    if size < 24 or data[:6] != _ARROW_MAGIC or data[-6:] != _ARROW_MAGIC:
        raise _Unknown
    footer_len = _I32(data, size - 10)[0]
    footer_pos = size - 10 - footer_len
    if footer_len <= 0 or footer_pos < 8:
        raise _Unknown
    # table Footer { version, schema, dictionaries: [Block], recordBatches: [Block] }
    _, schema, dictionaries, batches = _slots(data, _table(data, footer_pos), 4)
    if not schema or (dictionaries and _U32(data, _table(data, dictionaries))[0]):
        raise _Unknown
    _check_schema(data, _table(data, schema))
    if not batches:
        raise _Unknown
    batches = _table(data, batches)
    n_batches = _U32(data, batches)[0]
    if not n_batches:
        raise _Unknown
    out = array.array("I")
    for i in range(n_batches):
        offset, meta_len, body_len = _BLOCK(data, batches + 4 + 24 * i)
        body = offset + meta_len
        if offset < 8 or meta_len < 8 or body_len < 0 or body + body_len > footer_pos:
            raise _Unknown
        # an encapsulated message: 0xFFFFFFFF, the flatbuffer's length, the flatbuffer
        if _U32(data, offset)[0] != 0xFFFFFFFF or _I32(data, offset + 4)[0] + 8 > meta_len:
            raise _Unknown
        # table Message { version, header_type, header, bodyLength, custom_metadata }
        _, header_type, header, length = _slots(data, _table(data, offset + 8), 4)
        if not header_type or data[header_type] != _HEADER_RECORD_BATCH or not header:
            raise _Unknown
        if not length or _I64(data, length)[0] != body_len:
            raise _Unknown
        # table RecordBatch { length, nodes, buffers, compression, variadicBufferCounts }
        rows, nodes, buffers, compression, variadic = _slots(data, _table(data, header), 5)
        rows = _I64(data, rows)[0] if rows else 0
        if not nodes or not buffers or rows < 0:
            raise _Unknown
        if variadic and _U32(data, _table(data, variadic))[0]:
            raise _Unknown
        nodes, buffers = _table(data, nodes), _table(data, buffers)
        if _U32(data, nodes)[0] != 1 or _U32(data, buffers)[0] != 2:
            raise _Unknown
        node_rows, nulls = _NODE_BUFFERS(data, nodes + 4)[:2]
        start, length = _NODE_BUFFERS(data, buffers + 4)[2:4]  # the values (after validity)
        if node_rows != rows or nulls:
            raise _Unknown  # a node length other than the batch's, or nulls
        if compression:
            codec, method = _slots(data, _table(data, compression), 2)
            # BodyCompression { codec: default LZ4_FRAME, method: default BUFFER }
            if not codec or data[codec] != _CODEC_ZSTD or (method and data[method] != 0):
                raise _Unknown
        if start < 0 or length < 0 or start + length > body_len or (body | start) % 8:
            raise _Unknown
        values = _buffer(data, body + start, body + start + length, bool(compression))
        if len(values) < 4 * rows:
            raise _Unknown
        out.frombytes(values[: 4 * rows])
    return out


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
        bitmap = _decode(data, deletion.file_type, path)
    except Exception as exc:  # pyarrow / pyroaring raise several types on garbage
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
