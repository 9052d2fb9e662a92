"""Everything that runs inside Spark: the `lance-cdf` data source (source/), the
`lance-cdf-kafka` sink and its writer tasks (sink/), and the Spark job that `lance-cdf
publish` runs (publish/).

The public names, for a Spark job of your own:

- `register(spark)`: the source, its SQL function `lance_table_changes` and the Kafka
  sink, in this session (PySpark >= 4.0 finds the source and the sink without it);
- `lag(query)`: versions a `format("lance-cdf")` query is behind its table;
- `hand_off(work)` / `route(changes, partitions, tasks)`: a stream made ready for the
  Kafka sink, as `lance-cdf publish` does it, or after a transformation of your own;
- `LanceCdfDataSource`, `LanceCdfKafkaSink`: the data source classes.

Each loads its part on first use (a process that imports one part of the package does
not pay for the others).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded lazily by __getattr__; named here for type checkers
    from lance_cdf.spark.publish.runner import hand_off, register, route
    from lance_cdf.spark.sink.kafka_sink import LanceCdfKafkaSink
    from lance_cdf.spark.source.data_source import LanceCdfDataSource
    from lance_cdf.spark.source.stream_lag import lag

__all__ = ["LanceCdfDataSource", "LanceCdfKafkaSink", "hand_off", "lag", "register", "route"]

# public name -> the module that defines it
_LAZY = {
    "LanceCdfDataSource": "lance_cdf.spark.source.data_source",
    "LanceCdfKafkaSink": "lance_cdf.spark.sink.kafka_sink",
    "hand_off": "lance_cdf.spark.publish.runner",
    "register": "lance_cdf.spark.publish.runner",
    "route": "lance_cdf.spark.publish.runner",
    "lag": "lance_cdf.spark.source.stream_lag",
}


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lance_cdf.spark' has no attribute {name!r}")
