"""Topics made on purpose, whatever the broker's defaults.

On brokers with topic auto-creation on and off and `num.partitions` 1 and 3: lance-cdf's
clients never make the broker create a topic by asking for its metadata; a missing change
topic is created with the partitions, replication factor and settings asked for (the
broker's defaults otherwise), a missing transaction topic with one partition; an existing
change topic is used with its own partition count and an existing transaction topic with
more than one partition is refused in one line. Then `publish` end to end, one table and
a database, on the brokers that made it fail before (auto-create on, 3 partitions) and on
one that creates nothing: every change once, per key in commit order (read_changes is the
oracle), each version's BEGIN/END counting the topic's records."""

import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from lance_cdf.cli import main
from lance_cdf.errors import PublishError, TransactionMetadataError
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.kafka.topics import ensure_topic
from lance_cdf.ops.clientconfig import KafkaConnection
from lance_cdf_devtools import KafkaBroker
from tests.kafka.test_kafka_order import consume_by_key, expected_by_key, make_table
from tests.kafka.test_transactions import change_counts, check_transactions, transactions
from tests.spark.test_database_publish import by_key

pytestmark = pytest.mark.integration  # brokers of their own; publish (Spark) in-process

DEFAULTS = [(True, 1), (True, 3), (False, 1), (False, 3)]  # (auto-create, num.partitions)


@pytest.fixture(scope="module")
def brokers(tmp_path_factory, kafka_broker):
    """A started broker per (auto-create, num.partitions), started on first use; the
    session's broker is the lab's (auto-create on, one partition)."""
    started = {(True, 1): kafka_broker}
    own = []

    def get(auto, partitions):
        if (auto, partitions) not in started:
            broker = KafkaBroker(
                tmp_path_factory.mktemp("kafka-defaults"),
                auto_create_topics=auto,
                num_partitions=partitions,
            )
            broker.start()
            own.append(broker)
            started[(auto, partitions)] = broker
        return started[(auto, partitions)]

    yield get
    for broker in own:
        broker.close()


def topics_of(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})
    return {t for t in admin.list_topics(timeout=10).topics if not t.startswith("__")}


def partitions_of(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})
    return len(admin.list_topics(topic=topic, timeout=10).topics[topic].partitions)


def topic_config(bootstrap, topic, key):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(30)[key].value


@pytest.mark.parametrize("auto,default", DEFAULTS, ids=lambda v: str(v).lower())
def test_topics_are_created_on_purpose(brokers, auto, default):
    broker = brokers(auto, default)
    bootstrap = broker.bootstrap_servers
    connection = KafkaConnection(bootstrap)
    run = uuid.uuid4().hex[:8]
    before = topics_of(bootstrap)

    # the clients lance-cdf makes ask for a missing topic's metadata and create nothing
    missing = f"missing-{run}"
    for make in (Producer, Consumer, AdminClient):
        role = {Producer: "producer", Consumer: "consumer", AdminClient: "admin"}[make]
        extra = {"group.id": run} if make is Consumer else {}
        client = make(connection.config(role, fixed=extra))
        found = client.list_topics(topic=missing, timeout=10).topics[missing]
        assert found.error is not None and not found.partitions, role
    producer = Producer(connection.producer())
    producer.produce(missing, b"x")
    producer.flush(3)  # (unknown topic: not delivered, not created)

    # a change topic: the broker's partition count, or the one asked for, with its settings
    assert ensure_topic(connection, f"plain-{run}", TopicSettings()) == default
    asked = TopicSettings.of(2, 1, {"retention.ms": "3600000", "cleanup.policy": "compact"})
    assert ensure_topic(connection, f"asked-{run}", asked) == 2
    assert topic_config(bootstrap, f"asked-{run}", "retention.ms") == "3600000"
    # its transaction topic: one partition, the settings but cleanup.policy
    txn = asked.for_transactions()
    assert ensure_topic(connection, f"asked-{run}.transaction", txn, one_partition=True) == 1
    assert topic_config(bootstrap, f"asked-{run}.transaction", "retention.ms") == "3600000"
    assert topic_config(bootstrap, f"asked-{run}.transaction", "cleanup.policy") == "delete"

    # existing topics: a change topic's own count; a transaction topic of 2 refused
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name in (f"theirs-{run}", f"theirs-{run}.transaction"):
        admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    assert ensure_topic(connection, f"theirs-{run}", TopicSettings.of(5)) == 2
    with pytest.raises(TransactionMetadataError, match="has 2 partitions; it needs exactly one"):
        ensure_topic(connection, f"theirs-{run}.transaction", TopicSettings(), one_partition=True)
    # a replication factor the cluster cannot give: one line naming the flag
    with pytest.raises(PublishError, match="--replication-factor"):
        ensure_topic(connection, f"wide-{run}", TopicSettings.of(1, 3))

    made = {
        f"plain-{run}",
        f"asked-{run}",
        f"asked-{run}.transaction",
        f"theirs-{run}",
        f"theirs-{run}.transaction",
    }
    assert topics_of(bootstrap) - before == made  # (`missing` among them on no broker)


