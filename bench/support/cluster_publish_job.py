"""Driver script bench_cluster.py submits to a standalone cluster: stream a table's commits
(one per micro-batch) into the lance-cdf-kafka sink as `lance-cdf publish` does (one writer
slot per executor core, each task reading its own share: `publish.hand_off`), and write the
query's progress to a JSON file.

    spark-submit --master spark://... cluster_publish_job.py '<json arguments>'
"""

import json
import sys
import time

from pyspark.sql import SparkSession


def main(args: dict) -> None:
    spark = SparkSession.builder.appName("lance-cdf cluster bench").getOrCreate()
    sc = spark.sparkContext
    deadline = time.monotonic() + 120
    while sc._jsc.sc().getExecutorMemoryStatus().size() < args["executors"] + 1:  # + driver
        if time.monotonic() > deadline:
            raise SystemExit("executors did not register within 120 s")
        time.sleep(0.5)
    from lance_cdf.spark.publish.query_progress import planned_events
    from lance_cdf.spark.publish.runner import hand_off

    work = (
        spark.readStream.format("lance-cdf")
        .option("path", args["table"])
        .option("startingVersion", 1)
        .option("maxVersionsPerTrigger", 1)
        .option("keyHash", "_rowid")
        .option("writerSlots", args["executors"])
        .option("kafkaPartitions", args["partitions"])
        .load()
    )
    t0 = time.perf_counter()
    q = (
        hand_off(work)
        .writeStream.format("lance-cdf-kafka")
        .option("kafka.bootstrap.servers", args["bootstrap_servers"])
        .option("topic", args["topic"])
        .option("schema.registry.url", args["schema_registry"])
        .option("table", args["table"])
        .option("checkpointLocation", args["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception():
        raise SystemExit(str(q.exception()))
    batches = [
        (planned_events(p), p.durationMs["triggerExecution"] / 1000)
        for p in q.recentProgress
        if p.numInputRows
    ]
    with open(args["out"], "w") as f:
        json.dump({"s": time.perf_counter() - t0, "batches": batches}, f)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
