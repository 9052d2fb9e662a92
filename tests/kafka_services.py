"""Session-wide real Kafka broker (KRaft) and Apicurio schema registry."""

import pytest

from lance_cdf.devtools import KafkaBroker, SchemaRegistry


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    broker = KafkaBroker(str(tmp_path_factory.mktemp("kafka")))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory):
    registry = SchemaRegistry(str(tmp_path_factory.mktemp("registry")))
    registry.start()
    yield registry
    registry.stop()
