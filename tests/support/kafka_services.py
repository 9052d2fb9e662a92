"""pytest plugin: one real Kafka broker (KRaft) and one real Apicurio schema registry
per test session (`lance_cdf_devtools`), stopped when the session ends; and, for the
tests that ask, a SASL_SSL broker and a registry behind HTTPS + basic auth, and a
three-broker replicated cluster (one per module that asks).

Register with `pytest_plugins = ["tests.support.kafka_services"]` or
`-p tests.support.kafka_services`. The jars are provisioned on first use (Maven, cached)."""

import pytest

from lance_cdf_devtools import (
    KafkaBroker,
    KafkaCluster,
    SchemaRegistry,
    SecureKafkaBroker,
    SecureSchemaRegistry,
)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A started `KafkaBroker`: `.bootstrap_servers`, `.restart()` (same ports, same data)."""
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.close()


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory):
    """A started `KafkaCluster` for the module that asks: three KRaft nodes, replication
    factor 3, `min.insync.replicas=2`; `.kill(node)`, `.restart(node)`, `.leader(...)`."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"))
    cluster.start()
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory):
    """A started `SchemaRegistry`: `.url` is the Confluent-compatible base URL."""
    registry = SchemaRegistry(tmp_path_factory.mktemp("registry"))
    registry.start()
    yield registry
    registry.close()


@pytest.fixture(scope="session")
def secure_kafka_broker(tmp_path_factory):
    """A started `SecureKafkaBroker`: its only client listener is SASL_SSL (SCRAM-SHA-512,
    a CA made for this run); `.client_config` holds what a librdkafka client needs."""
    broker = SecureKafkaBroker(tmp_path_factory.mktemp("kafka-sasl"))
    broker.start()
    yield broker
    broker.close()


@pytest.fixture(scope="session")
def secure_schema_registry(tmp_path_factory):
    """A started `SecureSchemaRegistry`: Apicurio behind HTTPS + basic auth; `.url`,
    `.client_config` (basic.auth.user.info, ssl.ca.location)."""
    registry = SecureSchemaRegistry(tmp_path_factory.mktemp("registry-tls"))
    registry.start()
    yield registry
    registry.close()
