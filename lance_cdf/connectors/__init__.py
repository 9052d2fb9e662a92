"""Connectors: change events to Avro and Kafka (and, later, to a replica)."""
