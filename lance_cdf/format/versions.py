"""Table versions from the manifest file names under `_versions/`.

Two naming schemes exist: V1 `{version}.manifest` and V2
`{u64::MAX - version:020}.manifest` (sorts newest first on object storage).
A table uses one of them; a mixture is an error.
"""

from __future__ import annotations

from lance_cdf.errors import CorruptFileError, TableNotFoundError
from lance_cdf.format.io import FileSystem

VERSIONS_DIR = "_versions"
U64_MAX = 2**64 - 1
V2_DIGITS = 20


def parse_manifest_name(name: str) -> tuple[int, str] | None:
    """(version, scheme) for one manifest file name, None for other files (a table's
    listing, and a storage event naming the object a commit created: `storage_events`)."""
    if not name.endswith(".manifest"):
        return None
    stem = name[: -len(".manifest")]
    if not stem.isdigit():
        return None
    if len(stem) == V2_DIGITS:
        return U64_MAX - int(stem), "v2"
    return int(stem), "v1"


def list_versions(fs: FileSystem, under: str = "") -> tuple[list[int], str]:
    """All versions present, ascending, and the naming scheme ("v1" or "v2"), of the table
    at `fs`'s root (or at folder `under` of it: a database's store listing one table)."""
    names = fs.list_dir(f"{under.rstrip('/')}/{VERSIONS_DIR}" if under else VERSIONS_DIR)
    found: dict[int, str] = {}
    schemes = set()
    for name in names:
        parsed = parse_manifest_name(name)
        if parsed is not None:
            found[parsed[0]] = name
            schemes.add(parsed[1])
    if not found:
        raise TableNotFoundError(
            f"no Lance table at {fs.root!r}: {VERSIONS_DIR}/ holds no manifests. Check the path "
            "(it should be the directory that contains _versions/)."
        )
    if len(schemes) > 1:
        raise CorruptFileError(
            f"{fs.root}/{VERSIONS_DIR} mixes the V1 ({{version}}.manifest) and V2 "
            "({u64::MAX - version:020}.manifest) naming schemes, which the Lance format forbids; "
            "the table was written by incompatible writers. Migrate it with pylance "
            "(LanceDataset.migrate_manifest_paths_v2) before reading changes."
        )
    return sorted(found), schemes.pop()


def manifest_path(version: int, scheme: str) -> str:
    """Path of a version's manifest relative to the table root."""
    if scheme == "v2":
        return f"{VERSIONS_DIR}/{U64_MAX - version:0{V2_DIGITS}d}.manifest"
    return f"{VERSIONS_DIR}/{version}.manifest"
