"""The database stream's driver side (spark/source/database_stream.py) and the sink's resolution of
its work items (spark/sink/database_sink.py), without Spark: offsets per table, tables that come, go
or cannot be followed, and the events each work item reads back equal `read_changes` of
its table (the oracle) from the table's first version."""

import json

import lance
import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import lance_cdf
from lance_cdf.errors import CheckpointMismatchError, LanceCdfError, WorkItemError
from lance_cdf.spark.sink.database_sink import table_works
from lance_cdf.spark.source.database_stream import DatabaseReader, not_followable
from lance_cdf.spark.source.handoff import WorkItem

lancedb = pytest.importorskip("lancedb")
STABLE = {"new_table_enable_stable_row_ids": "true"}


def rows(lo, hi):
    ids = np.arange(lo, hi)
    return pa.table({"id": ids, "s": [f"a{i}" for i in ids]})


def reader(root, **options):
    # idlePollMax 0: every table looked at every call (test_idle_polls: quiet tables less)
    base = {
        "database": root,
        "keyHash": "id",
        "writerSlots": "2",
        "kafkaPartitions": "3",
        "idlePollMax": "0",
    }
    return DatabaseReader({**base, **options})


def events_by_table(r, start, end, root):
    """table -> its events read back from the micro-batch's work items, as the sink does."""
    batches = [b for p in r.partitions(start, end) for b in r.read(p)]
    out = {}
    for name, work in table_works(iter(batches), root, {}).items():
        got = pa.Table.from_batches([b for w in work.works for b in w.events()])
        out[name] = sorted(
            zip(
                got["_commit_version"].to_pylist(),
                got["_change_type"].to_pylist(),
                got["id"].to_pylist(),
                strict=True,
            )
        )
    return out


def oracle(uri, first=1):
    t = lance_cdf.read_changes(uri, first).read_all()
    return sorted(
        zip(
            t["_commit_version"].to_pylist(),
            t["_change_type"].to_pylist(),
            t["id"].to_pylist(),
            strict=True,
        )
    )


def test_tables_come_go_and_are_skipped(tmp_path):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_namespace(["sales"])
    items = db.create_table("items", rows(0, 10), storage_options=STABLE)
    orders = db.create_table(
        "orders", rows(0, 10), namespace_path=["sales"], storage_options=STABLE
    )
    db.create_table("legacy", rows(0, 5))  # no stable row IDs
    db.create_table("tmp_x", rows(0, 5), storage_options=STABLE)  # excluded
    r = reader(root, startingVersion="1", exclude="tmp_.*")
    o0 = r.initialOffset()
    assert sorted(o0["tables"]) == ["items", "sales.orders"] and o0["from"] == "1"
    assert list(r.skipped) == ["legacy"] and "stable row IDs" in r.skipped["legacy"]
    items.add(rows(10, 20))
    orders.delete("id < 3")
    o1 = r.latestOffset(o0, ReadAllAvailable())
    got = events_by_table(r, o0, o1, root)
    paths = {"items": items.uri, "sales.orders": orders.uri}
    assert got == {n: oracle(p.removeprefix("file://")) for n, p in paths.items()}
    # nothing new: the same offset (Spark runs no micro-batch)
    assert r.latestOffset(o1, ReadAllAvailable()) == o1
    # a new table enters at its initial offset, then from its first version
    returns = db.create_table(
        "returns", rows(0, 7), namespace_path=["sales"], storage_options=STABLE
    )
    returns.update(where="id = 1", values={"s": "z"})
    r.listed_at -= 60  # (the next listing is due)
    o2 = r.latestOffset(o1, ReadAllAvailable())
    assert o2["tables"]["sales.returns"]["version"] == 0 and events_by_table(r, o1, o2, root) == {}
    o3 = r.latestOffset(o2, ReadAllAvailable())
    assert events_by_table(r, o2, o3, root) == {
        "sales.returns": oracle(returns.uri.removeprefix("file://"))
    }
    # a dropped table is let go, the others go on
    db.drop_table("items")
    orders.add(rows(100, 102))
    r.listed_at -= 60
    o4 = r.latestOffset(o3, ReadAllAvailable())
    assert sorted(o4["tables"]) == ["sales.orders", "sales.returns"]
    latest = lance.dataset(orders.uri.removeprefix("file://")).version
    assert events_by_table(r, o3, o4, root) == {
        "sales.orders": oracle(orders.uri.removeprefix("file://"), latest)
    }
    # the report status reads: none here (no report option)
    assert r.reported is None


