"""The producer's per-record cost, by the way records are handed to it (no broker).

    python -m bench.kafka.bench_produce_calls --records 200000 --runs 5

Process CPU per record to queue `--records` pre-serialised narrow-sized records (no broker:
nothing is sent, the queue is purged after each run), min and median over --runs:
  * the earlier publisher: a Python loop calling `produce` with keywords, each record's
    headers a dict (version, op, position) copied from a shared one;
  * the publisher now: `map` over `produce` with positional arguments, each record's
    header dict a shared (version, op) one merged with its position's by `map`;
  * the same `map` without headers;
  * `produce_batch` (confluent-kafka 2.12+), which takes no headers, its dicts included;
and the cost of making the headers alone: lists of pairs by `map` (tracked by the garbage
collector; with it on and paused), dicts merged by `map` (not tracked), dicts by a
comprehension.
"""

from __future__ import annotations

import argparse
import gc
import operator
import time
from collections import deque
from itertools import repeat

from confluent_kafka import Producer

from bench.support.results import write_result

VERSION, OP, POSITION = "lance-cdf.commit-version", "lance-cdf.op", "lance-cdf.position"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    n = args.records
    keys = [b"\x00\x00\x00\x00\x01\x02" + i.to_bytes(4, "little") for i in range(n)]
    values = [b"\x00\x00\x00\x00\x02" + b"x" * 70 + i.to_bytes(4, "little") for i in range(n)]
    positions = [b"12.2.%d.0" % i for i in range(n)]
    parts = [i % 4 for i in range(n)]
    shared = {VERSION: b"12", OP: b"c"}

    def loop(p):
        heads = [{**shared, POSITION: x} for x in positions]
        produce = p.produce
        for k, v, q, h in zip(keys, values, parts, heads, strict=True):
            try:
                produce("t", key=k, value=v, partition=q, headers=h)
            except BufferError:
                pass

    vo = [{VERSION: b"12", OP: b"c"}] * n  # one shared dict per (version, op)

    def headers():  # as `publisher.record_headers` makes them: no Python code per record
        return list(map(operator.or_, vo, map(dict.fromkeys, repeat((POSITION,)), positions)))

    def mapped(p):
        heads = headers()
        deque(
            map(p.produce, repeat("t"), values, keys, parts, *map(repeat, (None, None, 0)), heads),
            maxlen=0,
        )

    def bare(p):
        deque(map(p.produce, repeat("t"), values, keys, parts), maxlen=0)

    def batch(p):
        msgs = [
            {"key": k, "value": v, "partition": q}
            for k, v, q in zip(keys, values, parts, strict=True)
        ]
        p.produce_batch("t", msgs)

    ways = {
        "loop, dict headers (earlier)": loop,
        "map, header dicts merged by map (now)": mapped,
        "map, no headers": bare,
        "produce_batch, no headers": batch,
    }
    took: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.runs):
        for name, way in ways.items():
            p = Producer(
                {
                    "bootstrap.servers": "127.0.0.1:1",  # nothing listens: records stay queued
                    "queue.buffering.max.messages": 2 * n,
                    "enable.idempotence": True,
                    "linger.ms": 20,
                    "log_level": 0,
                }
            )
            c = time.process_time()
            way(p)
            took[name].append((time.process_time() - c) / n * 1e6)
            p.purge()
            p.flush(0)

    def lists():
        pairs = zip(repeat((VERSION, b"12")), repeat((OP, b"c")), zip(repeat(POSITION), positions))
        return list(map(list, pairs))

    def comprehension():
        return [{VERSION: b"12", OP: b"c", POSITION: x} for x in positions]

    makers = (
        ("header lists by map (tracked)", lists, (False, True)),
        ("header dicts by map, merged (now)", headers, (False,)),
        ("header dicts by a comprehension", comprehension, (False,)),
    )
    for name, make, pauses in makers:
        for paused in pauses:
            label = f"making the {name}, collector {'paused' if paused else 'on'}"
            took[label] = []
            for _ in range(args.runs):
                if paused:
                    gc.disable()
                c = time.perf_counter()
                made = make()
                took[label].append((time.perf_counter() - c) / n * 1e6)
                del made
                gc.enable()
    for name, us in took.items():
        us.sort()
        print(f"{name}: min {us[0]:.2f}, median {us[len(us) // 2]:.2f} µs CPU per record")
    write_result(args.out, {"records": n, "us_per_record": took})


if __name__ == "__main__":
    main()
