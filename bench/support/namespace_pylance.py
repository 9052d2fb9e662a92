"""lance_cdf.format.namespace's `list_tables` and `resolve_table` written on pylance's
`DirectoryNamespace` (compatibility mode: `list_namespaces` / `list_tables` walked from the
root, `describe_table` for each table's location), the same answers, for
bench_namespace.py to measure against the hand-written reading that lance_cdf uses.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from lance_cdf.errors import DatabaseNotFoundError, LanceCdfError, TableNameError
from lance_cdf.format.io import local_path

if TYPE_CHECKING:
    from lance.namespace import DirectoryNamespace

from lance_cdf.format.namespace import _SHOWN, DELIMITER, TableRef  # the same answers, its way


def list_tables(root: str, storage_options: dict[str, str] | None = None) -> list[TableRef]:
    """Every table of the database at `root` (local path or object-store URI), sorted by
    qualified name."""
    ns = _open(root, storage_options)
    refs = [
        TableRef(".".join(ident), _describe(ns, ident, root), ident) for ident in _identifiers(ns)
    ]
    return sorted(refs, key=lambda ref: ref.qualified_name)


def resolve_table(root: str, name: str, storage_options: dict[str, str] | None = None) -> str:
    """The URI of table `name` of the database at `root`: its object id (`sales$orders`, a
    root table's name) or else its qualified name (`sales.orders`); unknown or ambiguous
    names are refused, listing the tables."""
    from lance_namespace.errors import NamespaceNotFoundError, TableNotFoundError

    if not name or name != name.strip():
        raise TableNameError(f"table name {name!r} is empty or has surrounding spaces")
    ns = _open(root, storage_options)
    object_id = tuple(name.split(DELIMITER))
    if all(object_id):  # by object id first: one lookup
        with contextlib.suppress(TableNotFoundError, NamespaceNotFoundError):
            return _describe(ns, object_id, root)
    idents = list(_identifiers(ns))
    hits = [ident for ident in idents if ".".join(ident) == name]
    if len(hits) == 1:
        return _describe(ns, hits[0], root)
    if hits:
        which = ", ".join(repr(DELIMITER.join(ident)) for ident in hits)
        raise TableNameError(
            f"{name!r} names more than one table of the database at {root} ({which}, by "
            "object id: namespace levels and name joined by '$'); give the object id instead"
        )
    names = sorted(".".join(ident) for ident in idents)
    shown = ", ".join(names[:_SHOWN])
    if len(names) > _SHOWN:
        shown += f", … ({len(names)} in all)"
    raise TableNameError(
        f"no table {name!r} in the database at {root}; "
        + (f"its tables: {shown}" if names else "it holds no tables")
        + " (a namespaced table is named namespace.table, e.g. sales.orders)"
    )


def _open(root: str, storage_options: dict[str, str] | None) -> DirectoryNamespace:
    """pylance's directory namespace at `root` (an existing directory when local)."""
    path = local_path(root)
    if path is not None and not os.path.isdir(path):
        raise DatabaseNotFoundError(
            f"no database at {root!r}: the directory does not exist. Give the LanceDB "
            "database directory (the one lancedb.connect() was given)."
        )
    return _namespace(root, storage_options)


def _namespace(root: str, storage_options: dict[str, str] | None) -> DirectoryNamespace:
    from lance.namespace import DirectoryNamespace

    props = {f"storage.{k}": v for k, v in (storage_options or {}).items()}
    return DirectoryNamespace(root=local_path(root) or root, **props)


def _identifiers(ns: DirectoryNamespace) -> Iterator[tuple[str, ...]]:
    """Every table's identifier (namespace levels, then the name), child namespaces
    walked depth first."""
    from lance_namespace import ListNamespacesRequest, ListTablesRequest

    pending: list[tuple[str, ...]] = [()]
    while pending:
        level = pending.pop()
        for name in _pages(ns.list_tables, ListTablesRequest, level):
            yield (*level, name)
        for child in _pages(ns.list_namespaces, ListNamespacesRequest, level):
            pending.append((*level, child))


def _pages(call: Callable[..., Any], request: type, level: tuple[str, ...]) -> Iterator[str]:
    """The names a paginated list call (`list_tables`, `list_namespaces`) gives for
    namespace `level`, every page."""
    token = None
    while True:
        resp = call(request(id=list(level), page_token=token))
        yield from resp.tables if hasattr(resp, "tables") else resp.namespaces
        token = resp.page_token
        if not token:
            return


def _describe(ns: DirectoryNamespace, ident: tuple[str, ...], root: str) -> str:
    """The URI of table `ident`, as the namespace registered it."""
    from lance_namespace import DescribeTableRequest

    return _location(ns.describe_table(DescribeTableRequest(id=list(ident))).location, root)


def _location(location: str | None, root: str) -> str:
    """A location the namespace answered (a `file://` URI for a local root) as lance-cdf
    names tables of `root`: a path for a local root."""
    if not location:
        raise LanceCdfError(f"the namespace at {root} gave no location for a table")
    if local_path(root) is not None and location.startswith("file://"):
        return location[len("file://") :]
    return location