def test_restart_checks_each_table_and_the_start(tmp_path):
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    items = db.create_table("items", rows(0, 10), storage_options=STABLE)
    items.add(rows(10, 12))
    report = tmp_path / "ck" / "database-tables.json"
    r = reader(root, startingVersion="1", report=str(report))
    o1 = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    assert json.loads(report.read_text())["followed"] == {"items": items.uri}
    # another start than the checkpoint's is refused in one line
    with pytest.raises(CheckpointMismatchError, match="started with --starting-version 1"):
        reader(root, startingVersion="latest").latestOffset(o1, ReadAllAvailable())
    # a table of that name that is another table: reported and set aside where it was,
    # not resumed from the other table's position
    db.drop_table("items")
    db.create_table("items", rows(0, 3), storage_options=STABLE).add(rows(3, 5))
    again = reader(root)
    assert again.latestOffset(o1, ReadAllAvailable())["tables"] == o1["tables"]
    cause = again.aside.tables["items"].cause  # set aside (in words), tried again later
    assert "checkpoint" in cause and "CheckpointMismatchError" not in cause


def test_names_that_cannot_be_topics_and_bad_options(tmp_path):
    assert not_followable("sales.orders", {"sales.orders"}) is None
    assert "Avro" in not_followable("sales.9x", {"sales.9x"})
    assert "transaction topic" in not_followable("a.transaction", {"a", "a.transaction"})
    assert not_followable("a.transaction", {"a.transaction"}) is None
    root = str(tmp_path)
    with pytest.raises(LanceCdfError, match="not a regular expression"):
        reader(root, include="(")
    with pytest.raises(LanceCdfError, match="publish --database"):
        DatabaseReader({"database": root})


