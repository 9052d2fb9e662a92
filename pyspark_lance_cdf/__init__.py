"""PySpark finds `format("lance-cdf")` here without a register call.

PySpark (>= 4.0, SPARK-45917) imports every top-level module whose name starts
with `pyspark_` on the first data-source lookup of a Spark application and
registers its `DefaultSource` (one per module) under `DefaultSource.name()`.
The lookup runs in a Python worker started with the driver's `PYSPARK_PYTHON`:
lance-cdf must be installed in that interpreter (or on its PYTHONPATH).
"""

from lance_cdf.spark.source.data_source import LanceCdfDataSource as DefaultSource

__all__ = ["DefaultSource"]
