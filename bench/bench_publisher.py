"""The publisher alone, in one process: the compiled producer loop against confluent-kafka's
Python `produce()` loop, side by side.

    python bench/bench_publisher.py --rows 1000000 --repeat 3

Runs a real local broker and Apicurio registry (lance_cdf.devtools). The events of a
narrow table (5 scalar columns) or of 768-d vectors are read once (read_changes), given
routing columns as `lance-cdf publish`'s writers see them (a Kafka partition per record
and the event order, so every record carries the three headers), then sent by
`KafkaChangePublisher.send` in 50,000-event batches and flushed (every record
acknowledged), alternating the two loops `--repeat` times on fresh topics. Reported per
path: best wall time, the process CPU (the producer's librdkafka threads included) and
events/s; encoding is included (it is the same on both paths).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
from tables import narrow, vectors  # noqa: E402  (bench/ is on sys.path)

BATCH = 50_000


def routed_events(uri: str, partitions: int) -> list[pa.Table]:
    import lance_cdf
    from lance_cdf.keyhash import EVENT_ORDER, PARTITION_COLUMN

    events = lance_cdf.read_changes(uri, 1).read_all()
    n = events.num_rows
    events = events.append_column(
        PARTITION_COLUMN, pa.array(events["id"].to_numpy() % partitions, pa.int32())
    )
    events = events.append_column(EVENT_ORDER, pa.array(np.arange(n), pa.int64()))
    return [events.slice(i, BATCH) for i in range(0, n, BATCH)]


def run(kafka, registry, batches, partitions, compiled: bool) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    from lance_cdf.kafka import native
    from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of

    topic = f"pub-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    os.environ[native.DISABLE_ENV] = "1" if compiled else "0"
    pub = KafkaChangePublisher(kafka.bootstrap_servers, topic, registry.url,
                               user_schema_of(batches[0].schema), "bench", ["id"])  # fmt: skip
    assert (pub.native is not None) == compiled
    ops = {v: "Append" for v in range(1, 1000)}
    pub.begin()
    pub.send(batches[0].slice(0, 10), ops, None)  # registration and connection, untimed
    pub.flush()
    sent = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in batches:
        sent += pub.send(batch, ops, None)
    pub.flush()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    pub.close()
    return {"wall_s": wall, "cpu_s": cpu, "records": sent, "eps": sent / wall,
            "cpu_us_per_record": cpu / sent * 1e6}  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--vector-rows", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from lance_cdf.devtools import KafkaBroker, SchemaRegistry

    results = {}
    with KafkaBroker(heap="1g") as kafka, SchemaRegistry() as registry:
        for label, table in (
            ("narrow", narrow(args.rows)),
            ("vector768", vectors(args.vector_rows)),
        ):
            uri = os.path.join(args.dir, f"publisher_{label}.lance")
            shutil.rmtree(uri, ignore_errors=True)
            lance.write_dataset(table, uri, enable_stable_row_ids=True, max_rows_per_file=250_000)
            batches = routed_events(uri, args.partitions)
            runs = {"python": [], "compiled": []}
            for _ in range(args.repeat):
                for compiled in (False, True):
                    r = run(kafka, registry, batches, args.partitions, compiled)
                    runs["compiled" if compiled else "python"].append(r)
                    print(label, "compiled" if compiled else "python", json.dumps(r), flush=True)
            best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in runs.items()}
            results[label] = {
                "events": sum(b.num_rows for b in batches), "runs": runs, "best": best,
                "compiled_vs_python_eps": best["compiled"]["eps"] / best["python"]["eps"],
            }  # fmt: skip
            print(label, "compiled/python", round(results[label]["compiled_vs_python_eps"], 2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
