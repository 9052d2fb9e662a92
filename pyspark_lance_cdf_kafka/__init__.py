"""PySpark finds the `format("lance-cdf-kafka")` sink here without a register call
(one `DefaultSource` per `pyspark_*` module: see `pyspark_lance_cdf`)."""

from lance_cdf.spark.sink.kafka_sink import LanceCdfKafkaSink as DefaultSource

__all__ = ["DefaultSource"]
