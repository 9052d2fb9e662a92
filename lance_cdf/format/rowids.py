"""Decode a fragment's row-ID sequence and row-version sequences into numpy.

A `RowIdSequence` lists the stable row ID of each physical row of a fragment,
split into segments (Range, RangeWithHoles, RangeWithBitmap, SortedArray,
Array). A `RowDatasetVersionSequence` run-length encodes one dataset version per
physical row. Everything here is vectorised: no Python loop runs per row.
"""

from __future__ import annotations

from typing import TypeVar, cast

import numpy as np
from google.protobuf.message import DecodeError, Message

from lance_cdf.errors import CorruptFileError
from lance_cdf.format._proto import rowids_pb2

try:  # Range-only sequences read in C (setup.py; optional: protobuf reads them without)
    from lance_cdf.format import _decode as _native
except ImportError:  # pragma: no cover - built wherever a C compiler is present
    _native = None  # type: ignore[assignment]  # (mypy: a module or None, by design)

# Message is Any to mypy (protobuf ships no stubs); the bound documents the intent
_M = TypeVar("_M", bound=Message)

U64 = np.uint64
EMPTY_U64 = np.zeros(0, dtype=U64)


def decode_u64_array(msg: rowids_pb2.EncodedU64Array) -> np.ndarray:
    """An `EncodedU64Array` (base+u16, base+u32 or raw u64, little endian) as uint64."""
    kind = msg.WhichOneof("array")
    if kind == "u16_array":
        return np.frombuffer(msg.u16_array.offsets, dtype="<u2").astype(U64) + U64(
            msg.u16_array.base
        )
    if kind == "u32_array":
        return np.frombuffer(msg.u32_array.offsets, dtype="<u4").astype(U64) + U64(
            msg.u32_array.base
        )
    if kind == "u64_array":
        return np.frombuffer(msg.u64_array.values, dtype="<u8").astype(U64)
    return EMPTY_U64


def _bitmap_mask(bitmap: bytes, n: int) -> np.ndarray:
    """Bits of a RangeWithBitmap bitmap as n booleans.

    The format documents and rowids.proto say the most significant bit of each
    byte is the first value, but Lance writes (and reads) bit `i % 8` of byte
    `i // 8` -- least significant bit first. Files are the authority: a
    fragment written by pylance 14 with start=100 has byte 0 = 0x01 for
    value 100. So this decodes LSB-first.
    """
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    if bits.size < n:
        bits = np.concatenate([bits, np.zeros(n - bits.size, dtype=np.uint8)])
    return bits[:n].astype(bool)


def segment_values(seg: rowids_pb2.U64Segment) -> np.ndarray:
    """All values of one segment, in order, as uint64."""
    kind = seg.WhichOneof("segment")
    if kind == "range":
        return np.arange(seg.range.start, seg.range.end, dtype=U64)
    if kind == "range_with_holes":
        r = seg.range_with_holes
        values = np.arange(r.start, r.end, dtype=U64)
        holes = decode_u64_array(r.holes)
        if holes.size == 0:
            return values
        keep = np.ones(values.size, dtype=bool)
        keep[(holes - U64(r.start)).astype(np.int64)] = False
        return values[keep]
    if kind == "range_with_bitmap":
        r = seg.range_with_bitmap
        n = r.end - r.start
        return cast(np.ndarray, np.arange(r.start, r.end, dtype=U64)[_bitmap_mask(r.bitmap, n)])
    if kind == "sorted_array":
        return decode_u64_array(seg.sorted_array)
    if kind == "array":
        return decode_u64_array(seg.array)
    return EMPTY_U64


def segment_len(seg: rowids_pb2.U64Segment) -> int:
    """Number of values in a segment, without materialising range-like ones."""
    kind = seg.WhichOneof("segment")
    if kind == "range":
        return seg.range.end - seg.range.start
    if kind == "range_with_holes":
        r = seg.range_with_holes
        return r.end - r.start - decode_u64_array(r.holes).size
    if kind == "range_with_bitmap":
        r = seg.range_with_bitmap
        return int(_bitmap_mask(r.bitmap, r.end - r.start).sum())
    return segment_values(seg).size


def _parse(message: _M, data: bytes, source: str) -> _M:
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise CorruptFileError(
            f"{source} is corrupt: {type(message).__name__} does not decode ({exc}). "
            "The table's files were damaged or truncated; restore them from a backup or "
            "read a version written after the damage."
        ) from None
    return message


