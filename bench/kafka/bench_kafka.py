"""Publishing throughput: committed change -> acknowledged Kafka records.

    python -m bench.kafka.bench_kafka --narrow-rows 1000000 --vector-rows 100000 --commits 5

Runs a real local broker and Apicurio registry (lance_cdf_devtools). For each
table (narrow: 5 scalar columns; vector: id + 768-d float32 embedding), --commits
commits insert the rows; the streams read one commit per micro-batch
(maxVersionsPerTrigger 1). Each stream's time runs from the query's start to its last
acknowledgement; its *steady* rate leaves out the first micro-batch (start-up: Python
workers, producers, schema registration; reported apart as `first_batch_s`): the
events of micro-batches 2.. over their trigger durations. Measured side by side in one
run:
  * lance-cdf      the lance-cdf stream into the lance-cdf-kafka sink
                   (Trigger.AvailableNow), Avro via the registry, every record acked:
                   routed into --writers tasks (publish.route, as `lance-cdf publish`),
                   and coalesced to one task (the earlier way), side by side;
  * ceiling        a plain confluent-kafka producer loop sending the same
                   records pre-serialised (serialisation not timed);
  * spark-kafka    Spark's built-in Kafka sink with to_avro (no registry) over the
                   same lance-cdf stream, when the spark-sql-kafka / spark-avro jars
                   resolve from Maven Central (--spark-kafka-version).
Beside each rate: the whole machine's busy CPU per event over the same window
(`machine_cpu_us_per_event`, from /proc/stat) and how busy the cores were
(`machine_busy`, 1.0 = every core): on a machine whose cores are all in use, the rates
follow the CPU each path needs per event.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid

from bench.support.results import write_result

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import lance  # noqa: E402
import pyarrow as pa  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from bench.support import stats
from bench.support.tables import narrow, vectors


def new_topic(kafka, topic, partitions) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


def lance_cdf_publish(
    spark, uri, kafka, registry, topic, ck, writers=None, partitions=1, handoff=False, per_batch=0
):
    """writers=None: the stream coalesced to one task (the earlier `lance-cdf publish`);
    else `publish.route` into that many writer tasks (the second round's `lance-cdf
    publish`), or with `handoff` that many writer slots reading their own share (option
    writerSlots, what `lance-cdf publish` does now; `per_batch`: the events of each
    micro-batch, as its rows are work items)."""
    from lance_cdf.spark.publish.runner import route

    t0 = time.perf_counter()
    changes = spark.readStream.format("lance-cdf").option("path", uri)
    changes = changes.option("startingVersion", 1).option("maxVersionsPerTrigger", 1)
    if writers is None:
        changes = changes.load().coalesce(1)
    elif handoff:
        changes = (
            changes.option("keyHash", "_rowid")
            .option("writerSlots", writers)
            .option("kafkaPartitions", partitions)
            .load()
        )
    else:
        changes = route(changes.option("keyHash", "_rowid").load(), partitions, writers)
    q = (
        changes.writeStream.format("lance-cdf-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", topic)
        .option("schema.registry.url", registry.url)
        .option("table", uri)
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
    )
    return _finish(q, t0, per_batch if handoff else 0)


class MachineCpu:
    """Busy CPU-seconds of the whole machine (/proc/stat: every process, the broker's and
    Spark's JVMs included), sampled every 0.1 s: a path's CPU per event over its steady
    window says what it costs where wall time only says how the shared cores were split."""

    def __init__(self):
        import threading

        self.samples: list[tuple[float, float]] = []
        self.cores = os.cpu_count() or 1
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        hz = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
            # user nice system idle iowait irq softirq steal
            busy = sum(fields[:3]) + sum(fields[5:8])
            self.samples.append((time.time(), busy / hz))
            time.sleep(0.1)

    def busy(self, t: float) -> float:
        """Busy CPU-seconds up to wall-clock time `t` (interpolated)."""
        import bisect

        times = [s[0] for s in self.samples]
        i = bisect.bisect_left(times, t)
        if i == 0:
            return self.samples[0][1]
        if i >= len(times):
            return self.samples[-1][1]
        (ta, ba), (tb, bb) = self.samples[i - 1], self.samples[i]
        return ba + (bb - ba) * (t - ta) / (tb - ta)

    def window(self, t0: float, t1: float, events: int) -> dict:
        used = self.busy(t1) - self.busy(t0)
        return {
            "machine_cpu_us_per_event": used / events * 1e6 if events else None,
            "machine_busy": used / ((t1 - t0) * self.cores) if t1 > t0 else None,
        }


MACHINE: MachineCpu | None = None


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _finish(q, t0, per_batch=0) -> dict:
    """Total time, and the steady rate: micro-batches after the first (start-up).
    `per_batch`: the events of each micro-batch when its rows are not events."""
    q.awaitTermination()
    if q.exception():
        raise RuntimeError(q.exception())
    total = time.perf_counter() - t0
    batches = [
        (per_batch or p.numInputRows, p.durationMs["triggerExecution"] / 1000)
        for p in q.recentProgress
        if p.numInputRows
    ]
    if os.environ.get("BENCH_DURATIONS"):  # where each micro-batch's time went (Spark's split)
        for p in q.recentProgress:
            print("durations", p.batchId, p.numInputRows, dict(p.durationMs), flush=True)
    rest = batches[1:]
    steady = sum(n for n, _ in rest) / sum(s for _, s in rest) if rest else None
    out = {
        "s": total,
        "first_batch_s": batches[0][1] if batches else None,
        "steady_eps": steady,
        "batches": len(batches),
    }
    progress = [p for p in q.recentProgress if p.numInputRows]
    if MACHINE is not None and len(progress) > 1:  # the machine's CPU over micro-batches 2..
        last = progress[-1]
        end = _epoch(last.timestamp) + last.durationMs["triggerExecution"] / 1000
        out.update(MACHINE.window(_epoch(progress[1].timestamp), end, sum(n for n, _ in rest)))
    return out


def ceiling(uri, kafka, registry, topic) -> tuple[float, int]:
    """Serialise the same records up front, then time only produce + acks."""
    import lance_cdf
    from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of

    reader = lance_cdf.read_changes(uri, 1, batch_size=20_000)  # every commit
    ops = {v: "Append" for v in range(1, lance.dataset(uri).version + 1)}
    pub = KafkaChangePublisher(
        kafka.bootstrap_servers, topic, registry.url, user_schema_of(reader.schema), uri
    )
    from lance_cdf.avro.schema import change_records

    payload = []
    for batch in reader:  # in chunks: Python rows of 768-d vectors are ~25 GB per million
        table = pa.Table.from_batches([batch])
        encoded = pub._encode(table, ops, 0)  # the publisher's own encoding
        if encoded is not None:
            payload += zip(encoded.keys.to_pylist(), encoded.values.to_pylist(), strict=True)
            continue
        records = change_records(table, pub.user_columns, ops, uri, None, "x", 0)
        payload += [(pub.key_writer.encode(k), pub.value_writer.encode(v)) for k, v, _ in records]
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 20,
            "queue.buffering.max.messages": 500000,
        }
    )
    t0, wall0 = time.perf_counter(), time.time()
    for key, value in payload:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.2)
    assert producer.flush(300) == 0
    if MACHINE is not None:
        CEILING_CPU.update(MACHINE.window(wall0, time.time(), len(payload)))
    return time.perf_counter() - t0, len(payload)


CEILING_CPU: dict = {}


def spark_kafka(spark, uri, kafka, topic, ck) -> dict:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    t0 = time.perf_counter()
    df = (
        spark.readStream.format("lance-cdf")
        .option("path", uri)
        .option("startingVersion", 1)
        .option("maxVersionsPerTrigger", 1)
        .load()
    )
    user = [c for c in df.columns if not c.startswith("_")]
    envelope = F.struct(
        F.lit(None).cast("struct<x:int>").alias("before"),
        F.struct(*user).alias("after"),
        F.lit("c").alias("op"),
        F.col("_commit_version"),
    )
    out = df.select(
        to_avro(F.struct(F.col("_rowid"))).alias("key"), to_avro(envelope).alias("value")
    )
    q = (
        out.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("topic", topic)
        .option("kafka.acks", "all")
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
    )
    return _finish(q, t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--narrow-rows", type=int, default=1_000_000)
    ap.add_argument("--vector-rows", type=int, default=100_000)
    ap.add_argument("--spark-kafka-version", default="4.0.0")
    ap.add_argument("--dir", default="bench/out")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", choices=["narrow", "vector768"], default=None)
    ap.add_argument("--writers", type=int, default=2, help="routed lance-cdf writer tasks")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of every topic")
    ap.add_argument("--commits", type=int, default=5, help="commits the rows are inserted in")
    paths = ("coalesce1", "routed", "handoff", "ceiling", "spark")
    ap.add_argument("--paths", nargs="+", choices=paths, default=list(paths))
    args = ap.parse_args()
    global MACHINE
    MACHINE = MachineCpu()

    from pyspark.sql import SparkSession

    from lance_cdf.spark import register
    from lance_cdf_devtools import KafkaBroker, SchemaRegistry

    v = args.spark_kafka_version
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .config(
            "spark.jars.packages",
            f"org.apache.spark:spark-sql-kafka-0-10_2.13:{v},org.apache.spark:spark-avro_2.13:{v}",
        )
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    results = {}
    with KafkaBroker(heap="1g") as kafka, SchemaRegistry() as registry:
        for label, make in (("narrow", narrow), ("vector768", vectors)):
            if args.only and label != args.only:
                continue
            table = make(args.narrow_rows if label == "narrow" else args.vector_rows)
            uri = os.path.join(args.dir, f"kafka_{label}.lance")
            shutil.rmtree(uri, ignore_errors=True)
            step = -(-table.num_rows // args.commits)
            for i in range(0, table.num_rows, step):
                lance.write_dataset(
                    table.slice(i, step),
                    uri,
                    enable_stable_row_ids=True,
                    max_rows_per_file=250_000,
                    mode="append" if i else "create",
                )
            n = table.num_rows
            tag = uuid.uuid4().hex[:6]
            ck = os.path.join(args.dir, f"kafka-ck-{label}-{tag}")
            p = args.partitions
            step_events = step  # every micro-batch is one commit of `step` inserts
            none: dict = {}
            cdf = routed = handoff = sk = none
            sk_err = ceil_s = ceil_eps = sent = None
            if "coalesce1" in args.paths:
                cdf = lance_cdf_publish(
                    spark, uri, kafka, registry, new_topic(kafka, f"cdf-{label}-{tag}", p), ck
                )
            if "routed" in args.paths:
                routed = lance_cdf_publish(
                    spark,
                    uri,
                    kafka,
                    registry,
                    new_topic(kafka, f"routed-{label}-{tag}", p),
                    ck + "-routed",
                    writers=args.writers,
                    partitions=p,
                )
            if "handoff" in args.paths:
                handoff = lance_cdf_publish(
                    spark,
                    uri,
                    kafka,
                    registry,
                    new_topic(kafka, f"handoff-{label}-{tag}", p),
                    ck + "-handoff",
                    writers=args.writers,
                    partitions=p,
                    handoff=True,
                    per_batch=step_events,
                )
            if "ceiling" in args.paths:
                ceil_s, sent = ceiling(
                    uri, kafka, registry, new_topic(kafka, f"ceil-{label}-{tag}", p)
                )
                ceil_eps = sent / ceil_s
            if "spark" in args.paths:
                try:
                    sk = spark_kafka(
                        spark, uri, kafka, new_topic(kafka, f"sk-{label}-{tag}", p), ck + "-sk"
                    )
                except Exception as exc:  # jars missing or incompatible with this Spark
                    sk_err = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

            best = handoff if handoff else routed
            row = dict(
                rows=n,
                records=sent,
                commits=args.commits,
                writers=args.writers,
                lance_cdf_coalesce1=cdf,
                lance_cdf_routed=routed,
                lance_cdf=handoff,
                spark_kafka=sk,
                spark_kafka_error=sk_err,
                ceiling_s=ceil_s,
                ceiling_eps=ceil_eps,
                ceiling_cpu=dict(CEILING_CPU),
                lance_cdf_steady_vs_spark=stats.ratio(best.get("steady_eps"), sk.get("steady_eps")),
                lance_cdf_steady_vs_ceiling=stats.ratio(best.get("steady_eps"), ceil_eps),
                routed_steady_vs_spark=stats.ratio(routed.get("steady_eps"), sk.get("steady_eps")),
            )
            results[label] = row
            print(label, json.dumps(row), flush=True)
    write_result(args.out, results)
    spark.stop()


if __name__ == "__main__":
    main()
