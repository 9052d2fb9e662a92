"""Where a table's first use in a database publisher's process goes.

    python -m bench.spark.bench_first_use --tables 200 --sample 12 \
        --out bench/results/results_first_use.json

Starts a real local broker and Apicurio registry (lance_cdf_devtools), a LanceDB database of
--tables small tables (each table's topic created beforehand with 2 partitions, as
bench_database.py does), then in this one process, for --sample tables in turn, times each
step a writer task (spark/sink/kafka_sink.py `_write_database`) and the driver's commit (BEGIN/END)
take the first time they meet a table, then the same steps again (the table's second use):

- writer: the table's URI (a database listing on a cache miss), its topic and transaction
  topic (admin describe / create), its feed (manifests, schema), the publisher (registry
  client and producer), its two registry subjects, the partitions' high-water marks, one
  record to each partition produced and acknowledged;
- driver: the transaction writer (registry client, producer), its first BEGIN/END write
  (transaction topic check, its last record, two subjects, produce, acknowledge).

The first sampled table also pays the process's imports and first connections: it is
reported apart. Prints per step the median over the sampled tables (first use, second use).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.spark.bench_database import make_database
from bench.support import stats
from bench.support.results import write_result


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--sample", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    work = tempfile.mkdtemp(prefix="bench-first-use-")
    root = os.path.join(work, "db")
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    result: dict[str, Any] = {"tables": args.tables, "sample": args.sample}
    try:
        with KafkaBroker() as kafka, SchemaRegistry() as registry:
            paths = make_database(root, args.tables)
            admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
            for _t, future in admin.create_topics(
                [NewTopic(f"{prefix}.{n}", 2, 1) for n in paths]
            ).items():
                future.result(60)
            names = sorted(paths)[:: max(1, len(paths) // args.sample)][: args.sample]
            runs = [
                measure(kafka.bootstrap_servers, registry.url, root, prefix, n, paths[n])
                for n in names
            ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    steps = list(runs[0])
    result["process_first_table_s"] = {s: round(runs[0][s], 4) for s in steps}
    result["median_s"] = {s: round(stats.median(r[s] for r in runs[1:]), 4) for s in steps}
    result["max_s"] = {s: round(max(r[s] for r in runs[1:]), 4) for s in steps}
    print(json.dumps(result, indent=1))
    write_result(args.out, result, indent=1)
    return 0


def retried(fn: Callable[[], Any]) -> Any:
    """fn(), retried while a topic just created is not known to every client yet (as the
    sink's commit rides it out)."""
    from confluent_kafka import KafkaException

    for _ in range(100):
        try:
            return fn()
        except KafkaException:
            time.sleep(0.1)
    return fn()


def measure(
    bootstrap: str, registry_url: str, root: str, prefix: str, name: str, path: str
) -> dict:
    """Seconds per step for table `name`: its first use, then its second."""
    from lance_cdf.avro.schema import TableName
    from lance_cdf.core.feed import ChangeFeed
    from lance_cdf.kafka.outage import RideOut
    from lance_cdf.kafka.publisher import KafkaChangePublisher
    from lance_cdf.kafka.topic_settings import TopicSettings
    from lance_cdf.kafka.transactions import TransactionWriter, VersionCounts
    from lance_cdf.ops.clientconfig import KafkaConnection
    from lance_cdf.spark.sink import database_sink
    from lance_cdf.spark.source.handoff import table_digest

    out: dict[str, float] = {}

    def step(label: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        value = fn()
        out[label] = out.get(label, 0.0) + time.perf_counter() - t0
        return value

    topic = f"{prefix}.{name}"
    uri = step("w.table_uri", lambda: database_sink.table_uri(root, name, table_digest(path), {}))
    step(
        "w.topics",
        lambda: database_sink.table_topic(
            KafkaConnection(bootstrap),
            topic,
            TopicSettings.of(2),
            f"{topic}.transaction",
            RideOut(bootstrap, None),
        ),
    )
    feed = step("w.feed", lambda: ChangeFeed(uri, {}, check_latest=False))
    schema = step("w.feed", lambda: feed.schema_at(feed.latest_version()))
    pub = step(
        "w.publisher",
        lambda: KafkaChangePublisher(
            bootstrap, topic, registry_url, schema, TableName(prefix, name, uri)
        ),
    )
    step("w.subjects", lambda: (pub.key_writer.wire_header(), pub.value_writer.wire_header()))
    for use in ("first", "second"):
        step(f"w.marks_{use}", lambda: pub.high_water_marks([0, 1]))

        def produce() -> None:
            for p in (0, 1):
                pub.producer.produce(topic, key=b"k", value=b"v", partition=p)
            pub.flush()

        step(f"w.produce_{use}", produce)
    pub.close()
    writer = step(
        "d.txn_writer",
        lambda: TransactionWriter(
            bootstrap, f"{topic}.transaction", registry_url, f"{prefix}.{name}"
        ),
    )
    for v, use in ((1, "first"), (2, "second")):
        step(
            f"d.txn_write_{use}",
            lambda v=v: retried(lambda: writer.write([VersionCounts(v, {0: (1, 1)})])),
        )
    out["w.first_use_total"] = sum(
        out[k]
        for k in (
            "w.table_uri",
            "w.topics",
            "w.feed",
            "w.publisher",
            "w.subjects",
            "w.marks_first",
            "w.produce_first",
        )
    )
    out["w.second_use_total"] = out["w.marks_second"] + out["w.produce_second"]
    return out


if __name__ == "__main__":
    sys.exit(main())
