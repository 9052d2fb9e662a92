"""Local infrastructure for tests and the demo: a single-node Apache Kafka broker
(KRaft) and an Apicurio schema registry (Confluent-compatible API), both run
from jars resolved from Maven Central into `.cache/devtools/`."""

from lance_cdf.devtools.provision import provision
from lance_cdf.devtools.services import KafkaBroker, SchemaRegistry

__all__ = ["KafkaBroker", "SchemaRegistry", "provision"]
