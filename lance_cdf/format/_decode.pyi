"""Types of `lance_cdf.format._decode`, the C extension setup.py builds."""

from mmap import mmap

_Bytes = bytes | bytearray | memoryview | mmap

def range_segments(data: _Bytes, /) -> tuple[bytes, bytes] | None: ...
def manifest_entries(
    data: _Bytes, start: int, end: int, /
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]] | None: ...
def same_bytes(a: _Bytes, b: _Bytes, /) -> bool: ...
