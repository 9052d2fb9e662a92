"""Avro for change events: the Arrow ↔ Avro schema mapping and Debezium-style envelope
(`schema`), vectorised encoding (`encode`) and decoding (`decode`), and the Confluent
wire format (`wire`). Knows nothing of Kafka clients, Spark or Lance manifests."""
