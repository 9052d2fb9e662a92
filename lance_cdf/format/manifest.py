"""Parse a Lance manifest file into the facts the change feed needs.

File layout (little endian): ... | u32 length | Manifest protobuf | ... |
u64 position | u16 major | u16 minor | "LANC"; `position` points at the length.
The transaction that made the version is either inline (`transaction_position`,
field 23, written by pylance 14, or the older `transaction_section`; same
u32-length framing) or in `_transactions/{transaction_file}`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import cast

from google.protobuf.message import DecodeError

from lance_cdf.errors import CorruptFileError
from lance_cdf.format._proto import file_pb2, table_pb2, transaction_pb2
from lance_cdf.format.deletions import deletion_file_path
from lance_cdf.format.operations import Operation

try:  # planning's byte readers in C (setup.py; optional: protobuf parses everything without)
    from lance_cdf.format import _decode as _native
except ImportError:  # pragma: no cover - built wherever a C compiler is present
    _native = None  # type: ignore[assignment]  # (mypy: a module or None, by design)

MAGIC = b"LANC"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FOOTER = 16
FLAG_DELETION_FILES = 1
FLAG_STABLE_ROW_IDS = 2
FLAG_SPILLED_ROW_LINEAGE = 2048
# Reader feature flags (Lance's feature_flags) lance-cdf reads correctly: deletion files,
# stable row IDs, the retired v2-format bit, base paths (other bases are read through
# pylance), covering index metadata and mixed data file versions (indexes and data files
# are pylance's to read), spilled row lineage. Any other bit is refused by name.
KNOWN_READER_FLAGS = 1 | 2 | 4 | 16 | 128 | 256 | FLAG_SPILLED_ROW_LINEAGE
READER_FLAG_NAMES = {
    64: "data overlay files",
    512: "a fragment reuse index with stable row IDs",
    1024: "a fragment reuse index",
}
# The hidden data-file columns of spilled row lineage, by sequence: (the reserved field
# id in a data file's `fields`, the column's name)
LINEAGE_COLUMNS = {
    "row_id_sequence": (-3, "_rowid"),
    "created_at_version_sequence": (-4, "_row_created_at_version"),
    "last_updated_at_version_sequence": (-5, "_row_last_updated_at_version"),
}

# Transaction oneof field name -> the operation name pylance uses.
OPERATION_NAMES = {
    "append": Operation.APPEND,
    "delete": Operation.DELETE,
    "overwrite": Operation.OVERWRITE,
    "create_index": Operation.CREATE_INDEX,
    "rewrite": Operation.REWRITE,
    "merge": Operation.MERGE,
    "restore": Operation.RESTORE,
    "reserve_fragments": Operation.RESERVE_FRAGMENTS,
    "update": Operation.UPDATE,
    "project": Operation.PROJECT,
    "update_config": Operation.UPDATE_CONFIG,
    "data_replacement": Operation.DATA_REPLACEMENT,
    "update_mem_wal_state": Operation.UPDATE_MEM_WAL_STATE,
    "clone": Operation.CLONE,
    "update_bases": Operation.UPDATE_BASES,
}


def _corrupt(path: str, why: str) -> CorruptFileError:
    return CorruptFileError(
        f"manifest {path} is corrupt: {why}. The version cannot be read; restore the file from "
        "a backup, or read a range that does not include this version."
    )


def _framed(data: bytes | mmap.mmap, pos: int, path: str, what: str) -> memoryview:
    """The u32-length-prefixed message at `pos` (a view: protobuf parses it without a
    copy of what can be megabytes; docs/benchmarks.md, "Reading the format")."""
    if pos + 4 > len(data):
        raise _corrupt(path, f"{what} position {pos} is past the end of the file")
    (length,) = struct.unpack_from("<I", data, pos)
    if pos + 4 + length > len(data):
        raise _corrupt(path, f"{what} of {length} bytes at {pos} runs past the end of the file")
    return memoryview(data)[pos + 4 : pos + 4 + length]


class FragmentInfo:
    """One fragment entry of a manifest: a parsed `DataFragment`, or the entry's bytes in
    the manifest file, parsed when first looked into. A diff compares the bytes of two
    manifests' entries and never parses the ones a commit left alone: on a table whose
    history left megabytes of row-ID ranges inline, that is most of reading a manifest
    (see `parse_manifest`)."""

    __slots__ = ("_proto", "raw", "_id", "source", "__dict__")

    def __init__(
        self,
        proto: table_pb2.DataFragment | None = None,
        raw: memoryview | None = None,
        id: int | None = None,
        source: str = "<manifest>",
    ):
        if proto is None and raw is None:
            raise ValueError("a FragmentInfo needs its DataFragment or its bytes")
        self._proto = proto
        self.raw = raw  # the entry's bytes in its manifest file (None: built from a message)
        self._id = id if id is not None else (proto.id if proto is not None else None)
        self.source = source  # the manifest file, for errors

    def __repr__(self) -> str:
        return f"FragmentInfo(id={self.id})"

    @property
    def proto(self) -> table_pb2.DataFragment:
        proto = self._proto
        if proto is None:
            try:
                proto = table_pb2.DataFragment.FromString(self.raw)
            except DecodeError as exc:
                raise _corrupt(
                    self.source, f"the entry of fragment {self._id} does not decode ({exc})"
                ) from None
            self._proto = proto
        return proto

    @property
    def id(self) -> int:
        if self._id is None:
            self._id = self.proto.id
        return self._id

    def same_entry(self, other: FragmentInfo) -> bool:
        """Whether the two entries are the same message (same rows, versions, deletions,
        data files, unknown fields): equal bytes are, and so are unequal bytes that parse
        to equal messages (another writer's field order)."""
        if self.raw is not None and other.raw is not None and _same_bytes(self.raw, other.raw):
            return True
        return self.proto == other.proto

    @property
    def physical_rows(self) -> int:
        return self.proto.physical_rows

    @property
    def deletion(self) -> table_pb2.DeletionFile | None:
        memo = self.__dict__
        if "_deletion" not in memo:
            has = self.proto.HasField("deletion_file")
            memo["_deletion"] = self.proto.deletion_file if has else None
        return cast("table_pb2.DeletionFile | None", memo["_deletion"])

    @property
    def deletion_path(self) -> str | None:
        """`_deletions/...` path of the entry's deletion file (None: no deletion file); kept
        on the entry: planning asks for it several times per changed fragment."""
        memo = self.__dict__
        if "_deletion_path" not in memo:
            d = self.deletion
            memo["_deletion_path"] = None if d is None else deletion_file_path(self.id, d)
        return cast("str | None", memo["_deletion_path"])

    @property
    def num_deleted(self) -> int:
        d = self.deletion
        return d.num_deleted_rows if d is not None else 0

    def key(self) -> bytes:
        """Identity of the whole entry: equal keys mean identical rows, versions, deletions
        (its bytes in the manifest, or its serialization). Kept on the entry (manifests are
        cached, so each entry is copied or serialized once)."""
        key = self.__dict__.get("_key")
        if key is None:
            if self.raw is not None:
                key = bytes(self.raw)
            else:
                key = self.proto.SerializeToString(deterministic=True)
            self.__dict__["_key"] = key
        return key

    @property
    def has_version_sequence(self) -> bool:
        """Whether the entry records its rows' last-updated versions (pylance 0.33.0 to
        0.38.2 kept stable row IDs without them)."""
        return self.proto.WhichOneof("last_updated_at_version_sequence") is not None

    @property
    def data_files(self) -> tuple[str, ...]:
        files = self.__dict__.get("_data_files")
        if files is None:
            files = self.__dict__["_data_files"] = tuple(f.path for f in self.proto.files)
        return files

    def sequence(
        self, oneof: str
    ) -> tuple[str | None, bytes | table_pb2.ExternalFile | tuple[str, ...] | None]:
        """(field name, value) of the entry's `oneof` sequence: inline bytes, an external
        file range, or (spilled row lineage, a `column_*` arm) the paths of the data files
        whose `fields` hold the sequence's reserved field id (exactly one, unless the entry
        is damaged); (None, None) if absent. Kept on the entry: protobuf copies a bytes
        field at every access (megabytes for a history of single-row ranges), and the copy
        is hashed again as a cache key each time."""
        memo = self.__dict__.setdefault("_sequences", {})
        got = memo.get(oneof)
        if got is None:
            name = self.proto.WhichOneof(oneof)
            if name is not None and name.startswith("column_"):
                fid = LINEAGE_COLUMNS[oneof][0]
                paths = tuple(f.path for f in self.proto.files if fid in f.fields)
                got = memo[oneof] = (name, paths)
            else:
                got = memo[oneof] = (name, getattr(self.proto, name) if name else None)
        return cast(
            "tuple[str | None, bytes | table_pb2.ExternalFile | tuple[str, ...] | None]", got
        )

    def same_lineage(self, other: FragmentInfo) -> bool:
        """Whether `other` has the same id, rows, row IDs and versions (its deletion file
        aside), compared field by field in protobuf's C code (a scattered change's
        entries carry kilobytes of row-ID ranges). Two entries that keep a sequence in
        different places (inline, in a file) count as different lineages."""
        a, b = self.proto, other.proto
        if a.id != b.id or a.physical_rows != b.physical_rows:
            return False
        for oneof in ("row_id_sequence", "last_updated_at_version_sequence"):
            # (name, value) kept on each entry: the plan reads the same bytes next
            if self.sequence(oneof) != other.sequence(oneof):
                return False
        return True

    def same_data_files(self, other: FragmentInfo) -> bool:
        """Whether both entries list the same data file paths, in order."""
        if self.proto.files == other.proto.files:  # equal entries: equal paths, in C
            return True
        return self.data_files == other.data_files


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest of one table version."""

    path: str
    proto: table_pb2.Manifest = field(repr=False)
    # the transaction from its own file under _transactions/ (TableLog fetches it)
    external_transaction: transaction_pb2.Transaction | None = field(repr=False, default=None)
    # the bytes of the transaction inside the manifest, parsed when first asked for
    inline_transaction: bytes | None = field(repr=False, default=None)
    # an inline transaction left out by parse_manifest(transaction=False): the base version
    # of a diff never needs it, and a large commit's is megabytes
    transaction_skipped: bool = field(repr=False, default=False)
    # the fragment entries as bytes of the file (then `proto` holds every other field);
    # None: they are `proto.fragments`
    entries: tuple[FragmentInfo, ...] | None = field(repr=False, default=None)

    @cached_property
    def transaction(self) -> transaction_pb2.Transaction | None:
        if self.external_transaction is not None:
            return self.external_transaction
        if self.inline_transaction is None:
            return None
        return parse_transaction(self.inline_transaction, self.path)

    @property
    def needs_transaction_file(self) -> bool:
        """Whether the operation is only in a `_transactions/` file not fetched yet."""
        return (
            bool(self.proto.transaction_file)
            and self.external_transaction is None
            and self.inline_transaction is None
            and not self.transaction_skipped
        )

    @property
    def version(self) -> int:
        return self.proto.version

    @property
    def timestamp(self) -> datetime:
        return EPOCH + timedelta(microseconds=self.timestamp_us)  # exact, no float rounding

    @property
    def timestamp_us(self) -> int:
        ts = self.proto.timestamp
        return cast(int, ts.seconds * 1_000_000 + ts.nanos // 1000)

    @property
    def next_row_id(self) -> int:
        return self.proto.next_row_id

    @property
    def reader_feature_flags(self) -> int:
        return self.proto.reader_feature_flags

    @property
    def writer(self) -> str:
        """The library and release that wrote this version, e.g. "lance 0.36.0"."""
        w = self.proto.writer_version
        if not w.library and not w.version:
            return "an unrecorded writer"
        return f"{w.library or 'lance'} {w.version}".strip()

    @property
    def stable_row_ids(self) -> bool:
        return bool(self.proto.reader_feature_flags & FLAG_STABLE_ROW_IDS)

    @property
    def fields(self) -> list[file_pb2.Field]:
        return list(self.proto.fields)

    @cached_property
    def top_level_columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.proto.fields if f.parent_id == -1)

    def schema_key(self) -> bytes:
        """Identity of the schema: equal keys mean the same columns and types."""
        return b"".join(f.SerializeToString(deterministic=True) for f in self.proto.fields)

    @cached_property
    def fragments(self) -> list[FragmentInfo]:
        if self.entries is not None:
            return list(self.entries)
        return [FragmentInfo(f, source=self.path) for f in self.proto.fragments]

    def whole_proto(self) -> table_pb2.Manifest:
        """The Manifest message with its fragment entries (parsing those not parsed yet)."""
        if self.entries is None:
            return self.proto
        whole = table_pb2.Manifest()
        whole.CopyFrom(self.proto)
        whole.fragments.extend(f.proto for f in self.entries)
        return whole

    @cached_property
    def fragment_map(self) -> dict[int, FragmentInfo]:
        """Fragment entries by id (built once per cached manifest)."""
        return {f.id: f for f in self.fragments}

    @property
    def transaction_file(self) -> str:
        return self.proto.transaction_file

    @property
    def operation(self) -> str:
        """Name of the operation that made this version ("Unknown" if not recorded): the
        plain string (plan summaries print it), equal to its `Operation`."""
        t = self.transaction
        kind = t.WhichOneof("operation") if t is not None else None
        return OPERATION_NAMES.get(kind or "", Operation.UNKNOWN).value

    @property
    def restored_version(self) -> int | None:
        t = self.transaction
        if t is not None and t.WhichOneof("operation") == "restore":
            return t.restore.version
        return None


def parse_transaction(data: bytes, path: str) -> transaction_pb2.Transaction:
    try:
        return cast(transaction_pb2.Transaction, transaction_pb2.Transaction.FromString(data))
    except DecodeError as exc:
        raise CorruptFileError(
            f"transaction {path} is corrupt ({exc}); its operation cannot be named. Restore "
            "the file from a backup."
        ) from None


def parse_manifest(
    data: bytes | mmap.mmap, path: str = "<manifest>", transaction: bool = True
) -> Manifest:
    """Parse a manifest file (the inline transaction included, if any, unless
    `transaction=False`: then `transaction_skipped` says one was left out).

    Where the C reader is built, the fragment entries are not parsed here: each keeps its
    bytes (a view of `data`) and is parsed when first looked into. A table whose history
    left 100,000-row scattered changes has megabytes of inline row-ID ranges in every
    manifest; a diff of two such manifests then compares their entries' bytes and parses
    only the entries that differ (a fresh `read_changes` of a small commit then takes less
    time than with protobuf's whole parse: docs/benchmarks.md, "Reading the format").
    A body whose top level does not read as plain records, or any body
    where the C reader is not built, is parsed whole by protobuf, which names the damage."""
    if len(data) < FOOTER:
        raise _corrupt(path, f"it is {len(data)} bytes, shorter than the 16-byte footer")
    pos, major, minor, magic = struct.unpack_from("<QHH4s", data, len(data) - FOOTER)
    if magic != MAGIC:
        raise _corrupt(path, f"the footer magic is {magic!r}, not b'LANC' (truncated file?)")
    body = _framed(data, pos, path, "manifest")
    at = pos + 4
    spans = _manifest_entries(data, at, at + len(body))
    entries = None
    try:
        if spans is None:
            proto = table_pb2.Manifest.FromString(body)
        else:
            view = memoryview(data)
            proto = table_pb2.Manifest.FromString(b"".join(view[s:e] for s, e in spans[1]))
            entries = tuple(
                FragmentInfo(raw=view[s:e], id=fid, source=path) for fid, s, e in spans[0]
            )
    except DecodeError as exc:
        raise _corrupt(path, f"the Manifest protobuf does not decode ({exc})") from None
    section, skipped = None, False
    # pylance 14 announces the inline transaction with field 23 (its position may be 0)
    for name in ("transaction_position", "transaction_section"):
        if proto.HasField(name):
            if not transaction:
                skipped = True
                break
            # kept as bytes of its own: a view would keep the whole manifest file alive
            section = bytes(_framed(data, getattr(proto, name), path, "transaction section"))
            break
    return Manifest(
        path=path,
        proto=proto,
        inline_transaction=section,
        transaction_skipped=skipped,
        entries=entries,
    )


# -- the top level of a Manifest message: C (_decode.c) where built, else protobuf whole ----


def _manifest_entries(
    data: bytes | memoryview | mmap.mmap, start: int, end: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]] | None:
    """The top level of the Manifest message in data[start:end] (see _decode.c), or None:
    then protobuf parses the whole message (also where the C reader is not built)."""
    if _native is None:
        return None
    return _native.manifest_entries(data, start, end)


def _same_bytes(a: memoryview, b: memoryview) -> bool:
    if _native is not None:
        return bool(_native.same_bytes(a, b))
    return len(a) == len(b) and a.tobytes() == b.tobytes()
