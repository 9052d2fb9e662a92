"""Replication throughput and commit-to-replica latency.

    python -m bench.replicate.bench_replicate --rows 1000000 --latency-commits 50 \
        --latency-replica-rows 10000000 --out bench/results/results_replicate.json

Runs a real local broker and Apicurio registry (lance_cdf_devtools). Measured in one run:
  * upserts    1,000,000 insert records (narrow rows, 5 scalar columns) applied by the
               Replicator to an empty replica (merge_insert in batches of --batch-rows),
               against one direct merge_insert of the same 1,000,000 rows (the ceiling);
  * mix        one source commit updating 90% and deleting 10% of the rows, replicated,
               against one direct merge_insert (updates) + one merge delete (the ceiling);
  * latency    the whole pipeline running (`lance-cdf-kafka` Spark stream with a 200 ms
               trigger -> Kafka -> Replicator thread): --latency-commits small commits, each
               timed from the source commit returning to its row being visible in the
               replica (polled every 10 ms); with --latency-replica-rows the replica
               already holds that many rows (built once under --dir, then copied).
               Each latency is split at the Kafka record's timestamp (CreateTime, set
               when the publisher produced it): commit -> Kafka (Spark trigger, change
               extraction, produce) and Kafka -> replica (consume, apply, visible).
Each throughput workload also has its consume floor: a bare confluent-kafka consumer
with the replicator's fetch settings consuming the same records (no decode), and the
same collecting the values into Arrow binary arrays.
Replicator times include decoding (Avro -> Arrow) and the Lance commits; records are
published before the clock starts (publishing is bench_kafka.py's subject).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import threading
import time
import uuid

from bench.support.results import write_result

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from confluent_kafka import Consumer  # noqa: E402

import lance_cdf  # noqa: E402
from bench.support import stats
from bench.support.tables import narrow
from lance_cdf.core.feed import ChangeFeed  # noqa: E402
from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of  # noqa: E402
from lance_cdf.kafka.transactions import (  # noqa: E402
    TransactionWriter,
    VersionCounts,
    default_topic,
)
from lance_cdf.replicate.key_lookup import key_index_config  # noqa: E402
from lance_cdf.replicate.replica import (  # noqa: E402
    MAX_ROWID_PROPERTY,
    OFFSETS_PROPERTY,
    ORIGIN_PROPERTY,
    SOURCE_ROWID,
    SOURCE_VERSION_PROPERTY,
)
from lance_cdf.replicate.replicate_settings import (  # noqa: E402
    BatchSettings,
    KafkaSettings,
    ReplicaSettings,
    ReplicateSettings,
)
from lance_cdf.replicate.replicator import Replicator  # noqa: E402

# with transaction metadata (the default of `lance-cdf publish`) the replicator applies
# whole source versions; --no-transaction-metadata measures its records-as-they-come mode
MARKERS = True


def publish(kafka, registry, uri, topic, version) -> int:
    feed = ChangeFeed(uri)
    events = lance_cdf.read_changes(uri, version, version).read_all()
    pub = KafkaChangePublisher(
        kafka.bootstrap_servers, topic, registry.url, user_schema_of(events.schema), uri
    )
    sent = pub.publish(events, {version: feed.table.manifest(version).operation})
    if MARKERS:  # BEGIN/END as publish's driver commit writes them (one-partition topic)
        TransactionWriter(kafka.bootstrap_servers, default_topic(topic), registry.url, topic).write(
            [VersionCounts(version, {0: (events.num_rows, sent)})]
        )
    return sent


def replicate(kafka, registry, topic, target, batch_rows, profile=None) -> tuple[float, object]:
    rep = Replicator(
        ReplicateSettings(
            KafkaSettings(kafka.bootstrap_servers, registry.url, group_id=f"bench-{topic}"),
            topic,
            target,
            BatchSettings(max_batch_rows=batch_rows, max_batch_interval=2.0),
        )
    )
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    # the clock stops when the last batch is applied: run() then still polls until it has
    # been idle for 3 s (and a poll waits up to max_batch_interval), which is not
    # replication work (r21c and before subtracted a flat 3 s, counting up to ~1-2 s of
    # that wait)
    apply, done = rep.applier.apply, [0.0]

    def timed_apply(msgs, *take, **where):
        apply(msgs, *take, **where)
        done[0] = time.perf_counter()

    rep.applier.apply = timed_apply
    t0 = time.perf_counter()
    counters = rep.run(idle_timeout=3)
    if prof is not None:
        prof.disable()
        prof.dump_stats(f"{profile}.{topic}.prof")
    busy = done[0] - t0
    # poll time up to the last batch (the idle polls after it left out)
    counters.poll_busy_s = busy - sum(getattr(counters, k) for k in PHASES)
    return busy, counters


def consume_floor(kafka, topic, records: int, collect: bool) -> float:
    """Seconds for a bare confluent-kafka consumer, configured as the Replicator's, to
    consume `records` records of `topic` (no decode, no apply; stops at the last one, so
    no idle wait; the garbage collector paused, as the replicator pauses it); with
    `collect`, each consume call's values also go into one Arrow
    binary array (what a bulk decoder would start from)."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"floor-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "max.partition.fetch.bytes": 16 << 20,
            "fetch.max.bytes": 64 << 20,
        }
    )
    consumer.subscribe([topic])
    seen, arrays = 0, []
    gc.disable()  # as the replicator does while it consumes a batch
    t0 = time.perf_counter()
    while seen < records:
        msgs = consumer.consume(100_000, 1.0)
        if collect and msgs:
            arrays.append(pa.array([m.value() for m in msgs], pa.binary()))
        seen += sum(1 for m in msgs if m.error() is None)
        if not msgs and time.perf_counter() - t0 > 120:
            raise RuntimeError(f"floor consumer stalled at {seen} of {records} records")
    elapsed = time.perf_counter() - t0
    gc.enable()
    consumer.close()
    return elapsed


