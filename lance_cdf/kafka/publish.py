"""`lance-cdf publish`: run the lance-cdf stream into Kafka on a local Spark session."""

from __future__ import annotations

import os
import signal
import sys

from lance_cdf.errors import LanceCdfError
from lance_cdf.kafka.endpoints import check_broker, check_registry, check_topic

SECRET_HINTS = ("password", "secret", "token", "key.pem", "jaas")


def redact(config: dict[str, str]) -> dict[str, str]:
    """Producer settings safe to print: credentials are never shown."""
    return {
        k: ("***" if any(h in k.lower() for h in SECRET_HINTS) else v) for k, v in config.items()
    }


def publish(
    table: str,
    bootstrap_servers: str,
    topic: str,
    schema_registry: str,
    checkpoint: str,
    starting_version: str = "latest",
    trigger_interval: str = "1 second",
    available_now: bool = False,
    key: str | None = None,
    tombstones: bool = True,
    producer_config: dict[str, str] | None = None,
    registry_config: dict[str, str] | None = None,
    storage_options: dict[str, str] | None = None,
    max_rows_per_trigger: int | None = None,
    master: str | None = None,
    snapshot: bool = False,
    drop_unchanged_updates: bool = False,
    table_name: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> int:
    """Stream the table's changes to `topic` until stopped (or, with
    `available_now`, until the latest version at start is published).

    `snapshot`: first the table as it stands when the query first starts, as
    `op="r"` records, then the changes after it (the checkpoint remembers the
    snapshot's version and how far it got).
    `table_name`: `prefix.table` naming the Avro records (`prefix.table.Envelope`)
    and `source.name` / `source.table`; default `lancecdf.<table directory name>`.
    `master`: the Spark master URL; by default the one `spark-submit --master` gave,
    else `local[2]`. An active session (a spark-submit script's) is reused.
    `metrics_port`: serve Prometheus metrics on metrics_host:metrics_port (0: any free
    port; see lance_cdf.metrics)."""
    producer_config = dict(producer_config or {})
    check_broker(bootstrap_servers, producer_config)
    check_registry(schema_registry, registry_config)
    check_topic(bootstrap_servers, topic, producer_config)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from lance_cdf.kafka import sink as spark_sink
    from lance_cdf.streaming import register

    own_session = SparkSession.getActiveSession() is None
    builder = SparkSession.builder
    if master or (own_session and "PYSPARK_GATEWAY_PORT" not in os.environ):
        builder = builder.master(master or "local[2]")  # (spark-submit sets the gateway)
    if own_session:
        builder = builder.appName(f"lance-cdf publish {topic}").config("spark.ui.enabled", "false")
    spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark_sink.register(spark)
    reader = spark.readStream.format("lance-cdf").option("path", table)
    reader = reader.option("startingVersion", "snapshot" if snapshot else starting_version)
    if drop_unchanged_updates:
        reader = reader.option("dropUnchangedUpdates", "true")
    if max_rows_per_trigger:
        reader = reader.option("maxRowsPerTrigger", max_rows_per_trigger)
    for k, v in (storage_options or {}).items():
        reader = reader.option(f"storage.{k}", v)
    # One writer task per micro-batch: the versions of a micro-batch are produced in
    # commit order, which is what keeps each key's records in order in Kafka.
    writer = (
        reader.load().coalesce(1).writeStream.format("lance-cdf-kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers).option("topic", topic)
        .option("schema.registry.url", schema_registry).option("table", table)
        .option("tombstones", str(tombstones).lower()).option("checkpointLocation", checkpoint)
    )  # fmt: skip
    if key:
        writer = writer.option("key", key)
    if table_name:
        writer = writer.option("table.name", table_name)
    for k, v in producer_config.items():
        writer = writer.option(f"kafka.{k}", v)
    for k, v in (registry_config or {}).items():
        writer = writer.option(f"registry.{k}", v)
    for k, v in (storage_options or {}).items():
        writer = writer.option(f"storage.{k}", v)
    trigger = {"availableNow": True} if available_now else {"processingTime": trigger_interval}
    query = writer.trigger(**trigger).start()
    print(
        f"publishing {table} -> {topic} on {bootstrap_servers} (checkpoint {checkpoint}; "
        f"producer settings {redact(producer_config)})",
        flush=True,
    )
    follower = _serve_metrics(query, table, topic, storage_options, metrics_port, metrics_host)

    def stop(*_):
        query.stop()

    signal.signal(signal.SIGTERM, stop)
    error = None
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    except Exception as exc:  # the query failed: Spark raises StreamingQueryException
        error = exc
    error = error or query.exception()
    if follower is not None:
        follower.stop()
        if error is not None:
            follower.failed()
    if own_session:
        spark.stop()
    if error is not None:
        raise LanceCdfError(f"the publishing query failed: {error}") from None
    return 0


def _serve_metrics(query, table, topic, storage_options, port, host):
    """Follow the query's progress and serve it as Prometheus metrics (None: no port)."""
    if port is None:
        return None
    from lance_cdf.kafka.progress import QueryFollower
    from lance_cdf.metrics import PipelineMetrics

    follower = QueryFollower(query).start()
    metrics = PipelineMetrics("publish", follower.progress, table, storage_options, topic)
    print(f"metrics at {metrics.serve(port, host)}", flush=True)
    return follower
