"""The `lance-cdf-kafka` Spark sink: its driver-side writer and commit (kafka_sink), the
work items its writer tasks read their events with (work), one topic per table of a
database (database_sink), and the warm worker daemon the writer tasks fork from
(warm_daemon)."""
