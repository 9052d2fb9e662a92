"""pytest plugin: one real Kafka broker (KRaft) and one real Apicurio schema registry
per test session (`lance_cdf.devtools`), stopped when the session ends.

Register with `pytest_plugins = ["kafka_services"]` (tests/ on sys.path) or
`-p tests.kafka_services`. The jars are provisioned on first use (Maven, cached)."""

import pytest

from lance_cdf.devtools import KafkaBroker, SchemaRegistry


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A started `KafkaBroker`: `.bootstrap_servers`, `.restart()` (same ports, same data)."""
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.close()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory):
    """A started `SchemaRegistry`: `.url` is the Confluent-compatible base URL."""
    registry = SchemaRegistry(tmp_path_factory.mktemp("registry"))
    registry.start()
    yield registry
    registry.close()
