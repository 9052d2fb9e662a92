"""A table's version history as the format layer sees it: manifests by version,
and the per-fragment row-ID sequences, version sequences and deletion vectors
they point to, read once and cached."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TypeVar, cast

import numpy as np
import pyarrow as pa

from lance_cdf.errors import (
    CLEANUP,
    KEEP_VERSIONS,
    STABLE_ROW_IDS_HOWTO,
    CorruptFileError,
    StableRowIdsRequiredError,
    UnsupportedTableFeatureError,
    VersionNotFoundError,
)
from lance_cdf.format._proto import table_pb2, transaction_pb2
from lance_cdf.format.cache import LruCache
from lance_cdf.format.deletions import DeletionVector, deletion_file_path, read_deletion_vector
from lance_cdf.format.io import FileSystem, LocalFileSystem, open_filesystem
from lance_cdf.format.manifest import (
    KNOWN_READER_FLAGS,
    LINEAGE_COLUMNS,
    READER_FLAG_NAMES,
    FragmentInfo,
    Manifest,
    parse_manifest,
    parse_transaction,
)
from lance_cdf.format.operations import Operation
from lance_cdf.format.pools import DELETIONS
from lance_cdf.format.rowids import RowIdSequence, VersionSequence
from lance_cdf.format.versions import list_versions, manifest_path

log = logging.getLogger(__name__)

# A decoded lineage sequence, and its cache key: (oneof name, physical rows, inline
# bytes) or (oneof name, physical rows, external file path, offset, size)
_Seq = TypeVar("_Seq", RowIdSequence, VersionSequence)
_SequenceKey = (
    tuple[str, int, bytes] | tuple[str, int, tuple[str, ...]] | tuple[str, int, str, int, int]
)

# A fragment without a version sequence. pylance reads it as "every row at version 1",
# but pylance 0.33.0 to 0.38.2 wrote none although their updates keep a row's ID and move
# it: the version is not known, and a moved row may or may not have changed. Version 0
# never exists, so it marks "not recorded" (plan.diff_manifests then compares values).
UNKNOWN_VERSION = 0


# The manifests a TableLog keeps (besides at most `cache_size` of them): a manifest holds an
# entry per fragment, so a table that only grows in fragments (no compaction) made each
# cached manifest larger, version after version, and every process following the table
# grew with it (the soak's table: docs/benchmarks.md, "Reading the format"). 16,384
# entries in all are 64 manifests of 256 fragments, or 10 of the soak's at its end.
MANIFEST_CACHE_FRAGMENTS = 16_384


# The deletion vectors a TableLog keeps (besides at most 16 x `cache_size` of them), by
# their bitmaps' bytes: a fragment that keeps losing rows gets a new, larger deletion file
# at every commit, and a count of them held more and more memory in the soak
# (docs/benchmarks.md, "Soak: 30 minutes of publish + replicate"); the newest 64 always
# stay.
DELETION_CACHE_BYTES = 8 << 20
_DELETION_CACHE_FLOOR = 64


class _DeletionCache(LruCache[str, DeletionVector]):
    """An LruCache of deletion vectors, bounded by DELETION_CACHE_BYTES too."""

    def __init__(self, size: int):
        super().__init__(size)
        self._bytes: dict[str, int] = {}
        self.held = 0

    def put(self, key: str, value: DeletionVector) -> DeletionVector:
        self.held -= self._bytes.pop(key, 0)
        self[key] = value
        self.move_to_end(key)
        self._bytes[key] = value.bitmap.__sizeof__()
        self.held += self._bytes[key]
        while len(self) > self.size or (
            self.held > DELETION_CACHE_BYTES and len(self) > _DELETION_CACHE_FLOOR
        ):
            self.held -= self._bytes.pop(self.popitem(last=False)[0])
        return value


def _fragment_count(manifest: Manifest) -> int:
    return len(manifest.entries) if manifest.entries is not None else len(manifest.proto.fragments)


class TableLog:
    """Read-only view of one Lance table's manifests and lineage files."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None = None,
        fs: FileSystem | None = None,
        cache_size: int = 64,
    ):
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        self.fs = fs if fs is not None else open_filesystem(uri, self.storage_options)
        self._manifests: LruCache[int, Manifest] = LruCache(cache_size)
        self._deletions: LruCache[str, DeletionVector] = _DeletionCache(cache_size * 16)
        # decoded sequences by _sequence_key, made on first use (see _cached_sequence);
        # a key's oneof name decides which of the two a value is
        self._sequences: LruCache[_SequenceKey, RowIdSequence | VersionSequence]
        self._versions: list[int] = []
        self._scheme = "v2"
        self.refresh()

    # -- versions ---------------------------------------------------------
    def refresh(self) -> list[int]:
        """Re-list `_versions/` (new commits, cleaned-up versions)."""
        self._versions, self._scheme = list_versions(self.fs)
        return self._versions

    @property
    def versions(self) -> list[int]:
        return self._versions

    @property
    def latest_version(self) -> int:
        return self._versions[-1]

    @property
    def oldest_version(self) -> int:
        return self._versions[0]

    def first_readable_start(self, end: int | None = None) -> int | None:
        """The smallest start version whose changes through `end` (default: the
        latest) can all be read: every version from start-1 (start 1: from 1) to
        `end` is still present. None if not even `end`'s own changes can be read."""
        present = set(self._versions)
        end = self.latest_version if end is None else end
        if end not in present:
            return None
        low = end
        while low - 1 in present:
            low -= 1
        if low == 1:
            return 1
        return low + 1 if low + 1 <= end else None

    def clone_base(self) -> int | None:
        """The version this table was shallow-cloned at, if its oldest version is a Clone."""
        oldest = self.oldest_version
        try:
            return oldest if self.manifest(oldest).operation == Operation.CLONE else None
        except Exception:  # advice only: never hide the error being reported
            return None

    def start_advice(self, end: int | None = None) -> str:
        """What to do when the versions a range needs are gone."""
        first = self.first_readable_start(end)
        base = self.clone_base()
        note = (
            f" Version {base} is where this table was shallow-cloned (its history before that "
            f"lives in the source table); its rows are a snapshot (read_changes(uri, {base}, "
            "snapshot=True)), its changes cannot be diffed."
            if base is not None
            else ""
        )
        if first is None:
            return (
                f"No range ending at {end or self.latest_version} can be read: read a snapshot "
                "of the latest version (snapshot=True), or keep more versions "
                f"({KEEP_VERSIONS}) so consumers can catch up.{note}"
            )
        return (
            f"The first version whose changes can be read is {first}: start at {first} or "
            f"later, or keep more versions ({KEEP_VERSIONS}) so consumers can catch up.{note}"
        )

    def has_version(self, version: int) -> bool:
        return version in self._versions or (self.fs.exists(manifest_path(version, self._scheme)))

    # -- manifests --------------------------------------------------------
    def manifest(self, version: int, operation: bool = True, base: bool = False) -> Manifest:
        """The manifest of `version`. With `operation=False` a transaction kept in its own
        file under `_transactions/` is not fetched (one request saved where the operation
        name is not needed, e.g. the base version of a diff); with `base=True` too, one
        inside the manifest is not parsed (a large commit's is megabytes). Asked for again
        with its operation, such a manifest is read again."""
        cached = self._manifests.get(version)
        if cached is not None:
            self._manifests.move_to_end(version)
            if operation and cached.transaction_skipped:
                self._manifests.pop(version)  # read again, its transaction included
            elif operation and cached.needs_transaction_file:
                return self._manifests.put(version, self._with_transaction(cached))
            else:
                return cached
        path = manifest_path(version, self._scheme)
        transaction = operation or not base
        try:
            if isinstance(self.fs, LocalFileSystem):  # mapped: manifests can be tens of MB
                with self.fs.read_mapped(path) as data:
                    manifest = parse_manifest(data, f"{self.fs.root}/{path}", transaction)
            else:
                manifest = parse_manifest(self.fs.read(path), f"{self.fs.root}/{path}", transaction)
        except FileNotFoundError:
            self.refresh()
            raise self.missing_version_error(version) from None
        if manifest.version != version:
            raise CorruptFileError(
                f"manifest {self.fs.root}/{path} says it is version {manifest.version}, not "
                f"{version}; the _versions/ directory is damaged. Restore it from a backup."
            )
        if operation and manifest.needs_transaction_file:
            manifest = self._with_transaction(manifest)
        self._manifests.put(version, manifest)
        self._trim_manifests()
        return manifest

    def still_own(self) -> bool:
        """Whether the oldest manifest this log holds is still the table's own, read again
        (one request): False when it holds none, or another one (a table created again at
        the same path is another table, whose version numbers start over). A table's
        manifests never change and later ones were committed after it, so the oldest
        vouches for every version this log holds."""
        if not self._manifests:
            return False
        version = min(self._manifests)
        held = self._manifests[version]
        path = manifest_path(version, self._scheme)
        try:
            fresh = parse_manifest(self.fs.read(path), f"{self.fs.root}/{path}", False)
        except FileNotFoundError:
            return False
        return (fresh.timestamp_us, fresh.transaction_file) == (
            held.timestamp_us,
            held.transaction_file,
        )

    def _trim_manifests(self) -> None:
        """Drop the least recently used manifests beyond MANIFEST_CACHE_FRAGMENTS fragment
        entries in all (the two newest stay: a diff needs both)."""
        held = sum(_fragment_count(m) for m in self._manifests.values())
        while held > MANIFEST_CACHE_FRAGMENTS and len(self._manifests) > 2:
            held -= _fragment_count(self._manifests.popitem(last=False)[1])

    def _with_transaction(self, manifest: Manifest) -> Manifest:
        tpath = f"_transactions/{manifest.transaction_file}"
        try:
            tx = parse_transaction(self.fs.read(tpath), f"{self.fs.root}/{tpath}")
        except FileNotFoundError:
            # transaction files may be cleaned up; the operation is then "Unknown"
            tx = transaction_pb2.Transaction()
        return dataclasses.replace(manifest, external_transaction=tx)

    def missing_version_error(self, version: int) -> VersionNotFoundError:
        if self._versions and version > self.latest_version:
            return VersionNotFoundError(
                f"version {version} of {self.uri} does not exist yet: the latest version is "
                f"{self.latest_version}. Ask for a version at most {self.latest_version}, or "
                "wait for the commit."
            )
        base = self.clone_base()
        why = (
            f"before version {base}, where this table was shallow-cloned"
            if base is not None and version < base
            else f"removed by {CLEANUP}, or never written"
        )
        return VersionNotFoundError(
            f"version {version} of {self.uri} is gone ({why}); the versions still available "
            f"are {_spans(self._versions)}. {self.start_advice()}"
        )

    def require_stable_row_ids(self, manifest: Manifest) -> None:
        """Refuse a version lance-cdf cannot read right: one with a reader feature it does
        not know, or without stable row IDs."""
        unknown = manifest.reader_feature_flags & ~KNOWN_READER_FLAGS
        if unknown:
            bits = [1 << b for b in range(64) if unknown >> b & 1]
            named = ", ".join(
                f"{bit} ({READER_FLAG_NAMES[bit]})" if bit in READER_FLAG_NAMES else str(bit)
                for bit in bits
            )
            raise UnsupportedTableFeatureError(
                f"version {manifest.version} of {self.uri} (written by {manifest.writer}) "
                f"needs Lance reader feature flag(s) {named}, which this lance-cdf does not "
                "read; reading it anyway could give wrong events. Upgrade lance-cdf."
            )
        if not manifest.stable_row_ids:
            raise StableRowIdsRequiredError(
                f"{self.uri} was created without stable row IDs, so rows have no lasting "
                "identity to build a change feed on (version "
                f"{manifest.version} lacks reader feature flag 2). Stable row IDs are chosen "
                f"when a table is created and cannot be turned on later. {STABLE_ROW_IDS_HOWTO}"
            )

    # -- per-fragment lineage --------------------------------------------
    def _sequence_bytes(self, frag: FragmentInfo, oneof: str) -> bytes | np.ndarray | None:
        """The serialized sequence, or (spilled row lineage) its values, one per physical
        row; None when the entry has none."""
        name, value = frag.sequence(oneof)
        if name is None:
            return None
        if isinstance(value, bytes):
            return value
        if isinstance(value, tuple):
            return self._lineage_column(frag, oneof, value)
        if value is None:  # FragmentInfo.sequence gives a value with every name
            raise CorruptFileError(
                f"the {oneof.replace('_', ' ')} of fragment {frag.id} in {self.uri} names "
                f"{name} but holds nothing; the manifest is damaged. Restore it from a backup."
            )
        ext: table_pb2.ExternalFile = value
        try:
            return self.fs.read_range(ext.path, ext.offset, ext.size)
        except FileNotFoundError:
            raise CorruptFileError(
                f"{self.fs.root}/{ext.path} (the {oneof.replace('_', ' ')} of fragment "
                f"{frag.id}) is missing; the table is damaged. Restore the file."
            ) from None

    def _lineage_column(self, frag: FragmentInfo, oneof: str, paths: tuple[str, ...]) -> np.ndarray:
        """A spilled sequence: the hidden column of the one data file of `frag` whose
        `fields` hold its reserved id (Lance's format/table/row_id_lineage.md), read with
        pylance's file reader, checked: one non-null uint64 per physical row."""
        fid, column = LINEAGE_COLUMNS[oneof]
        what = f"the spilled {oneof.replace('_', ' ')} of fragment {frag.id} of {self.uri}"
        if len(paths) != 1:
            raise CorruptFileError(
                f"{what}: {len(paths)} data files hold field id {fid} (exactly one must); the "
                "manifest is damaged. Restore it from a backup."
            )
        (df,) = [f for f in frag.proto.files if f.path == paths[0]]
        if df.file_major_version < 2 or df.HasField("base_id"):
            raise CorruptFileError(
                f"{what} is in {df.path}, a Lance {df.file_major_version}.x file"
                f"{' of another base' if df.HasField('base_id') else ''}; spilled row lineage "
                "is only in the table's own Lance v2 files. The manifest is damaged."
            )
        import lance.file  # lazily: only spilled tables need pylance's file reader here

        root = self.uri.rstrip("/")
        try:
            reader = lance.file.LanceFileReader(
                f"{root}/data/{df.path}",
                storage_options=self.storage_options or None,
                columns=[column],
            )
            values = reader.read_all().to_table().column(0)
        except (OSError, ValueError, KeyError) as exc:
            raise CorruptFileError(
                f"{what} cannot be read from data file {root}/data/{df.path} ({exc}); restore "
                "the file."
            ) from None
        if values.null_count or values.type != pa.uint64():
            raise CorruptFileError(
                f"{what} in {df.path} is {values.type} with {values.null_count} nulls, not "
                "uint64 without nulls; the file is damaged."
            )
        return np.asarray(values.to_numpy(), dtype=np.uint64)

    def _sequence_key(self, frag: FragmentInfo, oneof: str) -> _SequenceKey | None:
        name, value = frag.sequence(oneof)
        if name is None or value is None:
            return None
        if isinstance(value, bytes):
            return (name, frag.physical_rows, value)
        if isinstance(value, tuple):  # a spilled column: data files never change
            return (name, frag.physical_rows, value)
        return (name, frag.physical_rows, value.path, value.offset, value.size)

    def _cached_sequence(self, frag: FragmentInfo, oneof: str, decode: Callable[[], _Seq]) -> _Seq:
        """Decoded sequences, keyed by their bytes or external file range: a fragment
        entry a commit left alone is not decoded again at the next step of a range."""
        # kept on the entry too (it lives as long as its cached manifest): a plan asks for
        # an entry's sequences several times, and the next step's plan again (a new
        # version's entries are the next one's base), each time a key tuple and a lookup
        decoded = frag.__dict__.setdefault("_decoded", {})
        fs, seq = decoded.get(oneof, (None, None))
        if fs is self.fs:  # decoded from this table's files (external sequences are paths)
            return cast(_Seq, seq)
        cache = self.__dict__.get("_sequences")
        if cache is None:
            cache = self._sequences = LruCache(1024)
        key = self._sequence_key(frag, oneof)
        seq = cache.get(key) if key is not None else None
        if seq is None:
            seq = decode()
            if key is not None:
                cache.put(key, seq)
        decoded[oneof] = (self.fs, seq)
        return cast(_Seq, seq)

    def row_ids(self, frag: FragmentInfo) -> RowIdSequence:
        return self._cached_sequence(frag, "row_id_sequence", lambda: self._row_ids(frag))

    def _row_ids(self, frag: FragmentInfo) -> RowIdSequence:
        data = self._sequence_bytes(frag, "row_id_sequence")
        if data is None:
            raise CorruptFileError(
                f"fragment {frag.id} of {self.uri} has no row-ID sequence although the version "
                "says the table has stable row IDs: the manifest is damaged, or a Lance "
                "writer newer than this lance-cdf put the sequence somewhere it does not "
                "read. Upgrade lance-cdf; if that does not help, restore the manifest."
            )
        what = f"row-ID sequence of fragment {frag.id}"
        if isinstance(data, np.ndarray):
            return self._checked(RowIdSequence.from_values(data), frag, what)
        return self._checked(RowIdSequence.from_bytes(data, what), frag, what)

    def last_updated_versions(self, frag: FragmentInfo) -> VersionSequence:
        return self._versions_of(frag, "last_updated_at_version_sequence")

    def created_versions(self, frag: FragmentInfo) -> VersionSequence:
        return self._versions_of(frag, "created_at_version_sequence")

    def _versions_of(self, frag: FragmentInfo, oneof: str) -> VersionSequence:
        return self._cached_sequence(frag, oneof, lambda: self._decode_versions(frag, oneof))

    def _decode_versions(self, frag: FragmentInfo, oneof: str) -> VersionSequence:
        data = self._sequence_bytes(frag, oneof)
        if data is None:
            return VersionSequence.uniform(frag.physical_rows, UNKNOWN_VERSION)
        what = f"{oneof.replace('_', ' ')} of fragment {frag.id}"
        if isinstance(data, np.ndarray):
            return self._checked(VersionSequence.from_values(data), frag, what)
        return self._checked(VersionSequence.from_bytes(data, what), frag, what)

    def _checked(self, seq: _Seq, frag: FragmentInfo, what: str) -> _Seq:
        """`seq` if it has one entry per physical row of `frag`."""
        if len(seq) != frag.physical_rows:
            raise CorruptFileError(
                f"{what} in {self.uri} has {len(seq)} entries for {frag.physical_rows} "
                "physical rows; the manifest is damaged. Restore it from a backup."
            )
        return seq

    def prefetch_deletions(self, frags: list[FragmentInfo]) -> None:
        """Read the deletion vectors of `frags` not cached yet, several at a time."""
        if isinstance(self.fs, LocalFileSystem):
            return
        todo: dict[str, FragmentInfo] = {}
        for frag in frags:
            key = frag.deletion_path
            if key is not None and key not in self._deletions:
                todo[key] = frag
        if len(todo) > 1:  # a round trip each on object storage (on local disk threads do
            # not pay: docs/benchmarks.md, "Reading the format")
            for key, vector in zip(
                todo, DELETIONS.map(self._read_deletions, todo.values()), strict=True
            ):
                self._deletions.put(key, vector)

    def deletions(self, frag: FragmentInfo) -> DeletionVector:
        key = frag.deletion_path
        if key is None:
            return DeletionVector.empty()
        cached = self._deletions.get(key)
        if cached is None:
            cached = self._deletions.put(key, self._read_deletions(frag))
        return cached

    def _read_deletions(self, frag: FragmentInfo) -> DeletionVector:
        deletion = frag.deletion
        vector = read_deletion_vector(self.fs, frag.id, deletion)
        beyond = vector.beyond(frag.physical_rows)
        if beyond and deletion is not None:  # (no deletion file: an empty vector)
            # pylance 0.25-0.30 could write offsets past a fragment's rows; pylance
            # ignores them, and so does everything that applies this vector
            log.debug(
                "%s: ignoring %d deletion offset(s) >= %d physical rows of fragment %d in %s",
                self.uri,
                beyond,
                frag.physical_rows,
                frag.id,
                deletion_file_path(frag.id, deletion),
            )
            vector = vector.clipped(frag.physical_rows)
        return vector


def _spans(versions: list[int]) -> str:
    """[2, 4, 5, 6] -> "2, 4..6"."""
    out: list[str] = []
    i = 0
    while i < len(versions):
        j = i
        while j + 1 < len(versions) and versions[j + 1] == versions[j] + 1:
            j += 1
        out.append(str(versions[i]) if i == j else f"{versions[i]}..{versions[j]}")
        i = j + 1
    return ", ".join(out)
