"""The floor under `lance-cdf publish`'s start-up: the same Spark machinery, none of lance-cdf.

    python bench/support/startup_floor.py BOOTSTRAP TOPIC CHECKPOINT

A local[2] session, a minimal Python streaming data source (one row, one offset) routed
through a repartition into a minimal Python streaming sink that produces the row to Kafka
with a plain confluent-kafka producer: the same Python processes Spark starts for
lance-cdf (data-source lookup, schema, streaming runner, read plan, reader and writer
workers, writer creation, commit), with nothing of lance-cdf in them. Run by
bench_startup, by its path, as its own process beside `lance-cdf publish` (it imports
nothing of the checkout).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)


class OneRowReader(DataSourceStreamReader):
    def initialOffset(self):  # noqa: N802 (Spark's names)
        return {"v": 0}

    def latestOffset(self):  # noqa: N802
        return {"v": 1}

    def partitions(self, start, end):
        return [InputPartition(0)] if end["v"] > start["v"] else []

    def read(self, partition):
        yield (1, "one")

    def commit(self, end):
        pass


class ProduceWriter(DataSourceStreamWriter):
    def __init__(self, options):
        self.options = options

    def write(self, iterator):
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.options["bootstrap"]})
        n = 0
        for row in iterator:
            producer.produce(self.options["topic"], key=str(row[0]), value=row[1])
            n += 1
        producer.flush(30)
        return WriterCommitMessage()

    def commit(self, messages, batchId):  # noqa: N803
        pass


class Floor(DataSource):
    @classmethod
    def name(cls):
        return "startup-floor"

    def schema(self):
        return "id long, s string"

    def streamReader(self, schema):  # noqa: N802
        return OneRowReader()

    def streamWriter(self, schema, overwrite):  # noqa: N802
        return ProduceWriter(dict(self.options))


def main() -> None:
    bootstrap, topic, checkpoint = sys.argv[1:4]
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(Floor)
    rows = spark.readStream.format("startup-floor").load().repartition(2, "id")
    q = (
        rows.writeStream.format("startup-floor")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