def floors(kafka, topic, records: int) -> dict:
    """The consume floor of a topic: bare consume, and consume + values into Arrow."""
    out = {"consume_s": consume_floor(kafka, topic, records, collect=False)}
    out["consume_values_s"] = consume_floor(kafka, topic, records, collect=True)
    return out


def times_of(c) -> dict:
    """Where the replicator's time went (its counters), and how many upserts skipped the
    key lookup."""
    keys = (
        "poll_busy_s",
        "poll_s",
        "decode_s",
        "apply_s",
        "offset_commit_s",
        "upkeep_s",
        "fresh_upserts",
        "batches",
    )
    return {k: getattr(c, k, None) for k in keys}


def events_as_rows(uri, version) -> tuple[pa.Table, pa.Table]:
    """(final upsert rows, deleted keys) of one version, as the replicator would apply."""
    ev = lance_cdf.read_changes(uri, version, version).read_all()
    kinds = ev["_change_type"].to_numpy(zero_copy_only=False)
    user = [c for c in ev.column_names if not c.startswith("_")]
    up = ev.filter(pa.array((kinds == "insert") | (kinds == "update_postimage")))
    dl = ev.filter(pa.array(kinds == "delete"))
    up = up.select(user).append_column(SOURCE_ROWID, up["_rowid"].cast(pa.int64()))
    dl = pa.table({SOURCE_ROWID: dl["_rowid"].cast(pa.int64())})
    return up, dl


def ceiling(rows: pa.Table, deletes: pa.Table | None, base: str | None, target: str) -> float:
    shutil.rmtree(target, ignore_errors=True)
    if base is None:
        lance.write_dataset(rows.slice(0, 0), target, enable_stable_row_ids=True)
    else:
        shutil.copytree(base, target)
    ds = lance.dataset(target)
    t0 = time.perf_counter()
    # use_index(False): the copied replica has the replicator's key index, and pylance's
    # index-backed merge_insert of 900k rows exhausts its 300 MB join memory pool
    builder = ds.merge_insert(SOURCE_ROWID).when_matched_update_all()
    builder.when_not_matched_insert_all().use_index(False).execute(rows)
    if deletes is not None and deletes.num_rows:
        lance.dataset(target).merge_insert(SOURCE_ROWID).when_matched_delete().use_index(
            False
        ).execute(deletes)
    return time.perf_counter() - t0


