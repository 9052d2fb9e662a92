"""Driver script that test_cluster submits to a standalone cluster with
`spark-submit --py-files lance_cdf.zip`. It records where executors found lance_cdf
and which executor read which slice, then publishes the table's changes to Kafka
with `lance_cdf.spark.publish.runner.publish` (the code path of `lance-cdf publish`).

    spark-submit ... cluster_job.py '<json arguments>'
"""

import json
import os
import sys
import time

from pyspark.sql import SparkSession


def where_python_runs(_):
    """On an executor: its working directory (one per executor) and lance_cdf's origin."""
    import lance_cdf

    return os.getcwd(), os.path.abspath(lance_cdf.__file__)


def count_slice(rows):
    yield os.getcwd(), sum(1 for _ in rows)


def main(args: dict) -> None:
    spark = SparkSession.builder.appName("lance-cdf cluster test").getOrCreate()
    sc = spark.sparkContext
    deadline = time.monotonic() + 120
    # getExecutorMemoryStatus lists the driver too
    while sc._jsc.sc().getExecutorMemoryStatus().size() < args["executors"] + 1:
        if time.monotonic() > deadline:
            raise SystemExit("executors did not register within 120 s")
        time.sleep(0.5)
    import lance_cdf.spark

    lance_cdf.spark.register(spark)
    found = sc.parallelize(range(8), 8).map(where_python_runs).distinct().collect()

    reader = spark.read.format("lance-cdf").option("path", args["table"])
    reader = reader.option("startingVersion", 1).option("rowsPerPartition", args["slice_rows"])
    for k, v in args["storage_options"].items():
        reader = reader.option(f"storage.{k}", v)
    changes = reader.load()
    partitions = changes.rdd.getNumPartitions()
    slices = changes.rdd.mapPartitions(count_slice).collect()

    from lance_cdf.spark.publish.runner import publish
    from lance_cdf.spark.publish.settings import (
        KafkaTarget,
        PublishSettings,
        RunSettings,
        SourceSettings,
    )

    code = publish(
        PublishSettings(
            SourceSettings(
                args["table"], starting_version="1", storage_options=args["storage_options"]
            ),
            KafkaTarget(args["bootstrap_servers"], args["topic"], args["schema_registry"]),
            RunSettings(args["checkpoint"], available_now=True),
        )
    )
    with open(args["out"], "w") as f:
        json.dump(
            {
                "master": sc.master,
                "driver_lance_cdf": lance_cdf.__file__,
                "executors": found,
                "partitions": partitions,
                "slices": slices,
                "publish": code,
            },
            f,
        )
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
