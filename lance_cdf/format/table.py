"""A table's version history as the format layer sees it: manifests by version,
and the per-fragment row-ID sequences, version sequences and deletion vectors
they point to, read once and cached."""

from __future__ import annotations

from lance_cdf.cache import LruCache
from lance_cdf.errors import (
    CorruptFileError,
    StableRowIdsRequiredError,
    VersionNotFoundError,
)
from lance_cdf.format._proto import table_pb2, transaction_pb2
from lance_cdf.format.deletions import DeletionVector, deletion_file_path, read_deletion_vector
from lance_cdf.format.io import FileSystem, open_filesystem
from lance_cdf.format.manifest import FragmentInfo, Manifest, parse_manifest, parse_transaction
from lance_cdf.format.rowids import RowIdSequence, VersionSequence
from lance_cdf.format.versions import list_versions, manifest_path

# Lance reads a fragment without a version sequence as "every row at version 1".
DEFAULT_ROW_VERSION = 1


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
        self._manifests: LruCache = LruCache(cache_size)
        self._deletions: LruCache = LruCache(cache_size * 16)
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

    def has_version(self, version: int) -> bool:
        return version in self._versions or (self.fs.exists(manifest_path(version, self._scheme)))

    # -- manifests --------------------------------------------------------
    def manifest(self, version: int, operation: bool = True) -> Manifest:
        """The manifest of `version`. With `operation=False` a transaction kept in its own
        file under `_transactions/` is not fetched (one request saved where the operation
        name is not needed, e.g. the base version of a diff)."""
        cached = self._manifests.get(version)
        if cached is not None:
            self._manifests.move_to_end(version)
            if operation and cached.transaction is None and cached.transaction_file:
                return self._manifests.put(version, self._with_transaction(cached))
            return cached
        path = manifest_path(version, self._scheme)
        try:
            data = self.fs.read(path)
        except FileNotFoundError:
            self.refresh()
            raise self.missing_version_error(version) from None
        manifest = parse_manifest(data, f"{self.fs.root}/{path}")
        if manifest.version != version:
            raise CorruptFileError(
                f"manifest {self.fs.root}/{path} says it is version {manifest.version}, not "
                f"{version}; the _versions/ directory is damaged. Restore it from a backup."
            )
        if operation and manifest.transaction is None and manifest.transaction_file:
            manifest = self._with_transaction(manifest)
        return self._manifests.put(version, manifest)

    def _with_transaction(self, manifest: Manifest) -> Manifest:
        tpath = f"_transactions/{manifest.transaction_file}"
        try:
            tx = parse_transaction(self.fs.read(tpath), f"{self.fs.root}/{tpath}")
        except FileNotFoundError:
            # transaction files may be cleaned up; the operation is then "Unknown"
            tx = transaction_pb2.Transaction()
        return Manifest(path=manifest.path, proto=manifest.proto, transaction=tx)

    def missing_version_error(self, version: int) -> VersionNotFoundError:
        if self._versions and version > self.latest_version:
            return VersionNotFoundError(
                f"version {version} of {self.uri} does not exist yet: the latest version is "
                f"{self.latest_version}. Ask for a version at most {self.latest_version}, or "
                "wait for the commit."
            )
        return VersionNotFoundError(
            f"version {version} of {self.uri} is gone (removed by cleanup_old_versions, or never "
            f"written); the oldest version still available is {self.oldest_version}. Start at "
            f"version {self.oldest_version + 1} or later to read changes, or keep more versions "
            "(cleanup_old_versions(older_than=...)) so consumers can catch up."
        )

    def require_stable_row_ids(self, manifest: Manifest) -> None:
        if not manifest.stable_row_ids:
            raise StableRowIdsRequiredError(
                f"{self.uri} was created without stable row IDs, so rows have no lasting "
                "identity to build a change feed on (version "
                f"{manifest.version} lacks reader feature flag 2). Stable row IDs cannot be "
                "turned on for an existing table: rewrite it into a new table with "
                "lance.write_dataset(data, new_uri, enable_stable_row_ids=True) and read "
                "changes from that one."
            )

    # -- per-fragment lineage --------------------------------------------
    def _sequence_bytes(self, frag: FragmentInfo, oneof: str) -> bytes | None:
        name = frag.proto.WhichOneof(oneof)
        if name is None:
            return None
        value = getattr(frag.proto, name)
        if isinstance(value, bytes):
            return value
        ext: table_pb2.ExternalFile = value
        try:
            return self.fs.read_range(ext.path, ext.offset, ext.size)
        except FileNotFoundError:
            raise CorruptFileError(
                f"{self.fs.root}/{ext.path} (the {oneof.replace('_', ' ')} of fragment "
                f"{frag.id}) is missing; the table is damaged. Restore the file."
            ) from None

    def _sequence_key(self, frag: FragmentInfo, oneof: str):
        name = frag.proto.WhichOneof(oneof)
        if name is None:
            return None
        value = getattr(frag.proto, name)
        if isinstance(value, bytes):
            return (name, frag.physical_rows, value)
        return (name, frag.physical_rows, value.path, value.offset, value.size)

    def _cached_sequence(self, frag: FragmentInfo, oneof: str, decode):
        """Decoded sequences, keyed by their bytes or external file range: a fragment
        entry a commit left alone is not decoded again at the next step of a range."""
        cache = self.__dict__.get("_sequences")
        if cache is None:
            cache = self._sequences = LruCache(1024)
        key = self._sequence_key(frag, oneof)
        seq = cache.get(key) if key is not None else None
        if seq is None:
            seq = decode()
            if key is not None:
                cache.put(key, seq)
        return seq

    def row_ids(self, frag: FragmentInfo) -> RowIdSequence:
        return self._cached_sequence(frag, "row_id_sequence", lambda: self._row_ids(frag))

    def _row_ids(self, frag: FragmentInfo) -> RowIdSequence:
        data = self._sequence_bytes(frag, "row_id_sequence")
        if data is None:
            raise StableRowIdsRequiredError(
                f"fragment {frag.id} of {self.uri} has no row-ID sequence; the table was "
                "written without stable row IDs. Rewrite it with enable_stable_row_ids=True."
            )
        what = f"row-ID sequence of fragment {frag.id}"
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
            return VersionSequence.uniform(frag.physical_rows, DEFAULT_ROW_VERSION)
        what = f"{oneof.replace('_', ' ')} of fragment {frag.id}"
        return self._checked(VersionSequence.from_bytes(data, what), frag, what)

    def _checked(self, seq, frag: FragmentInfo, what: str):
        """`seq` if it has one entry per physical row of `frag`."""
        if len(seq) != frag.physical_rows:
            raise CorruptFileError(
                f"{what} in {self.uri} has {len(seq)} entries for {frag.physical_rows} "
                "physical rows; the manifest is damaged. Restore it from a backup."
            )
        return seq

    def deletions(self, frag: FragmentInfo) -> DeletionVector:
        deletion = frag.deletion
        if deletion is None:
            return DeletionVector.empty()
        key = deletion_file_path(frag.id, deletion)
        cached = self._deletions.get(key)
        if cached is None:
            cached = self._deletions.put(key, read_deletion_vector(self.fs, frag.id, deletion))
        return cached
