"""Spark source for the change feed: `spark.readStream.format("lance-cdf")`.

PySpark >= 4.0 finds the source without a call (the `pyspark_lance_cdf` module);
`register(spark)` registers it explicitly and adds the SQL table-valued function
`lance_table_changes(path, start [, end])`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


def register(spark: SparkSession) -> None:
    """Make `format("lance-cdf")` and `lance_table_changes` available in this session."""
    from lance_cdf.spark.source import table_changes
    from lance_cdf.spark.source.data_source import LanceCdfDataSource

    spark.dataSource.register(LanceCdfDataSource)
    table_changes.register(spark)


def lag(query: StreamingQuery) -> int | None:
    """Versions the table is ahead of what a `format("lance-cdf")` StreamingQuery
    delivered, from its last progress report (None before the first one)."""
    from lance_cdf.spark.source.stream_lag import lag as _lag

    return _lag(query)


__all__ = ["lag", "register"]