@pytest.mark.parametrize(
    "auto,default,flags",
    [
        (True, 3, []),  # the broker's count, where its metadata request used to create both
        (
            False,
            1,
            [
                "--partitions",
                "2",
                "--replication-factor",
                "1",
                "--topic-config",
                "retention.ms=7200000",
            ],
        ),
    ],
    ids=["auto-3", "strict-1-asked"],
)
def test_publish_a_table_whatever_the_brokers_defaults(
    brokers, schema_registry, tmp_path, auto, default, flags
):
    bootstrap = brokers(auto, default).bootstrap_servers
    uri = make_table(str(tmp_path / "t.lance"), seed=46)
    topic = f"defaults-{uuid.uuid4().hex[:8]}"
    assert (
        main(
            [
                "publish",
                "--table",
                uri,
                "--topic",
                topic,
                "--bootstrap-servers",
                bootstrap,
                "--schema-registry",
                schema_registry.url,
                "--checkpoint",
                str(tmp_path / "ck"),
                "--starting-version",
                "1",
                "--key",
                "id",
                "--table-name",
                "shop.items",
                "--available-now",
                *flags,
            ]
        )
        == 0
    )
    partitions = 2 if flags else default
    assert partitions_of(bootstrap, topic) == partitions
    assert partitions_of(bootstrap, f"{topic}.transaction") == 1
    if flags:
        assert topic_config(bootstrap, topic, "retention.ms") == "7200000"
    want = expected_by_key(uri)
    got, partition_of = consume_by_key(
        bootstrap, topic, schema_registry.url, sum(len(v) for v in want.values())
    )
    assert got == want
    assert len(set(partition_of.values())) > 1  # the keys spread over the partitions
    counts = change_counts(bootstrap, topic)
    check_transactions(
        transactions(bootstrap, f"{topic}.transaction", schema_registry.url), counts, "shop.items"
    )


@pytest.mark.parametrize("auto,default", [(True, 3), (False, 3)], ids=["auto-3", "strict-3"])
def test_publish_a_database_gives_each_table_a_partition_per_writer(
    brokers, schema_registry, tmp_path, auto, default
):
    lancedb = pytest.importorskip("lancedb")
    bootstrap = brokers(auto, default).bootstrap_servers
    root = str(tmp_path / "db")
    db = lancedb.connect(root)
    stable = {"new_table_enable_stable_row_ids": "true"}
    paths = {}
    for name in ("items", "orders"):
        table = db.create_table(
            name, pa.table({"id": np.arange(30), "s": ["a"] * 30}), storage_options=stable
        )
        paths[name] = table.uri.removeprefix("file://")
        lance.dataset(paths[name]).update({"s": "'u'"}, where="id % 4 = 0")
        lance.dataset(paths[name]).delete("id % 5 = 0")
    prefix = f"dbd{uuid.uuid4().hex[:6]}"
    assert (
        main(
            [
                "publish",
                "--database",
                root,
                "--topic-prefix",
                prefix,
                "--bootstrap-servers",
                bootstrap,
                "--schema-registry",
                schema_registry.url,
                "--checkpoint",
                str(tmp_path / "ck"),
                "--starting-version",
                "1",
                "--key",
                "id",
                "--writers",
                "2",
                "--available-now",
            ]
        )
        == 0
    )
    for name, path in paths.items():
        topic = f"{prefix}.{name}"
        assert partitions_of(bootstrap, topic) == 2, name  # one per writer
        assert partitions_of(bootstrap, f"{topic}.transaction") == 1, name
        assert by_key(bootstrap, topic, schema_registry.url) == expected_by_key(path), name
        txns = transactions(bootstrap, f"{topic}.transaction", schema_registry.url)
        check_transactions(txns, change_counts(bootstrap, topic), topic)
