"""Feed modes of the Spark source: startingVersion=snapshot (offsets, partitions,
restart mid-snapshot, bootstrap after cleanup), netChanges, dropUnchangedUpdates.

Driver-side tests call the reader directly; the others run a real local Spark."""

import json
import os
import time
from datetime import timedelta

import lance
import numpy as np
import pyarrow as pa

import lance_cdf
from lance_cdf.core.snapshot import SnapshotFragment
from lance_cdf.spark.source.readers import (
    LanceCdfBatchReader,
    LanceCdfStreamReader,
    NetSlice,
    SnapshotSlice,
)
from lance_cdf.spark.source.resolution import resolve
from lance_cdf.spark.source.slicing import advance
from lance_cdf.spark.source.types import spark_schema
from tests.support.oracle import apply_events, table_state

COLUMNS = ["id", "s", "_rowid", "_change_type", "_commit_version", "_commit_timestamp"]


def make(tmp_path, n=40, name="t.lance"):
    uri = str(tmp_path / name)
    table = pa.table({"id": np.arange(n), "s": [f"s{i}" for i in range(n)]})
    lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=8)
    return uri


def history(uri):
    """Versions 2..7: deletes (uneven fragments, one emptied), an update, an append,
    a no-op rewrite and a real upsert."""
    lance.dataset(uri).delete("id % 3 = 0")  # v2
    lance.dataset(uri).delete("id >= 8 AND id < 16")  # v3: fragment 1 emptied
    lance.dataset(uri).update({"s": "'u'"}, where="id % 5 = 1")  # v4
    lance.write_dataset(
        pa.table({"id": np.arange(100, 110), "s": ["n"] * 10}), uri, mode="append"
    )  # v5
    lance.dataset(uri).update({"s": "s"}, where="id > 100")  # v6: rewritten, same values
    src = pa.table({"id": [1, 2, 200], "s": ["m", "m", "new"]})
    lance.dataset(uri).merge_insert(
        "id"
    ).when_matched_update_all().when_not_matched_insert_all().execute(src)  # v7


def spark_rows_as_events(rows) -> pa.Table:
    """Spark rows (collected) back into an event table for the oracle helpers."""
    return pa.Table.from_pylist([r.asDict() for r in rows]).select(COLUMNS)


def drain(reader, start, limit=None):
    """Run the driver's offset loop by hand: [(start, end, rows read)] per micro-batch."""
    limit = limit or reader.getDefaultReadLimit()
    out = []
    while True:
        end = reader.latestOffset(start, limit)
        if end == start:
            return out
        end = json.loads(json.dumps(end))  # what a checkpoint stores and gives back
        batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
        out.append((start, end, pa.Table.from_batches(batches, reader.reading.target)))
        reader.commit(end)
        start = end


def plain(offset):
    """An offset without the table identity and start it carries (spark/source/identity.py)."""
    return {k: v for k, v in offset.items() if k not in ("table", "from")}


def stream_reader(uri, **options):
    resolved = resolve({"path": uri, **{k: str(v) for k, v in options.items()}}, streaming=True)
    return LanceCdfStreamReader(resolved, spark_schema(resolved.user_schema))


def test_advance_over_fragments():
    frags = [SnapshotFragment(0, 5), SnapshotFragment(1, 0), SnapshotFragment(2, 3)]
    assert advance(frags, (0, 0), 3) == (0, 3)
    assert advance(frags, (0, 3), 2) == (2, 0)  # end of fragment 0, skipping the empty one
    assert advance(frags, (0, 3), 4) == (2, 2)
    assert advance(frags, (2, 2), 10) == (3, 0)  # the end
    assert advance(frags, (0, 0), None) == (3, 0)


