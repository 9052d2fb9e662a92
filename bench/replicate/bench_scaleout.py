"""Replication of N busy tables by one `replicate --database-target` process against several
of one group (they share the tables: replicate/table_shares.py).

Runs a real local broker and Apicurio registry (lance_cdf_devtools). N Lance tables each get
V versions (an append of R rows, an update of a tenth of them); every version's records go
to `P.<table>` and its BEGIN / END to `P.<table>.transaction` (the publisher classes the
Spark sink uses). Then, for each process count, a fresh replica database is built from the
topics by that many `lance-cdf replicate --database-target` processes of one new group:
the time from their start until every replica holds its source's last version (the
processes' start-up included), and the events applied per second.

    .venv/bin/python -m bench.replicate.bench_scaleout --tables 30 --versions 20 --rows 2000 \\
        --processes 1,3 --out bench/results/results_scaleout.json
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from bench.support.results import write_result


def build(root: str, prefix: str, args: argparse.Namespace, kafka, registry) -> int:
    """The tables and their topics; the number of change events published."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    made = admin.create_topics(
        [NewTopic(f"{prefix}.t{i:03d}", args.partitions, 1) for i in range(args.tables)]
        + [NewTopic(f"{prefix}.t{i:03d}.transaction", 1, 1) for i in range(args.tables)]
    )
    for f in made.values():
        f.result(30)
    events_total = 0
    for i in range(args.tables):
        uri = os.path.join(root, f"t{i:03d}.lance")
        topic = f"{prefix}.t{i:03d}"
        for v in range(args.versions):
            ids = np.arange(v * args.rows, (v + 1) * args.rows)
            data = pa.table({"id": ids, "s": [f"v{v}-{x}" for x in ids], "x": ids * 0.5})
            if v == 0:
                ds = lance.write_dataset(data, uri, enable_stable_row_ids=True)
            else:
                ds = lance.write_dataset(data, uri, mode="append")
                ds.update({"x": "x + 1"}, where=f"id % 10 = {v % 10}")
        end = lance.dataset(uri).version
        events_total += publish_versions(uri, topic, 1, end, args.partitions, kafka, registry)
    return events_total


def publish_versions(
    uri: str, topic: str, start: int, end: int, partitions: int, kafka, registry
) -> int:
    """Versions `start`..`end` of table `uri` published as the Spark sink publishes them:
    the records to `topic` (a row's to one of `partitions`), then each version's BEGIN /
    END to `<topic>.transaction`. Returns the number of change events."""
    import lance_cdf
    from lance_cdf.core.feed import ChangeFeed
    from lance_cdf.core.stream_columns import PARTITION_COLUMN
    from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of
    from lance_cdf.kafka.transactions import TransactionWriter, VersionCounts

    feed = ChangeFeed(uri)
    events = lance_cdf.read_changes(uri, start, end).read_all()
    rowids = events["_rowid"].to_numpy().astype(np.int64)
    events = events.append_column(
        PARTITION_COLUMN, pa.array((rowids % partitions).astype(np.int32))
    )
    ops = {v: feed.table.manifest(v).operation for v in range(start, end + 1)}
    pub = KafkaChangePublisher(
        kafka.bootstrap_servers, topic, registry.url, user_schema_of(events.schema), uri
    )
    counts = {v: VersionCounts(v) for v in range(start, end + 1)}
    writer = TransactionWriter(kafka.bootstrap_servers, f"{topic}.transaction", registry.url, uri)
    for attempt in range(40):  # (a fresh topic's leader is elected after its creation)
        try:
            if attempt == 0:
                pub.publish(events, ops)
                counts.update(pub.version_counts)
            writer.write(list(counts.values()))
            break
        except KafkaException:
            if attempt == 39:
                raise
            time.sleep(0.5)
    return int(events.num_rows)


def replicate(
    root: str, prefix: str, processes: int, args: argparse.Namespace, kafka, registry, work: str
) -> float:
    """Seconds from starting `processes` replicators of one new group until every replica
    holds its source's last version."""
    from lance_cdf.replicate.replica import ReplicaTable, source_version_of

    dst = os.path.join(work, f"replica-{processes}-{uuid.uuid4().hex[:6]}")
    want = {
        f"t{i:03d}": lance.dataset(os.path.join(root, f"t{i:03d}.lance")).version
        for i in range(args.tables)
    }
    cmd = [
        sys.executable,
        "-m",
        "lance_cdf.cli",
        "replicate",
        "--bootstrap-servers",
        kafka.bootstrap_servers,
        "--schema-registry",
        registry.url,
        "--database-target",
        dst,
        "--topic-prefix",
        prefix,
        "--group-id",
        f"bench-{uuid.uuid4().hex[:8]}",
        "--refresh-interval",
        "1",
    ]

    def done() -> bool:
        for name, version in want.items():
            uri = os.path.join(dst, f"{name}.lance")
            if not os.path.isdir(uri):
                return False
            if source_version_of(ReplicaTable(uri, []).position()) != version:
                return False
        return True

    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, f"rep-{processes}-{n}.log"), "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        for n in range(processes)
    ]
    try:
        while not done():
            if time.perf_counter() - t0 > args.timeout:
                raise SystemExit(f"{processes} process(es): not caught up in {args.timeout} s")
            time.sleep(0.2)
        return time.perf_counter() - t0
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=30)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--rows", type=int, default=2000, help="rows appended per version")
    ap.add_argument("--partitions", type=int, default=2, help="partitions per table topic")
    ap.add_argument("--processes", default="1,3")
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    results: dict = {"tables": args.tables, "versions": args.versions, "rows": args.rows}
    with (
        tempfile.TemporaryDirectory() as work,
        KafkaBroker() as kafka,
        SchemaRegistry() as registry,
    ):
        root = os.path.join(work, "src")
        os.makedirs(root)
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        t0 = time.perf_counter()
        events = build(root, prefix, args, kafka, registry)
        results["events"] = events
        results["publish_s"] = round(time.perf_counter() - t0, 1)
        print(f"published {events} events of {args.tables} tables", flush=True)
        for n in [int(x) for x in args.processes.split(",")]:
            seconds = replicate(root, prefix, n, args, kafka, registry, work)
            results[f"processes_{n}"] = {
                "seconds": round(seconds, 1),
                "events_per_s": round(events / seconds),
            }
            print(f"{n} process(es): {seconds:.1f} s, {events / seconds:,.0f} events/s")
    write_result(args.out, results)


if __name__ == "__main__":
    main()
