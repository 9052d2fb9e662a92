"""Spark source for the change feed: `spark.readStream.format("lance-cdf")`."""

from __future__ import annotations


def register(spark) -> None:
    """Make `format("lance-cdf")` available in this Spark session."""
    from lance_cdf.streaming.source import LanceCdfDataSource

    spark.dataSource.register(LanceCdfDataSource)


__all__ = ["register"]