def _range_segments(data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """(starts, ends) of a serialized `RowIdSequence` made only of `Range` segments, read in
    C (_decode.c); None for any other shape, or where the C reader is not built: the
    protobuf parser then reads it segment by segment.

    pylance writes one single-row Range per row for the rows a scattered `merge_insert`
    rewrote: a 1,000-row update carries 1,000 segments, and the manifests of a table with
    such a history carry megabytes of them: protobuf's objects per segment, or a numpy
    reader, cost far more than the C reader (docs/benchmarks.md, "Reading the format")."""
    if _native is None:
        return None
    ranges = _native.range_segments(data)
    if ranges is None:
        return None
    return np.frombuffer(ranges[0], dtype=U64), np.frombuffer(ranges[1], dtype=U64)


class RowIdSequence:
    """The stable row IDs of a fragment's physical rows, offset by offset."""

    def __init__(self, segments: list[rowids_pb2.U64Segment]):
        # None when built from bytes without protobuf objects (from_ranges)
        self.segments: list[rowids_pb2.U64Segment] | None = segments
        self._values: np.ndarray | None = None
        if all(s.WhichOneof("segment") == "range" for s in segments):
            starts = np.array([s.range.start for s in segments], dtype=U64)
            ends = np.array([s.range.end for s in segments], dtype=U64)
            self._init_ranges(starts, ends)
        else:
            lengths = np.array([segment_len(s) for s in segments], dtype=np.int64)
            self._starts = np.concatenate([[0], np.cumsum(lengths)])
            self._range_starts: np.ndarray | None = None

    def _init_ranges(self, starts: np.ndarray, ends: np.ndarray) -> None:
        # a sequence of ranges answers by arithmetic: no array of every row ID
        self._range_starts = starts
        self._starts = np.concatenate([[0], np.cumsum((ends - starts).astype(np.int64))])

    @classmethod
    def from_ranges(cls, starts: np.ndarray, ends: np.ndarray) -> RowIdSequence:
        seq = cls.__new__(cls)
        seq.segments = None  # built from bytes without protobuf objects
        seq._values = None
        seq._init_ranges(starts, ends)
        return seq

    @classmethod
    def from_values(cls, values: np.ndarray) -> RowIdSequence:
        """The sequence of the row IDs `values` (uint64, one per physical row): a spilled
        sequence, read from its data-file column."""
        seq = cls.__new__(cls)
        seq.segments = None
        seq._values = np.asarray(values, dtype=U64)
        seq._range_starts = None
        seq._starts = np.array([0, seq._values.size], dtype=np.int64)
        return seq

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "row-ID sequence") -> RowIdSequence:
        ranges = _range_segments(data)
        if ranges is not None:
            return cls.from_ranges(*ranges)
        return cls(list(_parse(rowids_pb2.RowIdSequence(), data, source).segments))

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def single_range_start(self) -> int | None:
        """The first row ID if the sequence is one range (row ID = start + offset)."""
        r = self._range_starts
        return int(r[0]) if r is not None and r.size == 1 else None

    def to_numpy(self) -> np.ndarray:
        """Row ID of every physical row (uint64, length = physical rows)."""
        if self._values is None:
            if self._range_starts is not None:
                lengths = np.diff(self._starts)
                # each row: its segment's first row ID + its offset from the segment's start
                base = self._range_starts - self._starts[:-1].astype(U64)  # wraps, then back
                self._values = np.repeat(base, lengths) + np.arange(len(self), dtype=U64)
            else:
                if self.segments is None:  # from_ranges always sets _range_starts
                    raise AssertionError("RowIdSequence has neither ranges nor segments")
                parts = [segment_values(s) for s in self.segments]
                self._values = np.concatenate(parts) if parts else EMPTY_U64
        return self._values

    def values_at(self, offsets: np.ndarray) -> np.ndarray:
        """Row IDs at the given physical offsets.

        Range segments answer arithmetically, so a few offsets into a huge
        fragment cost nothing like the fragment's size.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.size and (offsets.min() < 0 or offsets.max() >= len(self)):
            raise IndexError("offset outside the fragment's row-ID sequence")
        if self._values is not None:
            return cast(np.ndarray, self._values[offsets])
        if self._range_starts is not None:
            if self._range_starts.size == 1:
                return cast(np.ndarray, self._range_starts[0] + offsets.astype(U64))
            seg = np.searchsorted(self._starts, offsets, side="right") - 1
            ids = self._range_starts[seg] + (offsets - self._starts[seg]).astype(U64)
            return cast(np.ndarray, ids)
        return cast(np.ndarray, self.to_numpy()[offsets])


class VersionSequence:
    """The dataset version of each physical row (created-at or last-updated)."""

    def __init__(self, lengths: np.ndarray, versions: np.ndarray):
        self.lengths = lengths.astype(np.int64)
        self.versions = versions.astype(U64)
        self._ends = np.cumsum(self.lengths)

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "version sequence") -> VersionSequence:
        msg = _parse(rowids_pb2.RowDatasetVersionSequence(), data, source)
        lengths = np.array([segment_len(r.span) for r in msg.runs], dtype=np.int64)
        versions = np.array([r.version for r in msg.runs], dtype=U64)
        return cls(lengths, versions)

    @classmethod
    def from_values(cls, values: np.ndarray) -> VersionSequence:
        """The run-length form of `values` (one version per physical row): a spilled
        sequence, read from its data-file column."""
        values = np.asarray(values, dtype=U64)
        if values.size == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, U64))
        starts = np.concatenate([[0], np.flatnonzero(np.diff(values)) + 1])
        lengths = np.diff(np.concatenate([starts, [values.size]]))
        return cls(lengths, values[starts])

    @classmethod
    def uniform(cls, num_rows: int, version: int) -> VersionSequence:
        """Every row at one version (Lance's reading of a missing sequence uses 1)."""
        return cls(np.array([num_rows]), np.array([version]))

    def __len__(self) -> int:
        return int(self._ends[-1]) if self._ends.size else 0

    @property
    def single_version(self) -> int | None:
        """The version of every row if the sequence is one run."""
        return int(self.versions[0]) if self.versions.size == 1 else None

    def to_numpy(self) -> np.ndarray:
        return np.repeat(self.versions, self.lengths)

    def values_at(self, offsets: np.ndarray) -> np.ndarray:
        """Versions at the given physical offsets, in O(runs + offsets)."""
        run = np.searchsorted(self._ends, np.asarray(offsets, dtype=np.int64), side="right")
        if run.size and run.max() >= self.versions.size:
            raise IndexError("offset outside the fragment's version sequence")
        return self.versions[run]