def test_snapshot_offsets_and_partitions_on_the_driver(tmp_path):
    uri = make(tmp_path)
    history(uri)
    v0 = lance.dataset(uri).version
    reader = stream_reader(uri, startingVersion="snapshot", maxRowsPerTrigger=7, rowsPerPartition=3)
    start = reader.initialOffset()
    assert plain(start) == {"version": v0, "snapshot": {"fragment": 0, "offset": 0}}
    batches = drain(reader, start)
    assert [b[2].num_rows for b in batches[:-1]] == [7] * (len(batches) - 1)
    assert 0 < batches[-1][2].num_rows <= 7
    assert plain(batches[-1][1]) == {"version": v0}  # complete: a plain version offset
    assert all("snapshot" in b[1] for b in batches[:-1])
    parts = reader.partitions(batches[0][0], batches[0][1])
    assert all(isinstance(p, SnapshotSlice) and p.limit <= 3 for p in parts)
    snap = pa.concat_tables(b[2] for b in batches)
    assert set(snap["_change_type"].to_pylist()) == {"snapshot"}
    assert set(snap["_commit_version"].to_pylist()) == {v0}
    events = pa.Table.from_pylist(snap.to_pylist()).select(COLUMNS)
    assert apply_events(events) == table_state(uri, v0)  # every row once: no gap, no duplicate
    # then the changes after v0
    lance.dataset(uri).delete("id = 2")
    more = drain(reader, {"version": v0})
    assert [(b[0], plain(b[1])) for b in more] == [({"version": v0}, {"version": v0 + 1})]
    assert more[0][2]["_change_type"].to_pylist() == ["delete"]


def test_net_changes_batch_partitions_by_rowid_equal_read_changes(tmp_path):
    uri = make(tmp_path)
    history(uri)
    options = {
        "path": uri,
        "startingVersion": "2",
        "endingVersion": "7",
        "netChanges": "true",
        "rowsPerPartition": "5",
    }
    resolved = resolve(options, streaming=False)
    reader = LanceCdfBatchReader(resolved, spark_schema(resolved.user_schema))
    parts = reader.partitions()
    assert len(parts) > 2 and all(isinstance(p, NetSlice) for p in parts)
    got = pa.Table.from_batches([b for p in parts for b in reader.read(p)])
    want = lance_cdf.read_changes(uri, 2, 7, net=True).read_all()
    key = ["_rowid", "_change_type"]
    assert sorted(got.select(key).to_pylist(), key=repr) == sorted(
        want.select(key)
        .cast(pa.schema([("_rowid", pa.int64()), ("_change_type", pa.string())]))
        .to_pylist(),
        key=repr,
    )
    assert got.num_rows == want.num_rows
    # 6..7: v6's rewrites with unchanged values are net update pairs, then dropped
    options.update(startingVersion="6", rowsPerPartition="3")
    counts = []
    for drop in ("false", "true"):
        resolved = resolve({**options, "dropUnchangedUpdates": drop}, streaming=False)
        reader = LanceCdfBatchReader(resolved, spark_schema(resolved.user_schema))
        counts.append(sum(b.num_rows for p in reader.partitions() for b in reader.read(p)))
    want = [
        lance_cdf.read_changes(uri, 6, 7, net=True, drop_unchanged_updates=d).read_all().num_rows
        for d in (False, True)
    ]
    assert counts == want and want[1] < want[0]


# -- on Spark ------------------------------------------------------------------------


def commits_done(ck):
    path = os.path.join(ck, "commits")
    return len([n for n in os.listdir(path) if n.isdigit()]) if os.path.isdir(path) else 0


def to_parquet(spark, uri, out, ck, **options):
    reader = spark.readStream.format("lance-cdf").option("path", uri)
    for k, v in options.items():
        reader = reader.option(k, v)
    writer = reader.load().writeStream.format("parquet")
    return writer.option("path", out).option("checkpointLocation", ck)


