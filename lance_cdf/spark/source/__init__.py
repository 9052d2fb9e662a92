"""Spark source for the change feed: `spark.readStream.format("lance-cdf")`.

PySpark >= 4.0 finds the source without a call (the `pyspark_lance_cdf` module);
`lance_cdf.spark.register(spark)` registers it explicitly, with the SQL table-valued
function `lance_table_changes(path, start [, end])` (`LanceTableChanges`)."""
