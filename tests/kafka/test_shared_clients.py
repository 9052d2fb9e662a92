"""One process, many tables: the publishers and transaction writers of a
database publisher's tables share the process's producer, consumer and registry client
(kafka/clients.py), and each still reads its own topic's last records."""

import uuid

import pyarrow as pa
from confluent_kafka.admin import AdminClient, NewTopic

from lance_cdf.kafka import clients
from lance_cdf.kafka.publisher import POSITION_HEADER, KafkaChangePublisher, PublisherSettings
from lance_cdf.kafka.transactions import TransactionWriter, VersionCounts

SCHEMA = pa.schema([("id", pa.int64())])


def test_publishers_with_the_same_settings_share_their_clients():
    a = KafkaChangePublisher("127.0.0.1:1", "a", "mock://shared", SCHEMA, "p.a")
    b = KafkaChangePublisher("127.0.0.1:1", "b", "mock://shared", SCHEMA, "p.b")
    other = KafkaChangePublisher(
        "127.0.0.1:1",
        "c",
        "mock://shared",
        SCHEMA,
        "p.c",
        settings=PublisherSettings(producer_config={"linger.ms": "5"}),
    )
    try:
        assert a.producer is b.producer and a._failures is b._failures
        assert a.registry is b.registry and a.marks.consumer() is b.marks.consumer()
        assert other.producer is not a.producer  # another setting, another producer
        assert a.key_writer.subject == "a-key" and b.value_writer.subject == "b-value"
    finally:
        clients.close_all(5)
    fresh = KafkaChangePublisher("127.0.0.1:1", "a", "mock://shared", SCHEMA, "p.a")
    assert fresh.producer is not a.producer  # close_all forgot them
    clients.close_all(5)


def test_tables_sharing_a_consumer_each_read_their_own_last_records(kafka_broker, schema_registry):
    """Alternating tables through one shared consumer: each table's high-water marks and
    transaction topic's last record are its own topic's, never what the consumer read of
    the other table just before (which would make a replay skip or repeat records)."""
    bs, reg = kafka_broker.bootstrap_servers, schema_registry.url
    run = uuid.uuid4().hex[:8]
    topics = {name: f"shared-{run}.{name}" for name in ("a", "b")}
    admin = AdminClient({"bootstrap.servers": bs})
    for f in admin.create_topics([NewTopic(t, 2, 1) for t in topics.values()]).values():
        f.result(30)
    pubs = {n: KafkaChangePublisher(bs, t, reg, SCHEMA, f"p.{n}") for n, t in topics.items()}
    writers = {
        n: TransactionWriter(bs, f"{t}.transaction", reg, f"p.{n}") for n, t in topics.items()
    }
    try:
        assert pubs["a"].producer is pubs["b"].producer
        assert pubs["a"].marks.consumer() is pubs["b"].marks.consumer()
        assert writers["a"].producer is writers["b"].producer

        def put(name: str, partition: int, position: str) -> None:
            pubs[name].producer.produce(
                topics[name],
                key=b"k",
                value=b"v",
                partition=partition,
                headers={POSITION_HEADER: position.encode()},
            )
            pubs[name].flush()

        put("a", 0, "5.2.1.0")
        put("b", 0, "7.2.3.1")
        put("b", 1, "7.1.4.0")
        assert pubs["a"].high_water_marks([0, 1]) == {0: (5, 2, 1, 0), 1: None}
        assert pubs["b"].high_water_marks([0, 1]) == {0: (7, 2, 3, 1), 1: (7, 1, 4, 0)}
        put("a", 0, "6.0.1.0")  # appended behind a's publisher: read again, a's own
        assert pubs["a"].high_water_marks([0]) == {0: (6, 0, 1, 0)}
        assert pubs["b"].high_water_marks([0]) == {0: (7, 2, 3, 1)}

        assert writers["a"].write([VersionCounts(3, {0: (1, 1)})]) == 2  # BEGIN, END
        assert writers["b"].write([VersionCounts(8, {0: (1, 1)}), VersionCounts(9, {})]) == 4
        last_a, last_b = writers["a"].last(), writers["b"].last()
        assert (last_a.version, last_a.status) == (3, "END")
        assert (last_b.version, last_b.status) == (9, "END")
        # a replayed micro-batch: each writer skips what its own topic holds
        assert writers["a"].write([VersionCounts(3, {0: (1, 1)})]) == 0
        assert writers["b"].write([VersionCounts(9, {})]) == 0
        assert writers["a"].write([VersionCounts(4, {0: (1, 1)})]) == 2
    finally:
        clients.close_all(10)
