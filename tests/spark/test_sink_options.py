"""The `lance-cdf-kafka` sink's options: parsed once, written back as Spark options, refused
by name when unknown or bad."""

from __future__ import annotations

import random

import pytest

from lance_cdf.errors import LanceCdfError
from lance_cdf.kafka.topic_settings import TopicSettings
from lance_cdf.spark.sink.sink_options import SinkOptions

pytestmark = pytest.mark.unit

BASE = {
    "kafka.bootstrap.servers": "b:9092",
    "schema.registry.url": "http://r",
    "topic": "t",
    "table": "/data/t.lance",
}


def _random(rng: random.Random) -> SinkOptions:
    word = lambda: "".join(rng.choice("abcXYZ._-") for _ in range(rng.randint(1, 8)))  # noqa: E731
    database = rng.random() < 0.5
    maybe = lambda: word() if rng.random() < 0.5 else None  # noqa: E731
    pairs = lambda: tuple(sorted({word(): word() for _ in range(rng.randint(0, 3))}.items()))  # noqa: E731
    return SinkOptions(
        bootstrap_servers=word(),
        registry_url=word(),
        table=None if database else word(),
        topic=None if database else word(),
        table_name=None if database else maybe(),
        database=word() if database else None,
        topic_prefix=word() if database else None,
        key=tuple(sorted({word() for _ in range(rng.randint(0, 2))} - {"_rowid"})),
        tombstones=rng.random() < 0.5,
        exactly_once=rng.random() < 0.5,
        transaction_metadata=rng.random() < 0.5,
        table_definitions=rng.random() < 0.5,
        transaction_topic=maybe(),
        topics=TopicSettings.of(
            rng.choice([None, 1, 6]),
            rng.choice([None, 3]),
            {f"k{i}.x": word() for i in range(rng.randint(0, 2))},
        ),
        flush_timeout_s=rng.choice([60.0, 2.5, 0.1]),
        ride_out_s=rng.choice([300.0, 2.5, 900.0]),
        checkpoint=maybe(),
        hand_over=maybe(),
        producer=tuple(kv for kv in pairs() if kv[0] != "bootstrap.servers"),
        registry=pairs(),
        storage=pairs(),
    )


def test_options_read_back_as_they_were_written():
    rng = random.Random(7)
    for _ in range(300):
        options = _random(rng)
        spark = options.to_options()
        assert SinkOptions.parse(spark) == options
        # Spark's option names are case-insensitive
        shouted = {
            k.upper() if not k.startswith(("kafka.", "registry.", "storage.")) else k: v
            for k, v in spark.items()
        }
        assert SinkOptions.parse(shouted) == options


def test_client_settings_keep_their_case_and_leave_the_bootstrap_servers_out():
    parsed = SinkOptions.parse(
        {**BASE, "KAFKA.sasl.Mechanism": "PLAIN", "registry.Basic.Auth": "x", "key": "_rowid"}
    )
    assert parsed.producer_config == {"sasl.Mechanism": "PLAIN"}
    assert parsed.registry_config == {"Basic.Auth": "x"}
    assert parsed.key == ()  # keyed by `_rowid`
    assert SinkOptions.parse({**BASE, "key": " id , region "}).key == ("id", "region")


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"tombstones": "yes"}, "tombstones"),
        ({"exactlyOnce": "1"}, "exactlyOnce"),
        ({"transactionMetadata": "off"}, "transactionMetadata"),
        ({"flushTimeout": "soon"}, "flushTimeout"),
        ({"flushTimeout": "0"}, "flushTimeout"),
        ({"rideOut": "-5"}, "rideOut"),
        ({"topic.partitions": "0"}, "topic.partitions"),
        ({"tombstone": "false"}, "tombstone"),  # a misspelt option
        ({"topic": ""}, "topic"),
    ],
)
def test_a_bad_or_unknown_option_is_refused_by_name(given, named):
    with pytest.raises(LanceCdfError, match=named):
        SinkOptions.parse({**BASE, **given})


def test_each_kind_of_sink_needs_its_own_options():
    for missing in BASE:
        with pytest.raises(LanceCdfError, match=missing):
            SinkOptions.parse({k: v for k, v in BASE.items() if k != missing})
    database = {k: v for k, v in BASE.items() if k not in ("topic", "table")}
    with pytest.raises(LanceCdfError, match="topic.prefix"):
        SinkOptions.parse({**database, "database": "/db"})
    parsed = SinkOptions.parse({**database, "database": "/db", "topic.prefix": "cdf"})
    one = parsed.for_table("/db/sales.orders.lance", "sales.orders")
    assert (one.topic, one.table, one.database) == ("cdf.sales.orders", one.table, "/db")