def test_work_item_name_round_trip_and_refusals():
    item = WorkItem(
        slot=0,
        slots=1,
        planned=3,
        kafka_partitions=2,
        key_hash=("id",),
        drop_unchanged_updates=False,
        fail_on_data_loss=True,
        parts=(),
        read_schema=pa.schema([("id", pa.int64())]),
        table="0" * 16,
        name="sales.orders",
    )
    values = [item.to_batch().column(i)[0].as_py() for i in range(4)]
    assert WorkItem.of(*values) == item
    document = json.loads(values[2])
    document["name"] = 7
    with pytest.raises(WorkItemError, match="qualified name"):
        WorkItem.of(values[0], values[1], json.dumps(document), values[3])


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--database", "/d"], "give --topic-prefix"),
        (["--database", "/d", "--topic-prefix", "p", "--topic", "t"], "leave out --table"),
        (["--table", "/t", "--topic", "t", "--include", "a"], "or --database"),
        (["--database", "/d", "--topic-prefix", "a-b"], "names the Avro records"),
    ],
)
def test_publish_flags_one_table_or_a_database(flags, says, capsys):
    from lance_cdf.cli import main

    common = [
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--schema-registry",
        "http://127.0.0.1:1",
        "--checkpoint",
        "/nonexistent/ck",
    ]
    assert main(["publish", *flags, *common]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_clients_per_process_are_bounded_and_flushed_when_evicted():
    from lance_cdf.format.cache import LruCache
    from lance_cdf.spark.sink import kafka_sink as sink

    class Client:
        def __init__(self):
            self.flushed = self.closed = False
            self.producer = self

        def flush(self, timeout):
            self.flushed = True
            return 0

        def close(self):
            self.closed = True

    for kept in (sink._PUBLISHERS, sink._TRANSACTION_WRITERS):
        assert kept.size == sink.MAX_CLIENTS and kept.on_evict is sink._retire
    cache = LruCache(sink.MAX_CLIENTS, sink._retire)  # as the sink keeps them
    for i in range(sink.MAX_CLIENTS):
        cache.put(i, Client())
    first = cache[0]
    cache.put(0, first)  # used again: the next one is now the least recently used
    second = cache[1]
    cache.put(sink.MAX_CLIENTS, Client())  # one more: the least recently used goes, flushed
    assert len(cache) == sink.MAX_CLIENTS and 1 not in cache and 0 in cache
    assert second.flushed and second.closed and not first.flushed


def test_a_table_created_again_at_its_path_is_read_afresh_by_every_worker(tmp_path):
    """LanceDB drops a root table's directory and creates a new table of that name at the same
    path: its versions 1, 2, ... are not the old table's. A writer process that read the old
    table (its feed, with cached manifests, kept from an earlier micro-batch) must read the
    new table's items from the new table's manifests: the events equal its read_changes."""
    from lance_cdf.spark.source import table_feeds

    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    db.create_table("items", rows(0, 10), storage_options=STABLE).add(rows(10, 20))
    r = reader(root, startingVersion="1")
    o0 = r.initialOffset()
    o1 = r.latestOffset(o0, ReadAllAvailable())
    assert list(events_by_table(r, o0, o1, root)) == ["items"]
    held = dict(table_feeds._FEEDS)  # what a writer process holds after that micro-batch
    db.drop_table("items")
    r.listed_at -= 60
    o2 = r.latestOffset(o1, ReadAllAvailable())
    assert "items" not in o2["tables"]
    new = db.create_table("items", rows(50, 53), storage_options=STABLE)
    new.update(where="id = 51", values={"s": "z"})
    new.add(rows(60, 62))
    r.listed_at -= 60
    o3 = r.latestOffset(o2, ReadAllAvailable())
    o4 = r.latestOffset(o3, ReadAllAvailable())
    table_feeds._FEEDS.update(held)  # the writer process still holds the old table's feed
    assert events_by_table(r, o3, o4, root) == {"items": oracle(new.uri.removeprefix("file://"))}


def test_a_writer_process_reads_only_what_each_micro_batch_adds(tmp_path, monkeypatch):
    """A table written every second: each micro-batch's read costs the same few manifests
    however many versions the table has had since the stream began (the writer keeps its
    feed while it still holds the table's own manifests; opened afresh each time it traced
    the column names from the stream's first version again, a manifest per version)."""
    import lance_cdf.format.table as table_mod

    parsed = []
    real = table_mod.parse_manifest
    monkeypatch.setattr(
        table_mod, "parse_manifest", lambda *a, **k: parsed.append(1) or real(*a, **k)
    )
    root = str(tmp_path / "db")
    hot = lancedb.connect(root).create_table("hot", rows(0, 20), storage_options=STABLE)
    r = reader(root, startingVersion="1")
    prev = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    costs = []
    for i in range(16):
        hot.update(where=f"id = {i % 20}", values={"s": f"u{i}"})
        nxt = r.latestOffset(prev, ReadAllAvailable())
        parsed.clear()
        got = events_by_table(r, prev, nxt, root)
        costs.append(len(parsed))
        version = nxt["tables"]["hot"]["version"]
        assert got == {"hot": [e for e in oracle(hot.uri, version) if e[0] == version]}
        prev = nxt
    assert max(costs[4:]) <= max(costs[:4]), costs


def test_a_process_keeps_the_feeds_of_the_tables_used_last(tmp_path, monkeypatch):
    """A database stream's processes meet every table it follows; each table's feed caches
    what its versions cost to read again, so a feed kept for every table grew a process
    with the number of tables. At most FEEDS_KEPT are kept (the ones used last); a table
    whose feed was let go reads its next work items afresh: every micro-batch's events
    still equal each table's read_changes."""
    import random

    from lance_cdf.spark.source import table_feeds

    monkeypatch.setattr(table_feeds, "FEEDS_KEPT", 3)
    monkeypatch.setattr(table_feeds, "_FEEDS", table_feeds.LruCache(3))
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    tables = {
        f"t{i}": db.create_table(f"t{i}", rows(0, 5), storage_options=STABLE) for i in range(7)
    }
    r = reader(root, startingVersion="1")
    offset = r.initialOffset()
    rng = random.Random(7)
    seen: dict[str, list] = {}
    for step in range(6):  # a few tables change per micro-batch, in random turns
        for name in rng.sample(sorted(tables), 3):
            tables[name].update(where=f"id = {rng.randrange(5)}", values={"s": f"u{step}"})
        end = r.latestOffset(offset, ReadAllAvailable())
        for name, got in events_by_table(r, offset, end, root).items():
            seen.setdefault(name, []).extend(got)
        assert len(table_feeds._FEEDS) <= 3
        offset = end
    assert {n: sorted(v) for n, v in seen.items()} == {
        n: oracle(t.uri.removeprefix("file://")) for n, t in tables.items()
    }