def seeded_replica(root: str, dst: str, rows: int) -> None:
    """`dst`: a replica already holding `rows` rows (keys far from the source's row IDs),
    built once under `root` and copied, so latency is measured into a large replica."""
    seed = os.path.join(root, f"lat_seed_{rows}.lance")
    try:
        ok = lance.dataset(seed).count_rows() == rows
    except (ValueError, FileNotFoundError, OSError):
        ok = False
    if not ok:
        schema = narrow(1).schema.append(pa.field(SOURCE_ROWID, pa.int64(), False))

        def batches():
            for start in range(0, rows, 1_000_000):
                t = narrow(min(1_000_000, rows - start), start)
                yield from t.append_column(
                    schema.field(SOURCE_ROWID), pa.array(t["id"].to_numpy() + (1 << 40))
                ).to_batches()

        # as the replicator would have left it: a position (no offsets of this topic, source
        # version 0, its highest key), its key index, marked as holding only rows that came
        # from records (its keys lie far above the source's row IDs)
        props = {
            OFFSETS_PROPERTY: "{}",
            SOURCE_VERSION_PROPERTY: "0",
            MAX_ROWID_PROPERTY: str((1 << 40) + rows - 1),
            ORIGIN_PROPERTY: "records",
        }
        lance.write_dataset(
            pa.RecordBatchReader.from_batches(schema, batches()),
            seed,
            mode="overwrite",
            enable_stable_row_ids=True,
            transaction_properties=props,
        )
        lance.dataset(seed).create_scalar_index(SOURCE_ROWID, key_index_config())
    shutil.copytree(seed, dst)


# the replicator's per-batch phases (seconds), from its counters
PHASES = ("decode_s", "apply_s", "offset_commit_s", "upkeep_s")
# and the apply's own phases (ReplicaTable.timings)
APPLY_PHASES = ("open", "lookup", "delete", "write", "commit", "map")