def test_bootstrap_after_cleanup_restarted_mid_snapshot(spark, tmp_path):
    uri = make(tmp_path, n=60)
    history(uri)
    lance.dataset(uri).cleanup_old_versions(older_than=timedelta(0), retain_versions=2)
    assert lance.dataset(uri).versions()[0]["version"] == 6  # versions 1..5 are gone
    v0 = lance.dataset(uri).version
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    options = dict(startingVersion="snapshot", maxRowsPerTrigger=9, rowsPerPartition=4)
    q = to_parquet(spark, uri, out, ck, **options).trigger(processingTime="0 seconds").start()
    deadline = time.monotonic() + 120
    while commits_done(ck) < 1 and time.monotonic() < deadline and q.isActive:
        time.sleep(0.02)
    q.stop()  # mid-snapshot
    done = commits_done(ck)
    rows_at_v0 = len(table_state(uri, v0))
    assert 1 <= done and done * 9 < rows_at_v0  # really stopped before the snapshot's end
    with open(os.path.join(ck, "offsets", str(done - 1))) as f:
        assert '"snapshot"' in f.read().splitlines()[-1]  # the offset says how far it got
    lance.dataset(uri).delete("id % 4 = 1")  # v0 + 1, while the query is down
    q = to_parquet(spark, uri, out, ck, **options).trigger(availableNow=True).start()
    q.awaitTermination(180)
    lance.dataset(uri).update({"s": "'late'"}, where="id > 100")  # v0 + 2
    q = to_parquet(spark, uri, out, ck, **options).trigger(availableNow=True).start()
    q.awaitTermination(180)
    got = spark.read.parquet(out).select(*COLUMNS).collect()
    events = spark_rows_as_events(got)
    snap = events.filter(pa.compute.equal(events["_change_type"], "snapshot"))
    assert snap.num_rows == rows_at_v0  # no duplicates across the restart
    assert set(snap["_commit_version"].to_pylist()) == {v0}
    # the replica: snapshot rows first, then the changes in commit order
    changes = events.filter(pa.compute.not_equal(events["_change_type"], "snapshot"))
    order = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}
    changes = changes.take(
        sorted(
            range(changes.num_rows),
            key=lambda i: (
                changes["_commit_version"][i].as_py(),
                order[changes["_change_type"][i].as_py()],
                changes["_rowid"][i].as_py(),
            ),
        )
    )
    assert set(changes["_commit_version"].to_pylist()) == {v0 + 1, v0 + 2}
    replica = apply_events(changes, apply_events(snap))
    assert replica == table_state(uri, v0 + 2)


def test_net_changes_and_dropped_carry_overs_per_micro_batch(spark, tmp_path):
    uri = make(tmp_path)
    history(uri)  # v1..v7
    batches = []

    def collect(df, batch_id):
        batches.append(df.collect())

    reader = spark.readStream.format("lance-cdf").option("path", uri)
    opts = dict(
        startingVersion=2,
        maxVersionsPerTrigger=3,
        netChanges="true",
        dropUnchangedUpdates="true",
        rowsPerPartition=4,
    )
    for k, v in opts.items():
        reader = reader.option(k, v)
    q = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(180)
    # maxVersionsPerTrigger=3 from version 2: micro-batches 2..4 and 5..7
    ends = [json.loads(p["sources"][0]["endOffset"])["version"] for p in q.recentProgress]
    assert len(batches) == 2 and ends[:2] == [4, 7]
    key = ["_rowid", "_change_type", "_commit_version", "id", "s"]
    for (first, last), rows in zip([(2, 4), (5, 7)], batches, strict=True):
        want = lance_cdf.read_changes(
            uri, first, last, net=True, drop_unchanged_updates=True
        ).read_all()
        got = sorted(tuple(r[k] for k in key) for r in rows)
        assert got == sorted(tuple(r[k] for k in key) for r in want.to_pylist()), (first, last)
    # v6 rewrote rows 101..109 with their own values: gone from the second batch
    assert not [r for r in batches[1] if r["_change_type"].startswith("update") and r["id"] > 100]
