"""File access for a table root, behind one small interface.

The format layer only ever reads whole small files, byte ranges and directory
listings relative to the table root; the object-store backend (`ObjectStoreFileSystem`)
implements the same four methods and nothing above this module changes.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol
from urllib.parse import unquote, urlparse

from lance_cdf.errors import TableNotFoundError

# Files at least this large are memory-mapped by `read_mapped` (below it a read is cheaper)
_MAP_AT_LEAST = 1 << 20


class FileSystem(Protocol):
    """Read-only access to files under a table root (paths are relative)."""

    root: str

    def read(self, path: str) -> bytes: ...

    def read_range(self, path: str, offset: int, size: int) -> bytes: ...

    def list_dir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...


class LocalFileSystem:
    """A table on the local disk."""

    def __init__(self, root: str):
        self.root = root

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path)

    def read(self, path: str) -> bytes:
        # os-level calls: cheaper than open() for the small files planning reads
        # (deletion files, manifests; docs/benchmarks.md, "Reading the format")
        fd = os.open(self._full(path), os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            size = os.fstat(fd).st_size
            data = os.read(fd, size)
            if len(data) < size:  # short read (large files, some filesystems): the rest
                rest = [data]
                while chunk := os.read(fd, 1 << 20):
                    rest.append(chunk)
                data = b"".join(rest)
            return data
        finally:
            os.close(fd)

    @contextmanager
    def read_mapped(self, path: str) -> Iterator[bytes | mmap.mmap]:
        """The bytes of `path`, memory-mapped when it is large, for the duration of the
        block (for a parser that copies what it keeps). Reading a large manifest into a new
        bytes object costs more in page faults and copying than parsing it
        (docs/benchmarks.md, "Reading the format")."""
        fd = os.open(self._full(path), os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            size = os.fstat(fd).st_size
            if size < _MAP_AT_LEAST:
                data = os.read(fd, size)
                if len(data) < size:  # a short read: the whole file the usual way
                    data = self.read(path)
                yield data
                return
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)  # the mapping stays valid without the descriptor
        try:
            yield mapped
        finally:
            try:
                mapped.close()
            except BufferError:  # a view of it is still alive: closed when collected
                pass

    def read_range(self, path: str, offset: int, size: int) -> bytes:
        with open(self._full(path), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def list_dir(self, path: str) -> list[str]:
        try:
            return os.listdir(self._full(path))
        except FileNotFoundError:
            return []

    def exists(self, path: str) -> bool:
        return os.path.exists(self._full(path))


def local_path(uri: str) -> str | None:
    """The local filesystem path of `uri`, or None when it names an object store."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and uri[1:3] in (":\\", ":/")):
        if parsed.scheme == "file":
            return unquote(parsed.path)
        return os.path.abspath(uri)
    return None


def open_filesystem(uri: str, storage_options: dict[str, str] | None = None) -> FileSystem:
    """The filesystem holding the table at `uri`: a local path or `file://` URI, or an
    object-store URI (s3://, gs://, az://, ...) read with `storage_options`."""
    path = local_path(uri)
    if path is None:
        from lance_cdf.format.objectstore import ObjectStoreFileSystem, store_arguments

        store_arguments(uri, storage_options)  # unknown scheme -> UnsupportedStorageError
        return ObjectStoreFileSystem(uri, storage_options)
    if not os.path.isdir(path):
        raise TableNotFoundError(
            f"no Lance table at {uri!r}: the directory does not exist. Check the path "
            "(it should be the directory that contains _versions/)."
        )
    return LocalFileSystem(path)
