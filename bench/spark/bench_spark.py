"""The Spark source's overhead and latency.

    python -m bench.spark.bench_spark --rows 1000000 --updates 100000 --commits 50

Throughput: one commit inserting --rows rows and one updating --updates rows
(5 scalar columns), read through `spark.read.format("lance-cdf")` into Spark's
noop sink, side by side with `read_changes` (no Spark) and with pylance reading
the same rows directly (a version-column filter scan, plus a take of the
pre-images for the update). Latency: a stream with a 500 ms trigger into a
foreachBatch sink while a writer appends --commits small commits; commit-to-
visible time per commit, p50 and p99.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time

from bench.support.results import write_result

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import lance  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import lance_cdf  # noqa: E402
from bench.support import stats


def rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": ids,
            "name": pa.array([f"n{i}" for i in ids], pa.string()),
            "score": ids * 0.5,
            "ts": ids * 1000,
            "flag": ids % 2 == 0,
        }
    )


def timed(fn, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return stats.median(out)


def pylance_direct(uri: str, version: int) -> int:
    """The same rows read with pylance alone (what a hand-written reader would do)."""
    ds = lance.dataset(uri, version=version)
    post = ds.to_table(filter=f"_row_last_updated_at_version = {version}", with_row_id=True)
    n = post.num_rows
    updated = lance.dataset(uri, version=version).to_table(
        columns=[],
        with_row_id=True,
        filter=f"_row_last_updated_at_version = {version} AND _row_created_at_version < {version}",
    )["_rowid"]
    if len(updated):
        n += lance.dataset(uri, version=version - 1)._take_rows(updated.to_pylist()).num_rows
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--updates", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from pyspark.sql import SparkSession

    from lance_cdf.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    os.makedirs(args.dir, exist_ok=True)
    uri = os.path.join(args.dir, "spark.lance")
    shutil.rmtree(uri, ignore_errors=True)
    lance.write_dataset(rows(0, 10), uri, enable_stable_row_ids=True)
    lance.write_dataset(rows(10, args.rows), uri, mode="append", max_rows_per_file=250_000)
    lance.dataset(uri).update(
        {"score": "score + 1"}, where=f"id >= 10 AND id < {10 + args.updates}"
    )

    results = {}
    for label, version in (("insert", 2), ("update", 3)):

        def via_spark(v=version):
            reader = spark.read.format("lance-cdf").option("path", uri)
            df = reader.option("startingVersion", v).option("endingVersion", v).load()
            df.write.format("noop").mode("overwrite").save()

        events = sum(b.num_rows for b in lance_cdf.read_changes(uri, version, version))
        spark_s = timed(via_spark, args.repeat)
        cdf_s = timed(
            lambda v=version: sum(1 for _ in lance_cdf.read_changes(uri, v, v)), args.repeat
        )
        direct_s = timed(lambda v=version: pylance_direct(uri, v), args.repeat)
        results[label] = dict(
            events=events,
            spark_s=spark_s,
            read_changes_s=cdf_s,
            pylance_s=direct_s,
            spark_vs_pylance=spark_s / direct_s,
            spark_vs_read_changes=spark_s / cdf_s,
            spark_events_per_s=events / spark_s,
        )
        print(label, json.dumps(results[label]), flush=True)

    # latency: commit -> visible in a foreachBatch sink, 500 ms trigger
    seen: dict[int, float] = {}

    def sink(df, _batch_id):
        now = time.time()
        for r in df.select("_commit_version").distinct().collect():
            seen.setdefault(r[0], now)

    ck = os.path.join(args.dir, "spark-latency-ck")
    shutil.rmtree(ck, ignore_errors=True)
    query = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", ck)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    committed: dict[int, float] = {}

    def writer():
        rng = np.random.default_rng(0)
        for i in range(args.commits):
            time.sleep(float(rng.uniform(0.3, 0.9)))
            lance.write_dataset(rows(10_000_000 + i * 10, 10), uri, mode="append")
            committed[lance.dataset(uri).version] = time.time()

    time.sleep(3)  # let the first (empty) micro-batch run
    w = threading.Thread(target=writer)
    w.start()
    w.join()
    deadline = time.time() + 60
    while time.time() < deadline and not set(committed) <= set(seen):
        time.sleep(0.1)
    query.stop()
    lat = sorted(seen[v] - t for v, t in committed.items() if v in seen)
    results["latency"] = dict(
        commits=len(committed),
        visible=len(lat),
        p50_s=stats.percentile(lat, 50),
        p99_s=stats.percentile(lat, 99),
        trigger="500 ms",
    )
    print("latency", json.dumps(results["latency"]), flush=True)
    write_result(args.out, results)
    spark.stop()


if __name__ == "__main__":
    main()
