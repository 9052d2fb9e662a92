"""Avro for change events: the Arrow ↔ Avro schema mapping and Debezium-style envelope
(schema.py), vectorised encoding (encode.py) and decoding (decode.py), and the Confluent
wire format (wire.py). Knows nothing of Kafka clients, Spark or Lance manifests."""
