"""`KafkaChangePublisher.send`'s CPU per record, this tree's against an earlier one's, in
one process (no broker: the records stay queued and are purged after each run).

    python -m bench.kafka.bench_publish_send --before /path/to/earlier/checkout --runs 6

One writer slot's share of a micro-batch of --rows narrow inserts (as the hand-off gives
it: `bench_publish_task.share`), in commit order and batches of 65,536, sent with
exactly-once marks (none held yet) through a producer that reaches no broker: Arrow → Avro,
headers and the produce calls, without the network and compression the broker's
acknowledgements would add. The earlier tree's `lance_cdf/kafka/publisher.py` is loaded
beside this one's (the rest of lance_cdf is this tree's); runs alternate, min and median.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from types import ModuleType

from confluent_kafka import Producer

from bench.kafka.bench_publish_task import share
from bench.support.results import write_result
from bench.support.tables import narrow, vectors
from lance_cdf.kafka import publisher as now


def earlier(tree: str) -> ModuleType:
    path = os.path.join(tree, "lance_cdf", "kafka", "publisher.py")
    spec = importlib.util.spec_from_file_location("earlier_publisher", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def send_us(module: ModuleType, whole, batches) -> float:
    """Process CPU per record of sending `batches` with `module`'s publisher."""
    pub = module.KafkaChangePublisher(
        "127.0.0.1:1", "topic", "http://127.0.0.1:1", module.user_schema_of(whole.schema), "t"
    )
    pub.key_writer.header = b"\x00\x00\x00\x00\x07"  # (no registry: ids set by hand)
    pub.value_writer.header = b"\x00\x00\x00\x01\x02"
    pub.topic_ready = True
    pub.producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:1",  # nothing listens: records stay queued
            "queue.buffering.max.messages": 1_000_000,
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 20,
            "log_level": 0,
        }
    )
    c, n = time.process_time(), 0
    for batch in batches:
        n += pub.send(batch, {1: "Append"}, {p: None for p in range(4)})
    took = (time.process_time() - c) / n * 1e6
    pub.producer.purge()
    pub.producer.flush(0)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="an earlier checkout of the project")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--vectors", action="store_true", help="768-d vectors, not narrow rows")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    whole = share((vectors if args.vectors else narrow)(args.rows), 4, 2, 1)
    ordered = now.commit_order(whole).combine_chunks().to_batches(max_chunksize=65536)
    batches = list(now.carry_update_pairs(ordered))
    ways = {"before": earlier(args.before), "after": now}
    took: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.runs):
        for name, module in ways.items():
            took[name].append(send_us(module, whole, batches))
    out = {"rows": args.rows, "vectors": args.vectors, "records": whole.num_rows}
    for name, us in took.items():
        us.sort()
        out[name] = {"min_us": us[0], "median_us": us[len(us) // 2], "runs_us": us}
        print(f"{name}: min {us[0]:.2f}, median {us[len(us) // 2]:.2f} µs CPU per record")
    write_result(args.out, out)


if __name__ == "__main__":
    main()
