import os, sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[2]").getOrCreate()

changes = (
    spark.readStream.format("lance-cdf")
    .option("path", "/tmp/events.lance")
    .option("startingVersion", 1)  # or "latest" (default) / "earliest"
    .option("maxRowsPerTrigger", 500000)
    .load()
)
query = (
    changes.writeStream.format("parquet")
    .option("path", "/tmp/events-changes")
    .option("checkpointLocation", "/tmp/events-ck")
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()

batch = (
    spark.read.format("lance-cdf")
    .option("path", "/tmp/events.lance")
    .option("startingVersion", 1)
    .option("endingVersion", 3)
    .load()
)
batch.show()
