import os
from collections import Counter

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

topic = os.environ.get("TOPIC", "events.cdf")
transactions = f"{topic}.transaction"
registry = SchemaRegistryClient(
    {"url": os.environ.get("REGISTRY", "http://127.0.0.1:8081/apis/ccompat/v7")}
)
decode = AvroDeserializer(registry)
consumer = Consumer({
    "bootstrap.servers": os.environ.get("BOOTSTRAP", "127.0.0.1:9092"),
    "group.id": os.environ.get("GROUP", "whole-commits"), "auto.offset.reset": "earliest",
})
consumer.subscribe([topic, transactions])
events: Counter[int] = Counter()  # commit version -> events read
expected: dict[int, int] = {}  # commit version -> its END's event_count
idle = 0
while idle < 20:  # 10 s without a record
    m = consumer.poll(0.5)
    if m is None or m.error():
        idle += 1
        continue
    idle = 0
    if m.value() is None:
        continue  # a tombstone: not an event
    value = decode(m.value(), SerializationContext(m.topic(), MessageField.VALUE))
    if m.topic() == transactions:
        if value["status"] == "END":
            expected[int(value["id"].rsplit(":", 1)[1])] = value["event_count"]
    else:
        events[value["source"]["commit_version"]] += 1
    for version in sorted(v for v, n in expected.items() if events[v] == n):
        print(f"version {version} complete: {expected.pop(version)} events", flush=True)
consumer.close()
