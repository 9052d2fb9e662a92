"""A replica to serve from: the same queries on the source and on its replica, and the
replicator's throughput with the source's indexes kept against without (`--no-indexes`).

Runs a real local broker and Apicurio registry (lance_cdf_devtools). A LanceDB table of
`--rows` rows (a 128-d vector, an id, a category, a text) gets an IVF_PQ, a BTREE, a
BITMAP and an INVERTED index, then `--rounds` rounds of appends, updates, deletes and
merge_inserts; `lance-cdf publish --available-now` puts it in a topic. Then, alternated
(`--runs` times each): a fresh replica built from the topic by `lance-cdf replicate` with
the indexes, and one with `--no-indexes` (time from start to exit at `--idle-timeout`,
the idle wait taken off; events applied per second). Last, the same queries (vector
top-10 with the same nprobes/refine_factor, full-text top-10, a filter by id and by
category) through LanceDB against the source and the indexed replica, alternated in
rounds: the median latency of each kind and the replica / source ratio.

    .venv/bin/python -m bench.replicate.bench_serving --rows 20000 --rounds 5 --runs 2 \\
        --out bench/results/results_serving.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
import warnings

import numpy as np
import pyarrow as pa

from bench.support import stats
from bench.support.results import write_result
from lance_cdf_devtools.commands import lance_cdf, publish, spark_env

DIM = 128
CATS = ["red", "green", "blue", "gold"]
WORDS = [f"w{i}" for i in range(2000)]
STABLE = {"new_table_enable_stable_row_ids": "true"}
IDLE_S = 5.0


def rows(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    words = rng.zipf(1.3, size=(len(ids), 8)) % len(WORDS)
    vec = rng.normal(size=(len(ids), DIM)).astype("float32")
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "cat": [CATS[i % len(CATS)] for i in ids],
            "text": [" ".join(WORDS[w] for w in ws) for ws in words],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), DIM),
        }
    )


def source(root: str, n: int, rounds: int):
    import lancedb

    rng = np.random.default_rng(1)
    t = lancedb.connect(root).create_table("items", rows(rng, np.arange(n)), storage_options=STABLE)
    t.create_index("vec", config=lancedb.index.IvfPq(distance_type="cosine", num_partitions=16))
    t.create_index("id", config=lancedb.index.BTree())
    t.create_index("cat", config=lancedb.index.Bitmap())
    t.create_index("text", config=lancedb.index.FTS(with_position=False))
    nxt = n
    for r in range(rounds):
        t.add(rows(rng, np.arange(nxt, nxt + n // 20)))
        nxt += n // 20
        t.update(where=f"id % 29 = {r}", values={"cat": "gold"})
        t.delete(f"id % 43 = {r}")
        keys = np.unique(np.concatenate([rng.integers(0, nxt, n // 50), np.arange(nxt, nxt + 100)]))
        t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
            rows(rng, keys)
        )
        nxt += 100
    t.optimize()
    return t


def replicate(kafka, registry, topic: str, target: str, extra: list[str]) -> float:
    """Seconds from start to the replica's last write (the idle wait taken off)."""
    cmd = lance_cdf(
        "replicate",
        *("--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic),
        *("--schema-registry", registry.url, "--target", target, "--key", "id"),
        *("--group-id", f"bench-{uuid.uuid4().hex[:8]}", "--idle-timeout", str(IDLE_S)),
        *extra,
    )
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    return time.monotonic() - t0 - IDLE_S


def topic_records(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        parts = c.list_topics(topic, timeout=30).topics[topic].partitions
        marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in parts]
        return sum(high - low for low, high in marks)
    finally:
        c.close()


def queries(t, rng: np.random.Generator) -> dict[str, list[float]]:
    """Latency (ms) of each query kind, one query after another."""
    out: dict[str, list[float]] = {"vector": [], "fts": [], "filter_id": [], "filter_cat": []}
    for q in rng.normal(size=(50, DIM)).astype("float32"):
        t0 = time.perf_counter()
        t.search(q).nprobes(8).refine_factor(5).limit(10).select(["id"]).to_arrow()
        out["vector"].append((time.perf_counter() - t0) * 1000)
    for w in WORDS[:30]:
        t0 = time.perf_counter()
        t.search(w, query_type="fts").limit(10).select(["id"]).to_arrow()
        out["fts"].append((time.perf_counter() - t0) * 1000)
    for i in rng.integers(0, 10_000, 30):
        t0 = time.perf_counter()
        t.search().where(f"id = {i}").select(["id"]).to_arrow()
        out["filter_id"].append((time.perf_counter() - t0) * 1000)
    for c in CATS * 5:
        t0 = time.perf_counter()
        t.search().where(f"cat = '{c}'").select(["id"]).limit(100).to_arrow()
        out["filter_cat"].append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--query-rounds", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import lance
    import lancedb

    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    result: dict[str, object] = {"rows": args.rows, "rounds": args.rounds}
    with (
        tempfile.TemporaryDirectory() as work,
        KafkaBroker() as kafka,
        SchemaRegistry() as registry,
    ):
        src_root = os.path.join(work, "src")
        t = source(src_root, args.rows, args.rounds)
        src = os.path.join(src_root, "items.lance")
        topic = f"serving-{uuid.uuid4().hex[:8]}"
        cmd = publish(
            kafka.bootstrap_servers,
            registry.url,
            os.path.join(work, "ck"),
            table=src,
            topic=topic,
            extra=["--starting-version", "1", "--key", "id", "--available-now"],
        )
        subprocess.run(cmd, env=spark_env(), check=True, capture_output=True, timeout=1800)
        times: dict[str, list[float]] = {"indexes": [], "no_indexes": []}
        served = ""
        for run in range(args.runs):
            for arm in ("indexes", "no_indexes") if run % 2 == 0 else ("no_indexes", "indexes"):
                root = os.path.join(work, f"{arm}-{run}")
                target = os.path.join(root, "items.lance")
                extra = [] if arm == "indexes" else ["--no-indexes"]
                times[arm].append(replicate(kafka, registry, topic, target, extra))
                if arm == "indexes":
                    served = root
        events = topic_records(kafka.bootstrap_servers, topic)
        result["records"] = events
        result["replicate_s"] = times
        result["records_per_s"] = {
            arm: round(events / stats.median(ts)) for arm, ts in times.items()
        }
        result["replicate_ratio"] = stats.ratio(
            stats.median(times["indexes"]), stats.median(times["no_indexes"])
        )
        replica = lancedb.connect(served).open_table("items")
        result["replica_indexes"] = sorted(i.name for i in replica.list_indices())
        result["source_indexes"] = sorted(i.name for i in t.list_indices())
        lat: dict[str, dict[str, list[float]]] = {"source": {}, "replica": {}}
        for r in range(args.query_rounds):
            order = (("source", t), ("replica", replica))
            for name, table in order if r % 2 == 0 else order[::-1]:
                for kind, ms in queries(table, np.random.default_rng(r)).items():
                    lat[name].setdefault(kind, []).extend(ms)
        result["query_ms_p50"] = {
            name: {k: round(stats.median(v), 2) for k, v in kinds.items()}
            for name, kinds in lat.items()
        }
        result["query_ratio"] = {
            k: round(
                stats.ratio(stats.median(lat["replica"][k]), stats.median(lat["source"][k])), 2
            )
            for k in lat["source"]
        }
        result["source_rows"] = lance.dataset(src).count_rows()
    print(json.dumps(result, indent=1))
    write_result(args.out, result, indent=1)


if __name__ == "__main__":
    sys.exit(main())
