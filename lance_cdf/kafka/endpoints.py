"""Reachability checks of the Kafka broker, topic and schema registry, shared by
`lance-cdf publish` and `lance-cdf replicate`: each fails fast with the address and the fix."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource
from confluent_kafka.schema_registry import SchemaRegistryClient

from lance_cdf.clientconfig import redact_url, scrub
from lance_cdf.errors import PublishError


def check_broker(
    bootstrap_servers: str, config: dict[str, Any] | None = None, timeout: float = 10
) -> None:
    """Fail within `timeout` seconds, naming the address, if no broker answers."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0, **(config or {})})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise PublishError(
            f"cannot reach a Kafka broker at {bootstrap_servers} within {timeout:.0f}s ({exc}); "
            "check --bootstrap-servers and that the broker is running."
        ) from None


def check_topic(bootstrap_servers: str, topic: str, config: dict[str, Any] | None = None) -> int:
    """The topic's partition count (for a topic the first produce creates: the broker's
    num.partitions); a clear error if it does not exist and will not be created."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0, **(config or {})})
    meta = admin.list_topics(topic=topic, timeout=10)
    found = meta.topics.get(topic)
    err = found.error if found is not None else None
    if err is None and found is not None:
        return len(found.partitions)
    if err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        broker = ConfigResource(ConfigResource.Type.BROKER, str(next(iter(meta.brokers))))
        try:
            configs = admin.describe_configs([broker])[broker].result(timeout=10)
            auto = configs.get("auto.create.topics.enable")
            if auto is not None and auto.value == "true":
                partitions = configs.get("num.partitions")
                # the first produce creates it
                return int(partitions.value) if partitions is not None else 1
        except KafkaException:
            pass  # not allowed to read broker configs: assume it does not auto-create
        raise PublishError(
            f"topic {topic!r} does not exist on {bootstrap_servers} and the broker does not "
            "create topics automatically; create it (kafka-topics --create) or enable "
            "auto.create.topics.enable."
        )
    raise PublishError(f"topic {topic!r} on {bootstrap_servers} cannot be used: {err}")


def check_registry(url: str, config: dict[str, Any] | None = None) -> None:
    try:
        SchemaRegistryClient({"url": url, **(config or {})}).get_subjects()
    except Exception as exc:  # the client raises several types: all end here, named
        raise PublishError(  # neither the URL's user-info nor a secret the client repeats
            f"cannot reach the schema registry at {redact_url(url)} "
            f"({type(exc).__name__}: {scrub(str(exc))}); check "
            "--schema-registry (for Apicurio: http://HOST:PORT/apis/ccompat/v7)."
        ) from None