def latency(
    spark, kafka, registry, root, commits: int, replica_rows: int = 0, key_map: bool = True
) -> list[float]:
    from lance_cdf.spark import register

    register(spark)
    src, dst = os.path.join(root, "lat_src.lance"), os.path.join(root, "lat_replica.lance")
    for p in (src, dst):
        shutil.rmtree(p, ignore_errors=True)
    lance.write_dataset(narrow(1000), src, enable_stable_row_ids=True)
    if replica_rows:
        seeded_replica(root, dst, replica_rows)
    topic = f"lat-{uuid.uuid4().hex[:6]}"
    q = (
        spark.readStream.format("lance-cdf")
        .option("path", src)
        .option("startingVersion", 1)
        .load()
        .coalesce(1)
        .writeStream.format("lance-cdf-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", topic)
        .option("schema.registry.url", registry.url)
        .option("table", src)
        .option("checkpointLocation", os.path.join(root, f"lat-ck-{topic}"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    rep = Replicator(
        ReplicateSettings(
            KafkaSettings(kafka.bootstrap_servers, registry.url, group_id=f"g-{topic}"),
            topic,
            dst,
            BatchSettings(max_batch_interval=0.05),
            ReplicaSettings(key_map=key_map),
        )
    )
    errors: list[BaseException] = []
    applied: list[tuple[float, float, int]] = []  # (start, end, newest record timestamp ms)
    apply = rep.applier.apply

    phases: list[dict] = []  # per batch: where its time went (deltas of the counters)

    def timed_apply(msgs, *take, **where):
        c, t = rep.counters, rep.replica.timings
        before = {k: getattr(c, k) for k in PHASES} | {k: t.get(k, 0.0) for k in APPLY_PHASES}
        start = time.time()
        apply(msgs, *take, **where)
        applied.append((start, time.time(), max(m.timestamp()[1] for m in msgs)))
        after = {k: getattr(c, k) for k in PHASES} | {k: t.get(k, 0.0) for k in APPLY_PHASES}
        phases.append({k: after[k] - before[k] for k in after} | {"records": len(msgs)})

    rep.applier.apply = timed_apply

    def run():
        try:
            rep.run()
        except BaseException as exc:  # surfaced by wait() below
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()

    session = lance.Session()  # polls of a large replica: keep its index cached

    def visible(marker: int, rowid: int) -> bool:
        try:  # the replica appears with the replicator's first batch
            return (
                lance.dataset(dst, session=session).count_rows(
                    filter=f"{SOURCE_ROWID} = {rowid} AND ts = {marker}"
                )
                > 0
            )
        except ValueError:  # not created yet (or its first commit not written yet)
            return False

    def wait(marker: int, rowid: int, poll: float) -> None:
        deadline = time.monotonic() + 300
        while not visible(marker, rowid):
            if errors or q.exception() or time.monotonic() > deadline:
                raise RuntimeError(f"pipeline stalled: {errors or q.exception() or 'timeout'}")
            time.sleep(poll)

    wait(999 * 1000, 999, 0.05)  # the initial rows (and, on a seeded replica, its index)
    out, split = [], []
    for i in range(commits):
        marker = -(i + 1)
        wall0 = time.time()
        t0 = time.perf_counter()
        if i % 2:
            lance.dataset(src).update({"ts": str(marker)}, where=f"id = {i}")
        else:
            row = narrow(1, 10_000 + i)
            row = row.set_column(3, "ts", pa.array([marker]))
            lance.write_dataset(row, src, mode="append")
        rowid = (
            lance.dataset(src)
            .to_table(columns=[], filter=f"ts = {marker}", with_row_id=True)["_rowid"][0]
            .as_py()
        )
        wait(marker, rowid, 0.01)
        out.append(time.perf_counter() - t0)
        wall1 = time.time()
        # the first batch after the commit that carried a record produced after it
        batch = next((b for b in applied if b[2] >= wall0 * 1000 and b[1] <= wall1), None)
        if batch is not None:
            split.append((batch[2] / 1000 - wall0, wall1 - batch[2] / 1000, batch[1] - batch[0]))
    rep.stop()
    worker.join(30)
    q.stop()
    rep.counters.batch_phases = phases[1:]  # the first batch: the 1,000 initial rows
    return out, split, rep.counters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=100_000)
    ap.add_argument("--latency-commits", type=int, default=50)
    ap.add_argument(
        "--latency-replica-rows",
        type=int,
        default=0,
        help="rows the replica holds before the latency run (built once)",
    )
    ap.add_argument(
        "--skip-throughput",
        action="store_true",
        help="only the latency run (no 1M-row throughput workloads)",
    )
    ap.add_argument(
        "--no-key-map",
        action="store_true",
        help="the latency run's replicator without the in-memory key map",
    )
    ap.add_argument("--skip-latency", action="store_true", help="only the throughput workloads")
    ap.add_argument(
        "--no-transaction-metadata",
        action="store_true",
        help="publish the throughput workloads' records without BEGIN/END markers "
        "(the replicator then applies records as they come)",
    )
    ap.add_argument(
        "--profile", default=None, help="cProfile the replicator runs into PREFIX.<topic>.prof"
    )
    ap.add_argument(
        "--arenas",
        type=int,
        default=0,
        help="hold glibc to N arenas (lance_cdf.ops.malloc.bound_arenas, as "
        "`lance-cdf replicate` does: 2); 0: glibc's own limit",
    )
    ap.add_argument(
        "--keep-freed",
        action="store_true",
        help="lance_cdf.ops.malloc.keep_freed_memory(), as the `lance-cdf` command's process does",
    )
    ap.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        help="map blocks of N bytes and more (ops.malloc.map_large_blocks, as "
        "`lance-cdf replicate` does: 1 MiB); 0: glibc's dynamic threshold",
    )
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    global MARKERS
    MARKERS = not args.no_transaction_metadata
    if args.arenas > 0:  # before any thread starts
        from lance_cdf.ops import malloc

        malloc.bound_arenas(args.arenas)
    if args.keep_freed or args.mmap_threshold > 0:
        from lance_cdf.ops import malloc

        if args.keep_freed:
            malloc.keep_freed_memory()
        if args.mmap_threshold > 0:
            malloc.map_large_blocks(args.mmap_threshold)
    from pyspark.sql import SparkSession

    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    os.makedirs(args.dir, exist_ok=True)
    results: dict = {
        "rows": args.rows,
        "batch_rows": args.batch_rows,
        "arenas": args.arenas,
        "keep_freed": args.keep_freed,
        "mmap_threshold": args.mmap_threshold,
    }
    with KafkaBroker() as kafka, SchemaRegistry() as registry:
        if not args.skip_throughput:
            run_throughput(kafka, registry, args, results)
        if args.skip_latency:
            write_result(args.out, results)
            return

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        t0 = time.perf_counter()
        lat, split, lat_counters = latency(
            spark,
            kafka,
            registry,
            args.dir,
            args.latency_commits,
            args.latency_replica_rows,
            key_map=not args.no_key_map,
        )
        results["latency_run_s"] = time.perf_counter() - t0
        spark.stop()
        ms = np.array(lat) * 1000
        results["latency_ms"] = dict(
            commits=len(lat),
            replica_rows=args.latency_replica_rows,
            p50=stats.percentile(ms, 50),
            p99=stats.percentile(ms, 99),
            max=float(ms.max()),
        )
        if split:
            parts = np.array(split) * 1000
            for i, name in enumerate(("commit_to_kafka", "kafka_to_replica", "apply")):
                results["latency_ms"][name] = dict(
                    p50=stats.percentile(parts[:, i], 50),
                    p99=stats.percentile(parts[:, i], 99),
                    max=float(parts[:, i].max()),
                )
        results["latency_ms"]["timed_commits"] = len(split)
        results["latency_replicator"] = times_of(lat_counters)
        small = lat_counters.batch_phases
        if small:  # per small batch, milliseconds: p50 / p99 of each phase
            ms = {k: np.array([b[k] for b in small]) * 1000 for k in PHASES + APPLY_PHASES}
            results["latency_batch_phases_ms"] = {
                k: dict(p50=stats.percentile(v, 50), p99=stats.percentile(v, 99))
                for k, v in ms.items()
            }
            results["latency_batch_phases_ms"]["batches"] = len(small)
            print(
                "latency_batch_phases_ms",
                json.dumps(results["latency_batch_phases_ms"]),
                flush=True,
            )
        print("latency_ms", json.dumps(results["latency_ms"]), flush=True)
    write_result(args.out, results)


def run_throughput(kafka, registry, args, results) -> None:
    """The two throughput workloads (records already on the topics), beside their ceilings."""
    src = os.path.join(args.dir, "rep_src.lance")
    dst = os.path.join(args.dir, "rep_replica.lance")
    for p in (src, dst):
        shutil.rmtree(p, ignore_errors=True)
    lance.write_dataset(
        narrow(args.rows), src, enable_stable_row_ids=True, max_rows_per_file=250_000
    )
    # version 2: one merge_insert updating 90% of the rows and deleting the other 10%
    upd = narrow(args.rows)
    upd = upd.filter(pa.array(upd["id"].to_numpy() % 10 != 0))
    upd = upd.set_column(2, "score", pa.array(upd["score"].to_numpy() + 1))
    lance.dataset(src).merge_insert(
        "id"
    ).when_matched_update_all().when_not_matched_by_source_delete().execute(upd)
    tag = uuid.uuid4().hex[:6]
    topics = {v: f"rep-v{v}-{tag}" for v in (1, 2)}
    for v, topic in topics.items():
        t0 = time.perf_counter()
        n = publish(kafka, registry, src, topic, v)
        print(f"published version {v}: {n} records in {time.perf_counter() - t0:.1f}s", flush=True)

    # the broker's first consumer group creates __consumer_offsets (seconds on a fresh
    # broker): done here, outside every clock, so it lands on none of the timed runs
    consume_floor(kafka, topics[1], 1, collect=False)
    rep_s, c = replicate(kafka, registry, topics[1], dst, args.batch_rows, args.profile)
    up1, _ = events_as_rows(src, 1)
    ceil_s = ceiling(up1, None, None, os.path.join(args.dir, "rep_ceiling1.lance"))
    fl = floors(kafka, topics[1], c.records)
    # version 2 also goes on after version 1 in the replica's own topic: a replica follows
    # one topic, so the second workload resumes there from the replica's
    # position; topics[2] (version 2 alone) only gives that workload's consume floor
    publish(kafka, registry, src, topics[1], 2)
    results["upserts"] = dict(
        records=c.records,
        replicator_s=rep_s,
        replicator_rows_per_s=c.upserts / rep_s,
        ceiling_s=ceil_s,
        ceiling_rows_per_s=up1.num_rows / ceil_s,
        ratio=rep_s / ceil_s,
        **fl,
        ratio_to_consume=rep_s / fl["consume_s"],
        floor_ratio=fl["consume_s"] / ceil_s,
        **times_of(c),
    )
    print("upserts", json.dumps(results["upserts"]), flush=True)

    base = os.path.join(args.dir, "rep_base.lance")
    shutil.rmtree(base, ignore_errors=True)
    shutil.copytree(dst, base)
    s2, c2 = replicate(kafka, registry, topics[1], dst, args.batch_rows, args.profile)
    up2, dl2 = events_as_rows(src, 2)
    ceil_mix = ceiling(up2, dl2, base, os.path.join(args.dir, "rep_ceiling2.lance"))
    fl2 = floors(kafka, topics[2], c2.records)
    rows = c2.upserts + c2.deletes
    results["mix_90_10"] = dict(
        upserts=c2.upserts,
        deletes=c2.deletes,
        records=c2.records,
        replicator_s=s2,
        replicator_rows_per_s=rows / s2,
        ceiling_s=ceil_mix,
        ceiling_rows_per_s=rows / ceil_mix,
        ratio=s2 / ceil_mix,
        **fl2,
        ratio_to_consume=s2 / fl2["consume_s"],
        floor_ratio=fl2["consume_s"] / ceil_mix,
        **times_of(c2),
    )
    print("mix_90_10", json.dumps(results["mix_90_10"]), flush=True)
    src_rows = lance.dataset(src).count_rows()
    assert lance.dataset(dst).count_rows() == src_rows, "replica differs from the source"


if __name__ == "__main__":
    main()
