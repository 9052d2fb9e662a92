"""Tables by name in a LanceDB database / Lance directory namespace (lance_cdf.format.namespace),
against pylance's own DirectoryNamespace (lance.namespace) as the oracle."""

from __future__ import annotations

import io
import os
import urllib.request

import lance
import lance.namespace as ln
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.cli import main
from lance_cdf.errors import DatabaseNotFoundError, TableNameError, TableNotFoundError
from lance_cdf.format.namespace import TableRef, list_tables, resolve_table

lancedb = pytest.importorskip("lancedb")

STABLE = {"new_table_enable_stable_row_ids": "true"}


def data(n: int = 3) -> pa.Table:
    return pa.table({"id": list(range(n)), "s": [f"s{i}" for i in range(n)]})


def ipc(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    with pa.ipc.new_stream(buf, table.schema) as w:
        w.write_table(table)
    return buf.getvalue()


def database(tmp_path) -> str:
    """Root tables (one named with a dot), nested namespaces, a table dropped, a root
    table registered in __manifest by pylance's namespace, a deregistered and a reserved
    `.lance` directory."""
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    for ns in (["sales"], ["a"], ["a", "b"]):
        db.create_namespace(ns)
    db.create_table("events", data(), storage_options=STABLE)
    db.create_table("x.y", data(), storage_options=STABLE)
    db.create_table("orders", data(), namespace_path=["sales"], storage_options=STABLE)
    db.create_table("refunds", data(), namespace_path=["sales"], storage_options=STABLE)
    db.create_table("t", data(), namespace_path=["a", "b"], storage_options=STABLE)
    db.create_table("gone", data(), namespace_path=["sales"], storage_options=STABLE)
    db.drop_table("gone", namespace_path=["sales"])
    ln.DirectoryNamespace(root=root).create_table(ln.CreateTableRequest(id=["via_ns"]), ipc(data()))
    lance.write_dataset(data(), os.path.join(root, "old.lance"))
    open(os.path.join(root, "old.lance", ".lance-deregistered"), "w").close()
    os.makedirs(os.path.join(root, "planned.lance"))
    open(os.path.join(root, "planned.lance", ".lance-reserved"), "w").close()
    return root


def oracle_tables(root: str) -> dict[str, str]:
    """qualified name -> table directory, by pylance's DirectoryNamespace."""
    ns = ln.DirectoryNamespace(root=root)
    out = {}

    def walk(path: list[str]) -> None:
        for name in ns.list_tables(ln.ListTablesRequest(id=path)).tables:
            location = ns.describe_table(ln.DescribeTableRequest(id=[*path, name])).location
            out[".".join([*path, name])] = os.path.normpath(location.removeprefix("file://"))
        for child in ns.list_namespaces(ln.ListNamespacesRequest(id=path)).namespaces:
            walk([*path, child])

    walk([])
    return out


def test_list_tables_matches_pylances_directory_namespace(tmp_path):
    root = database(tmp_path)
    refs = list_tables(root)
    assert all(isinstance(r, TableRef) for r in refs)
    got = {r.qualified_name: os.path.normpath(r.uri) for r in refs}
    assert got == oracle_tables(root)
    assert set(got) == {
        "events",
        "x.y",
        "via_ns",
        "sales.orders",
        "sales.refunds",
        "a.b.t",
        "planned",
    }
    for ref in refs:
        if ref.qualified_name != "planned":  # reserved (declared): no version yet
            assert lance.dataset(ref.uri).count_rows() == 3
    assert [r.qualified_name for r in refs] == sorted(got)
    assert list_tables("file://" + root) == [
        TableRef(r.qualified_name, r.uri, r.identifier) for r in refs
    ]


def test_resolve_names(tmp_path):
    root = database(tmp_path)
    by_name = {r.qualified_name: r.uri for r in list_tables(root)}
    assert resolve_table(root, "sales.orders") == by_name["sales.orders"]
    assert resolve_table(root, "sales$orders") == by_name["sales.orders"]
    assert resolve_table(root, "a.b.t") == resolve_table(root, "a$b$t") == by_name["a.b.t"]
    assert resolve_table(root, "events") == os.path.join(root, "events.lance")
    assert "$" in os.path.basename(by_name["sales.orders"])  # the hashed directory
    for wrong in ("sales.gone", "old", "orders", "sales"):
        with pytest.raises(TableNameError, match=rf"no table '{wrong}' .*its tables: a\.b\.t, "):
            resolve_table(root, wrong)
    with pytest.raises(TableNotFoundError, match="no Lance table"):  # declared, no version
        lance_cdf.read_changes("planned", 1, database=root)
    with pytest.raises(DatabaseNotFoundError, match="does not exist"):
        resolve_table(str(tmp_path / "nowhere"), "events")


def test_a_dotted_root_name_and_a_namespaced_table(tmp_path):
    """Root table `x.y` and table `y` of namespace `x`: `x.y` is the root table's object id
    (taken first), `x$y` the namespaced one's."""
    root = database(tmp_path)
    db = lancedb.connect(root)
    db.create_namespace(["x"])
    db.create_table("y", data(5), namespace_path=["x"], storage_options=STABLE)
    assert resolve_table(root, "x.y") == os.path.join(root, "x.y.lance")
    assert lance.dataset(resolve_table(root, "x$y")).count_rows() == 5
    names = [r.qualified_name for r in list_tables(root)]
    assert names.count("x.y") == 2


def test_ambiguous_qualified_name_is_refused(tmp_path):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_namespace(["a.b"])
    db.create_namespace(["a"])
    db.create_table("c", data(), namespace_path=["a.b"], storage_options=STABLE)
    db.create_table("b.c", data(), namespace_path=["a"], storage_options=STABLE)
    with pytest.raises(TableNameError, match="names more than one table") as caught:
        resolve_table(root, "a.b.c")
    assert "'a.b$c'" in str(caught.value) and "'a$b.c'" in str(caught.value)
    assert lance.dataset(resolve_table(root, "a.b$c")).count_rows() == 3


def test_a_plain_directory_of_lance_tables(tmp_path):
    """No __manifest: a Lance directory namespace of `<name>.lance` tables (V1)."""
    root = tmp_path / "plain"
    lance.write_dataset(data(), str(root / "one.lance"), enable_stable_row_ids=True)
    lance.write_dataset(data(), str(root / "two.lance"), enable_stable_row_ids=True)
    (root / "notes").mkdir()
    assert [r.qualified_name for r in list_tables(str(root))] == ["one", "two"]
    with pytest.raises(TableNameError, match="its tables: one, two"):
        resolve_table(str(root), "three")
    with pytest.raises(TableNameError, match="it holds no tables"):
        resolve_table(str(root / "notes"), "one")


def test_read_changes_and_cli_by_name(tmp_path, capsys):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_namespace(["sales"])
    t = db.create_table("orders", data(10), namespace_path=["sales"], storage_options=STABLE)
    t.update(where="id = 4", values={"s": "new"})
    t.delete("id = 7")
    direct = lance_cdf.read_changes(resolve_table(root, "sales.orders"), 2).read_all()
    assert sorted(direct["_change_type"].to_pylist()) == [
        "delete",
        "update_postimage",
        "update_preimage",
    ]
    assert lance_cdf.read_changes("sales.orders", 2, database=root).read_all().equals(direct)
    assert main(["changes", "--database", root, "sales.orders", "--from", "2"]) == 0
    assert "s4 → new" in capsys.readouterr().out
    assert main(["changes", "--database", root, "sales.order", "--from", "2"]) == 2
    err = capsys.readouterr().err
    assert "no table 'sales.order'" in err and "sales.orders" in err


def test_a_lancedb_database_on_object_storage(s3_server, s3_uri):
    """The same on S3 (moto): LanceDB writes a root and a namespaced table, lance-cdf lists
    and resolves them with the storage options and reads the namespaced one by name."""
    opts = s3_server.storage_options()
    root = s3_uri.rsplit("/", 1)[0] + "/db"
    db = lancedb.connect(root, storage_options=opts)
    db.create_namespace(["sales"])
    db.create_table("events", data(), storage_options={**opts, **STABLE})
    t = db.create_table(
        "orders", data(6), namespace_path=["sales"], storage_options={**opts, **STABLE}
    )
    t.delete("id = 2")
    refs = {r.qualified_name: r.uri for r in list_tables(root, opts)}
    assert refs == {"events": f"{root}/events.lance", "sales.orders": refs["sales.orders"]}
    assert refs["sales.orders"].startswith(f"{root}/") and "$orders" in refs["sales.orders"]
    events = lance_cdf.read_changes("sales.orders", 2, database=root, storage_options=opts)
    assert events.read_all()["_change_type"].to_pylist() == ["delete"]
    with pytest.raises(TableNameError, match="its tables: events, sales.orders"):
        resolve_table(root, "sales.refunds", opts)


def test_listing_again_checks_only_new_root_directories(s3_server, s3_uri):
    """A caller that lists again and again (the database stream, every few seconds) keeps
    the root directories found to be tables: a second listing sends no HEAD per table (the
    server's own count), a new directory is still checked (a deregistered one left out),
    and a directory that goes is forgotten."""
    opts = s3_server.storage_options()
    root = s3_uri.rsplit("/", 1)[0] + "/plain"
    for name in ("a", "b", "c"):
        lance.write_dataset(data(), f"{root}/{name}.lance", storage_options=opts)
    known: set[tuple[str, ...]] = set()
    s3_server.reset_counts()
    assert [r.qualified_name for r in list_tables(root, opts, known)] == ["a", "b", "c"]
    assert s3_server.request_counts(reset=True)["head"] == 3 and known == {("a",), ("b",), ("c",)}
    assert [r.qualified_name for r in list_tables(root, opts, known)] == ["a", "b", "c"]
    assert s3_server.request_counts(reset=True)["head"] == 0
    lance.write_dataset(data(), f"{root}/d.lance", storage_options=opts)
    lance.write_dataset(data(), f"{root}/gone.lance", storage_options=opts)
    marker = f"{root.removeprefix('s3://')}/gone.lance/.lance-deregistered"
    urllib.request.urlopen(
        urllib.request.Request(f"{s3_server.endpoint}/{marker}", data=b"", method="PUT")
    ).close()
    s3_server.reset_counts()
    names = [r.qualified_name for r in list_tables(root, opts, known)]
    assert s3_server.request_counts(reset=True)["head"] == 2
    assert names == ["a", "b", "c", "d"] and ("gone",) not in known
    assert list_tables(root, opts) == list_tables(root, opts, set())  # the same tables


def _declare(args: tuple[str, tuple[str, ...], float]) -> str:
    """(in a process of its own) table_location at the same moment as the others."""
    import time

    from lance_cdf.format.namespace import table_location

    root, identifier, at = args
    time.sleep(max(0.0, at - time.time()))
    return table_location(root, identifier)


def test_a_fresh_database_whose_first_table_is_namespaced(tmp_path):
    """table_location declares a namespaced table in a directory that holds nothing yet
    (no `__manifest`: pylance's describe answers NamespaceNotFoundError, not
    TableNotFoundError), and finds it again; LanceDB opens it by name."""
    from lance_cdf.format.namespace import table_location

    root = str(tmp_path / "fresh")
    uri = table_location(root, ("ns", "t"))
    assert table_location(root, ("ns", "t")) == uri
    lance.write_dataset(data(4), uri, enable_stable_row_ids=True)
    assert resolve_table(root, "ns.t") == uri
    assert lancedb.connect(root).open_table("t", namespace_path=["ns"]).count_rows() == 4


@pytest.mark.parametrize("round_", range(2))
def test_processes_declaring_tables_together_on_a_fresh_database(tmp_path, round_):
    """Processes started together (replicators of one group on a fresh target) declare the
    namespace manifest, namespaces and tables at the same moment, the same table by two of
    them: none fails, each table has one location, and the database lists exactly them."""
    import multiprocessing
    import time

    root = str(tmp_path / "fresh")
    idents = [("a", "t"), ("a", "u"), ("b", "c", "t"), ("a", "t"), ("b", "c", "t"), ("r",)]
    at = time.time() + 2.0  # (past the processes' start and imports)
    with multiprocessing.get_context("spawn").Pool(len(idents)) as pool:
        where = pool.map(_declare, [(root, ident, at) for ident in idents])
    located: dict[tuple[str, ...], set[str]] = {}
    for ident, uri in zip(idents, where, strict=True):
        located.setdefault(ident, set()).add(uri)
    assert all(len(uris) == 1 for uris in located.values()), located
    for ident, (uri,) in located.items():
        lance.write_dataset(data(len(ident)), uri, enable_stable_row_ids=True)
    assert {r.qualified_name: r.uri for r in list_tables(root)} == {
        ".".join(ident): uri for ident, (uri,) in located.items()
    }
