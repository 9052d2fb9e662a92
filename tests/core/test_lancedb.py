"""Tables written through LanceDB's own API (lancedb 0.40: sync and async connections, a
root table and a table in a child namespace, its `merge_insert` builder, `optimize` with and
without cleanup), checked against the snapshot oracle through the Python API, the CLI and
the Spark source. LanceDB writes with the Lance crate it embeds, not pylance."""

from __future__ import annotations

import asyncio
import glob
import json
import os
from datetime import timedelta

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.cli import main
from lance_cdf.errors import VersionNotFoundError
from tests.support.oracle import feed_events, snapshot_events

lancedb = pytest.importorskip("lancedb")

# stable row IDs in LanceDB: a storage option (per table: a child namespace ignores the
# connection-level one)
STABLE = {"new_table_enable_stable_row_ids": "true"}


def rows(lo: int, hi: int, tag: str) -> pa.Table:
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": [f"{tag}{i}" for i in ids], "x": ids * 0.5})


def path_of(uri: str) -> str:
    return uri.removeprefix("file://")


def sync_history(db, name: str, namespace: list[str] | None) -> str:
    """A table's history through LanceDB's sync API; returns the table's path."""
    t = db.create_table(name, rows(0, 300, "a"), namespace_path=namespace, storage_options=STABLE)
    t.add(rows(300, 400, "b"))
    t.update(where="id % 7 = 1", values={"s": "u"})
    t.delete("id % 11 = 3")
    src = pa.concat_tables([rows(5, 25, "m"), rows(400, 410, "m")])
    t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)
    t.optimize()  # compaction (and LanceDB's reserve-fragments commit): no row changes
    t.update(where="id < 40", values_sql={"x": "x + 1"})
    (
        t.merge_insert("id")
        .when_matched_update_all(where="target.s != source.s")
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete("id >= 390")
        .execute(pa.concat_tables([rows(10, 20, "m"), rows(30, 35, "n"), rows(500, 503, "c")]))
    )
    return path_of(t.uri)


async def async_history(root: str, name: str, namespace: list[str] | None) -> str:
    db = await lancedb.connect_async(root)
    t = await db.create_table(
        name, rows(0, 200, "a"), storage_options=STABLE, namespace_path=namespace
    )
    await t.add(rows(200, 260, "b"))
    await t.update({"s": "u"}, where="id % 5 = 2")
    await t.delete("id % 13 = 0")
    src = pa.concat_tables([rows(3, 9, "m"), rows(260, 265, "m")])
    await t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)
    await t.optimize()
    await t.update(updates_sql={"x": "x * 2"}, where="id > 240")
    return path_of(await t.uri())


def check_versions(path: str, start: int, events: pa.Table | None = None) -> dict[str, int]:
    """Every version start..latest of `events` (default: read_changes from `start`) equals
    the snapshot oracle; returns the count of events of each kind (so a test can see that
    the history changed rows at all)."""
    latest = lance.dataset(path).version
    if events is None:
        events = lance_cdf.read_changes(path, start).read_all()
    for version in range(start, latest + 1):
        assert feed_events(events, version) == snapshot_events(path, version), version
    kinds = events["_change_type"].to_pylist()
    return {k: kinds.count(k) for k in set(kinds)}


def namespaced_dir(root: str, namespace: str, name: str) -> str:
    """Where LanceDB put a child namespace's table: `<root>/<hash>_<ns>$<name>` (no .lance)."""
    found = glob.glob(os.path.join(glob.escape(root), f"*_{namespace}${name}"))
    assert len(found) == 1, os.listdir(root)
    return found[0]


def test_sync_api_root_and_namespaced_tables(tmp_path):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_namespace(["sales"])
    root_path = sync_history(db, "events", None)
    ns_path = sync_history(db, "orders", ["sales"])
    assert root_path == os.path.join(root, "events.lance")
    assert ns_path == namespaced_dir(root, "sales", "orders")
    # the child namespace's table is listed in the database's __manifest, the root one is not
    listed = lance.dataset(os.path.join(root, "__manifest")).to_table().to_pylist()
    assert {(r["object_type"], r["object_id"]) for r in listed} == {
        ("namespace", "sales"),
        ("table", "sales$orders"),
    }
    for path in (root_path, ns_path):
        assert lance.dataset(path).has_stable_row_ids
        kinds = check_versions(path, 2)
        assert kinds.get("insert") and kinds.get("update_postimage") and kinds.get("delete")


def test_async_api_root_and_namespaced_tables(tmp_path):
    root = str(tmp_path / "db")
    lancedb.connect(root).create_namespace(["shop"])
    root_path = asyncio.run(async_history(root, "clicks", None))
    ns_path = asyncio.run(async_history(root, "carts", ["shop"]))
    assert ns_path == namespaced_dir(root, "shop", "carts")
    for path in (root_path, ns_path):
        kinds = check_versions(path, 2)
        assert kinds.get("insert") and kinds.get("update_postimage") and kinds.get("delete")


@pytest.mark.parametrize("namespace", [None, ["sales"]])
def test_optimize_with_cleanup(tmp_path, namespace):
    """`optimize(cleanup_older_than=0)` removes every older version: the versions after it
    still match the oracle; a range that starts in the removed history is refused, naming
    LanceDB's call."""
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    if namespace:
        db.create_namespace(namespace)
    path = sync_history(db, "orders", namespace)
    t = db.open_table("orders", namespace_path=namespace)
    t.optimize(cleanup_older_than=timedelta(0))
    kept = lance.dataset(path).versions()
    assert len(kept) == 1, kept
    first = kept[0]["version"]
    t.update(where="id % 3 = 0", values={"s": "after"})
    t.delete("id % 4 = 1")
    t.add(rows(900, 910, "z"))
    kinds = check_versions(path, first + 1)
    assert kinds.get("insert") and kinds.get("update_postimage") and kinds.get("delete")
    with pytest.raises(VersionNotFoundError, match=r"optimize\(cleanup_older_than"):
        lance_cdf.read_changes(path, 2).read_all()


def test_cli_on_lancedb_tables(tmp_path, capsys):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_namespace(["sales"])
    events_path = sync_history(db, "events", None)
    orders_path = sync_history(db, "orders", ["sales"])
    for path, table in (
        (events_path, [events_path]),
        (orders_path, ["--database", root, "sales.orders"]),
    ):
        assert main(["changes", *table, "--from", "2", "--format", "jsonl"]) == 0
        lines = capsys.readouterr().out.splitlines()
        events = pa.Table.from_pylist([json.loads(line) for line in lines])
        assert len(events) > 0
        check_versions(path, 2, events)


def test_spark_source_on_a_namespaced_lancedb_table(spark, tmp_path):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_namespace(["sales"])
    path = sync_history(db, "orders", ["sales"])
    by_path = spark.read.format("lance-cdf").option("startingVersion", 2).load(path)
    by_name = (
        spark.read.format("lance-cdf")
        .option("database", root)
        .option("startingVersion", 2)
        .load("sales.orders")
    )
    for df in (by_path, by_name):
        got = pa.Table.from_pylist([r.asDict() for r in df.collect()])
        assert len(got) > 0
        check_versions(path, 2, got)
