"""Tables of a database by name: a table's name in a LanceDB database or a Lance directory
namespace → the table's URI, and the list of the database's tables.

Follows the Lance directory namespace spec (lance-namespace "dir"): tables registered in the
root's `__manifest` (a Lance table, read with pylance: `object_id` is the namespace levels and
the table name joined by `$`, `location` the table's directory relative to the root, e.g.
`63310e6c_sales$orders`), plus the root's `<name>.lance` directories that `__manifest` does
not list (LanceDB keeps its root tables there; spec "compatibility mode"). A `.lance`
directory holding the `.lance-deregistered` marker is not a table. Tables are named by
their namespace levels and name joined by dots (`sales.orders`; a root table by its name)
or by their `$`-joined object id.

Read by hand rather than through pylance's `DirectoryNamespace`, which gives the same
tables but at more object-store requests per listing (a LIST per root table when it lists
the root, another when it describes the table for its location), and the database
publisher lists every few seconds: docs/reference/internals.md#table-listing has the
measurements; test_namespace keeps `DirectoryNamespace` as the oracle.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lance_cdf.errors import (
    DatabaseNotFoundError,
    LanceCdfError,
    StorageAccessError,
    TableNameError,
    in_words,
)
from lance_cdf.format.io import FileSystem, local_path, open_filesystem
from lance_cdf.retry import RetryPolicy, retry

if TYPE_CHECKING:
    from lance.namespace import DirectoryNamespace

MANIFEST = "__manifest"
DELIMITER = "$"  # between namespace levels and the table name in an object id
SUFFIX = ".lance"
DEREGISTERED = ".lance-deregistered"
_SHOWN = 12  # table names an unknown-name error lists


@dataclass(frozen=True)
class TableRef:
    """One table of a database."""

    qualified_name: str  # namespace levels and table name joined by "." (root table: its name)
    uri: str
    identifier: tuple[str, ...] = ()  # namespace levels, then the table name


def list_tables(
    root: str,
    storage_options: dict[str, str] | None = None,
    known: set[tuple[str, ...]] | None = None,
) -> list[TableRef]:
    """Every table of the database at `root` (local path or object-store URI), sorted by
    qualified name. Costs one read of `__manifest` and one LIST of the root, plus one HEAD
    per `.lance` directory it does not list (to leave out deregistered ones). `known`, kept
    by a caller that lists again and again: the root directories already found to be tables
    (updated in place), which are not checked again while they stay in the listing, so a
    listing costs no request per table (a known table deregistered without its directory
    going stays listed)."""
    fs = _open(root, storage_options)
    refs, listed = _candidates(root, fs, storage_options)
    if known is not None:
        known &= listed

    def live(key: tuple[str, ...], ref: TableRef) -> bool:
        if key not in listed or (known is not None and key in known):
            return True
        if not _is_table_dir(fs, ref):
            return False
        if known is not None:
            known.add(key)
        return True

    return sorted(
        (ref for key, ref in refs.items() if live(key, ref)), key=lambda ref: ref.qualified_name
    )


def resolve_table(root: str, name: str, storage_options: dict[str, str] | None = None) -> str:
    """The URI of table `name` of the database at `root`: its object id (`sales$orders`, a
    root table's name) or else its qualified name (`sales.orders`); unknown or ambiguous
    names are refused, listing the tables."""
    if not name or name != name.strip():
        raise TableNameError(f"table name {name!r} is empty or has surrounding spaces")
    fs = _open(root, storage_options)
    refs, listed = _candidates(root, fs, storage_options)

    def live(keys: list[tuple[str, ...]]) -> list[TableRef]:
        return [refs[k] for k in keys if k not in listed or _is_table_dir(fs, refs[k])]

    hits = live([k for k in refs if DELIMITER.join(k) == name])  # by object id first
    if not hits:
        hits = live([k for k, ref in refs.items() if ref.qualified_name == name])
    if len(hits) == 1:
        return hits[0].uri
    if hits:
        which = ", ".join(repr(DELIMITER.join(ref.identifier)) for ref in hits)
        raise TableNameError(
            f"{name!r} names more than one table of the database at {root} ({which}, by "
            "object id: namespace levels and name joined by '$'); give the object id instead"
        )
    names = sorted(ref.qualified_name for ref in live(list(refs)))
    shown = ", ".join(names[:_SHOWN])
    if len(names) > _SHOWN:
        shown += f", … ({len(names)} in all)"
    raise TableNameError(
        f"no table {name!r} in the database at {root}; "
        + (f"its tables: {shown}" if names else "it holds no tables")
        + " (a namespaced table is named namespace.table, e.g. sales.orders)"
    )


def _open(root: str, storage_options: dict[str, str] | None) -> FileSystem:
    path = local_path(root)
    if path is not None:
        if not os.path.isdir(path):
            raise DatabaseNotFoundError(
                f"no database at {root!r}: the directory does not exist. Give the LanceDB "
                "database directory (the one lancedb.connect() was given)."
            )
    return open_filesystem(root, storage_options)


def _join(root: str, location: str) -> str:
    """A manifest location (relative to the root, or a full URI / absolute path) as a URI."""
    if "://" in location or location.startswith("/"):
        return location
    path = local_path(root)
    if path is not None:
        return posixpath.join(path, location)
    return root.rstrip("/") + "/" + location


def _candidates(
    root: str, fs: FileSystem, storage_options: dict[str, str] | None
) -> tuple[dict[tuple[str, ...], TableRef], set[tuple[str, ...]]]:
    """(identifier -> table, the identifiers found only by listing): `__manifest`'s tables,
    then the root's `.lance` directories it does not list (not yet checked for markers)."""
    entries = fs.list_dir("")
    refs: dict[tuple[str, ...], TableRef] = {}
    if MANIFEST in entries:
        for object_id, location in _manifest_tables(_join(root, MANIFEST), storage_options):
            identifier = tuple(object_id.split(DELIMITER))
            if not location or not all(identifier):
                raise LanceCdfError(
                    f"the __manifest of the database at {root} lists table {object_id!r} "
                    f"with location {location!r}, which lance-cdf cannot read as a table; "
                    "check the database with the LanceDB / Lance namespace that wrote it"
                )
            refs[identifier] = TableRef(".".join(identifier), _join(root, location), identifier)
    listed: set[tuple[str, ...]] = set()
    for entry in sorted(entries):
        identifier = (entry[: -len(SUFFIX)],)
        if entry.endswith(SUFFIX) and identifier[0] and identifier not in refs:
            refs[identifier] = TableRef(identifier[0], _join(root, entry), identifier)
            listed.add(identifier)
    return refs, listed


def _manifest_tables(
    uri: str, storage_options: dict[str, str] | None
) -> list[tuple[str, str | None]]:
    """(object id, location) of the tables `__manifest` lists."""
    import lance

    ds = lance.dataset(uri, storage_options=storage_options)
    missing = {"object_id", "object_type", "location"} - set(ds.schema.names)
    if missing:
        raise LanceCdfError(
            f"{uri} has no column(s) {sorted(missing)}: not a Lance namespace manifest "
            "lance-cdf knows (expected object_id, object_type, location)"
        )
    table = ds.to_table(columns=["object_id", "location"], filter="object_type = 'table'")
    return list(zip(table["object_id"].to_pylist(), table["location"].to_pylist(), strict=True))


def _is_table_dir(fs: FileSystem, ref: TableRef) -> bool:
    """Whether a root `.lance` directory is a table: not deregistered. (A reserved one,
    declared but without versions yet, is a table, as pylance's DirectoryNamespace lists
    it: reading its changes finds no version.)"""
    return not fs.exists(f"{ref.identifier[0]}{SUFFIX}/{DEREGISTERED}")


# Processes that start together on a fresh database (replicators of one group) race to
# create its `__manifest`, namespaces and tables: a loser's request fails with a concurrent
# modification, and the whole declaration is made again (each step is idempotent)
DECLARE_RACE = RetryPolicy(pauses=(0.05, 0.1, 0.2, 0.5, 1.0, 2.0), deadline_s=30.0)


def table_location(
    root: str, identifier: tuple[str, ...], storage_options: dict[str, str] | None = None
) -> str:
    """The URI of table `identifier` (namespace levels, then the name) of the database at
    `root`, declared there first when it does not exist yet: its namespace levels created
    and the table registered as the Lance directory namespace does it (pylance's
    `DirectoryNamespace`: a root table at `<name>.lance`, a namespaced one registered in
    `__manifest` at `<hash>_<ns>$<name>`), so LanceDB and `list_tables` find it under
    its qualified name. The directory gets its first version from whoever writes it.

    Idempotent, and safe against other processes declaring the same database's tables
    at the same moment (a lost race is retried, `DECLARE_RACE`).

    Raises:
        TableNameError: an empty level in `identifier`.
        StorageAccessError: the database cannot be written (one line naming why).
    """
    from lance.namespace import DirectoryNamespace
    from lance_namespace.errors import ConcurrentModificationError, LanceNamespaceError

    if not identifier or not all(identifier):
        raise TableNameError(f"table identifier {identifier!r} has an empty level")
    path = local_path(root)
    if path is not None:
        os.makedirs(path, exist_ok=True)
    props = {"root": root, **{f"storage.{k}": v for k, v in (storage_options or {}).items()}}
    ns = DirectoryNamespace(**props)
    try:
        declared = retry(
            lambda: _declare(ns, list(identifier)),
            DECLARE_RACE,
            retriable=lambda exc: isinstance(exc, ConcurrentModificationError),
        )
    except (LanceNamespaceError, OSError) as exc:
        raise StorageAccessError(
            f"cannot declare table {'.'.join(identifier)!r} in the database at "
            f"{root}: {in_words(exc)}; check that the database's storage is "
            "reachable and writable with the storage options given"
        ) from exc
    return _location(declared, root)


def _declare(ns: DirectoryNamespace, ident: list[str]) -> str | None:
    """The location of table `ident` in `ns`, its namespace levels created and the table
    declared where missing. Each step accepts what another process made meanwhile."""
    from lance_namespace import (
        CreateNamespaceRequest,
        DeclareTableRequest,
        DescribeTableRequest,
        NamespaceExistsRequest,
    )
    from lance_namespace.errors import (
        NamespaceAlreadyExistsError,
        NamespaceNotFoundError,
        TableAlreadyExistsError,
        TableNotFoundError,
    )

    # (a namespaced table of a database without `__manifest` yet: NamespaceNotFoundError)
    with contextlib.suppress(TableNotFoundError, NamespaceNotFoundError):
        return ns.describe_table(DescribeTableRequest(id=ident)).location
    for depth in range(1, len(ident)):  # the namespace levels, outermost first
        level = ident[:depth]
        try:
            ns.namespace_exists(NamespaceExistsRequest(id=level))
        except NamespaceNotFoundError:
            with contextlib.suppress(NamespaceAlreadyExistsError):  # (made meanwhile)
                ns.create_namespace(CreateNamespaceRequest(id=level))
    try:
        return ns.declare_table(DeclareTableRequest(id=ident)).location
    except TableAlreadyExistsError:  # (declared meanwhile)
        return ns.describe_table(DescribeTableRequest(id=ident)).location


def _location(location: str | None, root: str) -> str:
    """A location the namespace answered (a `file://` URI for a local root) as lance-cdf
    names tables of `root`: a path for a local root."""
    if not location:
        raise LanceCdfError(f"the namespace at {root} gave no location for a table")
    if local_path(root) is not None and location.startswith("file://"):
        return location[len("file://") :]
    return location
