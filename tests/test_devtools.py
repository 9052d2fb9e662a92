"""The local broker and registry are real: Avro through the registry, and a restart keeps data."""

import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

SCHEMA = '{"type": "record", "name": "Probe", "fields": [{"name": "a", "type": "long"}]}'


def consume_one(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest"})  # fmt: skip
    c.subscribe([topic])
    try:
        for _ in range(60):
            m = c.poll(1)
            if m is not None and not m.error():
                return m
    finally:
        c.close()
    raise AssertionError(f"nothing arrived on {topic}")


def test_avro_round_trip_through_the_registry(kafka_broker, schema_registry):
    topic = f"probe-{uuid.uuid4().hex[:8]}"
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    p.produce(topic, value=AvroSerializer(client, SCHEMA)({"a": 42}, ctx))
    assert p.flush(30) == 0
    msg = consume_one(kafka_broker.bootstrap_servers, topic)
    assert msg.value()[0] == 0  # Confluent wire format: magic byte, then the schema id
    schema_id = int.from_bytes(msg.value()[1:5], "big")
    assert client.get_schema(schema_id).schema_str
    assert f"{topic}-value" in client.get_subjects()
    assert AvroDeserializer(client)(msg.value(), ctx) == {"a": 42}


def test_broker_restart_keeps_the_data(kafka_broker):
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    p.produce(topic, value=b"before")
    assert p.flush(30) == 0
    kafka_broker.restart()
    assert consume_one(kafka_broker.bootstrap_servers, topic).value() == b"before"
