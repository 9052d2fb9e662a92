"""A writer task's publishing, without Spark: where its CPU per event goes.

    python -m bench.kafka.bench_publish_task --rows 500000 --profile

Builds one writer slot's share of a micro-batch of inserts (narrow: 5 scalar columns, or
768-d vectors) as the hand-off gives it to the sink (`_event_order`, `_kafka_partition`,
`_total_order`), then runs the sink's steps on it against a local broker and registry
(lance_cdf_devtools): commit order, batches of 65,536, `KafkaChangePublisher.send` with
exactly-once marks, `flush`. Reports the process's CPU per event for the send loop and for
the flush (delivery), and with --profile the cProfile breakdown of the send. --repeat
runs the share that many times into one topic (the first run warms up: not counted).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
import uuid

import numpy as np
import pyarrow as pa

from bench.kafka.bench_kafka import new_topic
from bench.support.results import write_result
from bench.support.tables import narrow, vectors


def share(table: pa.Table, partitions: int, slots: int, version: int) -> pa.Table:
    """Slot 0's events of a commit inserting `table`, as the hand-off delivers them."""
    n = table.num_rows
    rowid = np.arange(n, dtype=np.uint64)
    part = (rowid * 2654435761 % (1 << 32)) % partitions
    mine = part % slots == 0
    events = table.append_column("_rowid", pa.array(rowid))
    events = events.append_column("_change_type", pa.array(["insert"] * n, pa.string()))
    events = events.append_column("_commit_version", pa.array(np.full(n, version, np.int64)))
    stamp = pa.array(np.full(n, 1_700_000_000_000_000, np.int64), pa.timestamp("us", "UTC"))
    events = events.append_column("_commit_timestamp", stamp)
    events = events.append_column("_event_order", pa.array(np.arange(n, dtype=np.int64)))
    events = events.filter(pa.array(mine))
    events = events.append_column("_kafka_partition", pa.array(part[mine].astype(np.int32)))
    total = np.flatnonzero(mine).astype(np.int64) + 1
    return events.append_column("_total_order", pa.array(total))


def run(publisher, whole: pa.Table, version: int) -> tuple[float, float, int]:
    """The sink's steps (`KafkaStreamWriter._write`): (send CPU s, flush CPU s, records)."""
    import pyarrow.compute as pc

    from lance_cdf.kafka.publisher import carry_update_pairs, commit_order

    c0 = time.process_time()
    whole = commit_order(whole)
    owned = pc.unique(whole["_kafka_partition"]).to_pylist()
    publisher.begin()
    marks = publisher.high_water_marks(owned)
    sent = 0
    for events in carry_update_pairs(whole.combine_chunks().to_batches(max_chunksize=65536)):
        sent += publisher.send(events, {version: "Append"}, marks)
    c1 = time.process_time()
    publisher.flush()
    c2 = time.process_time()
    return c1 - c0, c2 - c1, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500_000, help="the micro-batch's events")
    ap.add_argument("--vectors", action="store_true", help="768-d vectors, not narrow rows")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    table = (vectors if args.vectors else narrow)(args.rows)
    with KafkaBroker(heap="1g") as kafka, SchemaRegistry() as registry:
        topic = new_topic(kafka, f"task-{uuid.uuid4().hex[:6]}", args.partitions)
        results = []
        publisher = None
        for i in range(args.repeat + 1):
            whole = share(table, args.partitions, args.slots, version=i + 1)
            if publisher is None:
                publisher = KafkaChangePublisher(
                    kafka.bootstrap_servers,
                    topic,
                    registry.url,
                    user_schema_of(whole.schema),
                    "/bench/t.lance",
                )
            prof = cProfile.Profile() if args.profile and i == args.repeat else None
            if prof:
                prof.enable()
            send_s, flush_s, sent = run(publisher, whole, i + 1)
            if prof:
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            if i:  # the first run warms up
                results.append({"send_s": send_s, "flush_s": flush_s, "records": sent})
                print(
                    f"run {i}: {sent} records, send {send_s / sent * 1e6:.2f} µs, "
                    f"flush {flush_s / sent * 1e6:.2f} µs CPU per record",
                    flush=True,
                )
        best = min(results, key=lambda r: r["send_s"] + r["flush_s"])
        out = {
            "rows": args.rows,
            "vectors": args.vectors,
            "send_us": best["send_s"] / best["records"] * 1e6,
            "flush_us": best["flush_s"] / best["records"] * 1e6,
            "runs": results,
        }
        print(json.dumps(out))
        write_result(args.out, out)


if __name__ == "__main__":
    main()
