"""The source's indexes and table settings reach a replica through Kafka (whole-version
mode): a source table with IVF_PQ, BTREE, BITMAP and INVERTED indexes, under appends,
updates and deletes, an index replaced and one dropped midway, config and metadata set.

Change records go out with the publisher class the Spark sink uses and each version's
BEGIN / END with the transaction writer's own encoding (no Spark: the test is about the
replicator); the END of a version whose definition changed carries the definition, which
the test writes from what it did to the source (the oracle). A version that only changed
the definition (an index commit) has no records: its END alone completes it. The replica
must then have the source's indexes by name, type and columns, use them in `explain_plan`,
answer filtered and full-text queries as the source does and vector queries with a top-10
overlap of at least 0.9, and keep its unindexed rows under max(1%, one batch).
"""

from __future__ import annotations

import time
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from lance_cdf.format.definitions import IndexDefinition, TableDefinition
from lance_cdf.replicate.index_keeper import unindexed_rows
from lance_cdf.replicate.replica import SOURCE_VERSION_PROPERTY
from lance_cdf.replicate.replicator import Replicator
from tests.support.oracle import table_state

pytestmark = pytest.mark.integration

PARTITIONS = 2
DIM = 32
BATCH = 400  # --max-batch-rows
CENTERS = np.random.default_rng(0).standard_normal((8, DIM)).astype(np.float32) * 2
WORDS = ["fox", "dog", "cat", "owl", "eel", "bee", "ant", "elk"]


def rows(lo: int, hi: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(lo, hi)
    text = [" ".join(rng.choice(WORDS, 4)) + f" n{i}" for i in ids]
    # clustered vectors (as embeddings are): an IVF index's partitions follow the clusters
    noise = 0.3 * rng.standard_normal((hi - lo, DIM)).astype(np.float32)
    vectors = CENTERS[ids % len(CENTERS)] + noise
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "cat": pa.array([f"c{i % 6}" for i in ids]),
            "text": pa.array(text),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.reshape(-1).astype(np.float32)), DIM
            ),
        }
    )


IVF = {"metric": "l2", "num_partitions": 4, "num_sub_vectors": 8}
IVF2 = {"metric": "l2", "num_partitions": 8, "num_sub_vectors": 8}


def build(ds: lance.LanceDataset, d: IndexDefinition) -> None:
    if d.index_type.startswith("IVF_"):
        ds.create_index(d.columns[0], d.index_type, name=d.name, replace=True, **d.parameters())
    else:
        ds.create_scalar_index(d.columns[0], d.index_type, name=d.name, **d.parameters())


class Source:
    """The source table, its topics, and what was published of it."""

    def __init__(self, root, kafka, registry, topic=None):
        self.uri = f"{root}/src.lance"
        self.kafka, self.registry = kafka, registry
        self.topic = topic or f"idx-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        made = admin.create_topics(
            [NewTopic(self.topic, PARTITIONS, 1), NewTopic(f"{self.topic}.transaction", 1, 1)]
        )
        for f in made.values():
            f.result(30)
        lance.write_dataset(rows(0, 1500, 1), self.uri, enable_stable_row_ids=True)
        self.published = 0
        self.indexes: dict[str, IndexDefinition] = {}
        self.definitions: dict[int, TableDefinition] = {}

    def ds(self) -> lance.LanceDataset:
        return lance.dataset(self.uri)

    def index(self, d: IndexDefinition | None, drop: str | None = None) -> None:
        """Create / replace (or drop) an index on the source; its END carries the new
        definition."""
        if drop is not None:
            self.ds().drop_index(drop)
            self.indexes.pop(drop)
        if d is not None:
            build(self.ds(), d)
            self.indexes[d.name] = d
        self.define()

    def define(self) -> None:
        ds = self.ds()
        self.definitions[ds.version] = TableDefinition.of(
            list(self.indexes.values()),
            {k: v for k, v in ds.config().items()},
            {k.decode(): v for k, v in (ds.schema.metadata or {}).items()},
            {
                f.name: {k.decode(): v for k, v in f.metadata.items()}
                for f in ds.schema
                if f.metadata
            },
        )

    def publish(self) -> None:
        import lance_cdf
        from lance_cdf.core.feed import ChangeFeed
        from lance_cdf.core.stream_columns import PARTITION_COLUMN
        from lance_cdf.kafka.publisher import KafkaChangePublisher, user_schema_of
        from lance_cdf.kafka.transactions import TransactionWriter, VersionCounts

        bs, reg = self.kafka.bootstrap_servers, self.registry.url
        start, end = self.published + 1, self.ds().version
        events = lance_cdf.read_changes(self.uri, start, end).read_all()
        rowids = events["_rowid"].to_numpy().astype(np.int64)
        events = events.append_column(
            PARTITION_COLUMN, pa.array((rowids % PARTITIONS).astype(np.int32))
        )
        feed = ChangeFeed(self.uri)
        ops = {v: feed.table.manifest(v).operation for v in range(start, end + 1)}
        pub = KafkaChangePublisher(bs, self.topic, reg, user_schema_of(events.schema), self.uri)
        pub.publish(events, ops)
        counts = {v: VersionCounts(v) for v in range(start, end + 1)}
        counts.update(pub.version_counts)
        writer = TransactionWriter(bs, f"{self.topic}.transaction", reg, self.uri)
        write_transactions(writer, [counts[v] for v in sorted(counts)], self.definitions)
        self.published = end


def write_transactions(writer, versions, definitions) -> None:
    """BEGIN and END of each version, an END carrying the definition set at its version
    (as the publisher attaches it: the test writes the records the way
    `TransactionWriter.write` does)."""
    from lance_cdf.kafka.transactions import transaction_value

    now = int(time.time() * 1000)
    for counts in versions:
        key = writer.key_writer.encode({"id": f"{writer.namespace}:{counts.version}"})
        for status in ("BEGIN", "END"):
            value = transaction_value(
                status, writer.namespace, counts, now, definitions.get(counts.version)
            )
            writer.producer.produce(
                writer.topic, key=key, value=writer.value_writer.encode(value), partition=0
            )
    assert writer.producer.flush(30) == 0


def replicate(source: Source, dst: str, **kw) -> None:
    rep = Replicator(
        source.kafka.bootstrap_servers,
        source.topic,
        source.registry.url,
        dst,
        group_id=f"g-{source.topic}",
        max_batch_interval=0.3,
        max_batch_rows=BATCH,
        **kw,
    )
    rep.run(idle_timeout=3)


def held(dst: str) -> int:
    from lance_cdf.replicate.replica import ReplicaTable

    return int(ReplicaTable(dst, ["_source_rowid"]).position()[SOURCE_VERSION_PROPERTY])


def described(ds: lance.LanceDataset) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {
        d.name: (d.type_url, tuple(d.field_names))
        for d in ds.describe_indices()
        if d.name != "_source_rowid_idx"
    }


def check_queries(src: lance.LanceDataset, dst: lance.LanceDataset) -> float:
    """Filtered and full-text answers equal; the vector top-10 overlap over 100 queries."""
    for flt in ("cat = 'c2'", "id BETWEEN 100 AND 180", "cat IN ('c1', 'c9') AND id < 900"):
        a = sorted(src.to_table(filter=flt, columns=["id"])["id"].to_pylist())
        b = sorted(dst.to_table(filter=flt, columns=["id"])["id"].to_pylist())
        assert a == b, flt
    plan = dst.scanner(filter="id BETWEEN 100 AND 180").explain_plan()
    assert "ScalarIndexQuery" in plan or "MaterializeIndex" in plan, plan
    for word in ("fox", "owl bee", "n1450"):
        q = {"full_text_query": word, "columns": ["id"]}
        a, b = src.to_table(**q), dst.to_table(**q)
        assert sorted(a["id"].to_pylist()) == sorted(b["id"].to_pylist()), word
    # the top 10 (BM25 scores themselves follow each index's history, e.g. deleted rows
    # it still counts, so only a ranking without ties is compared): rare tokens first
    q = {"full_text_query": "n1450 n5003 n7010 n120 n881 n5500 n64", "columns": ["id"], "limit": 10}
    assert sorted(src.to_table(**q)["id"].to_pylist()) == sorted(
        dst.to_table(**q)["id"].to_pylist()
    )
    plan = dst.scanner(full_text_query="fox").explain_plan()
    assert "MatchQuery" in plan, plan
    rng = np.random.default_rng(3)
    overlaps = []
    for _ in range(100):
        # (queries like the rows: near one of the clusters)
        q = (CENTERS[rng.integers(len(CENTERS))] + 0.3 * rng.standard_normal(DIM)).astype(
            np.float32
        )
        near = {"column": "vec", "q": q, "k": 10, "nprobes": 3, "refine_factor": 10}
        a = set(src.to_table(nearest=near, columns=["id"])["id"].to_pylist())
        b = set(dst.to_table(nearest=near, columns=["id"])["id"].to_pylist())
        overlaps.append(len(a & b) / 10)
    plan = dst.scanner(nearest={"column": "vec", "q": q, "k": 10}).explain_plan()
    assert "ANNSubIndex" in plan or "ANNIvfPartition" in plan, plan
    return float(np.mean(overlaps))


def test_the_replica_builds_keeps_replaces_and_drops_the_source_indexes(
    tmp_path, kafka_broker, schema_registry
):
    source = Source(str(tmp_path), kafka_broker, schema_registry)
    dst = str(tmp_path / "replica.lance")
    source.index(IndexDefinition.of("id_idx", "BTREE", ("id",), {}))
    source.index(IndexDefinition.of("cat_idx", "BITMAP", ("cat",), {}))
    source.index(IndexDefinition.of("text_idx", "INVERTED", ("text",), {"with_position": True}))
    source.index(IndexDefinition.of("vec_idx", "IVF_PQ", ("vec",), IVF))
    source.publish()
    replicate(source, dst)
    src, rep = source.ds(), lance.dataset(dst)
    assert held(dst) == src.version  # the index-only versions completed by their END
    assert described(rep) == described(src)
    assert table_state(source.uri, src.version).keys() == {
        r["_source_rowid"] for r in rep.to_table(columns=["_source_rowid"]).to_pylist()
    }

    # rows change; the vector index is replaced (new parameters), the BITMAP dropped, a
    # config key and schema / field metadata set
    ds = source.ds()
    ds = lance.write_dataset(rows(5000, 5900, 2), source.uri, mode="append")
    ds.update({"cat": "'c9'"}, where="id % 11 = 0")
    ds.delete("id % 13 = 0")
    ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
        rows(1400, 1700, 4)
    )
    source.index(IndexDefinition.of("vec_idx", "IVF_PQ", ("vec",), IVF2))
    source.index(None, drop="cat_idx")
    ds = source.ds()
    ds.update_config({"app.owner": "search"})
    ds.update_schema_metadata({"embedding_functions": "[]"})
    ds.update_field_metadata({"text": {"lancedb:source": "text"}})
    source.define()
    lance.write_dataset(rows(7000, 7100, 5), source.uri, mode="append")
    source.publish()
    replicate(source, dst)

    src, rep = source.ds(), lance.dataset(dst)
    assert held(dst) == src.version
    assert described(rep) == described(src)
    assert "cat_idx" not in described(rep)
    assert rep.stats.index_stats("vec_idx")["indices"][0]["num_partitions"] == 8
    assert rep.config()["app.owner"] == "search"
    assert rep.schema.metadata == {b"embedding_functions": b"[]"}
    assert rep.schema.field("text").metadata == {b"lancedb:source": b"text"}
    loose = unindexed_rows(rep, skip={"_source_rowid_idx"})
    bound = max(rep.count_rows() // 100, BATCH)
    assert all(n <= bound for n in loose.values()), loose
    overlap = check_queries(src, rep)
    assert overlap >= 0.9, overlap


def test_a_database_replicator_keeps_each_table_definition_and_its_own_indexes(
    tmp_path, kafka_broker, schema_registry
):
    from lance_cdf.replicate.database_replicator import replicate_database

    prefix = f"db-{uuid.uuid4().hex[:8]}"
    source = Source(str(tmp_path), kafka_broker, schema_registry, topic=f"{prefix}.t1")
    source.index(IndexDefinition.of("id_idx", "BTREE", ("id",), {}))
    source.index(IndexDefinition.of("text_idx", "INVERTED", ("text",), {"lower_case": True}))
    source.publish()
    dst = str(tmp_path / "replicas")
    own = IndexDefinition.of("own_cat", "BITMAP", ("cat",), {})
    replicate_database(
        kafka_broker.bootstrap_servers,
        prefix,
        schema_registry.url,
        dst,
        idle_timeout=3,
        group_id=f"g-{prefix}",
        max_batch_interval=0.3,
        replica_indexes=(own,),
    )
    rep = lance.dataset(f"{dst}/t1.lance")
    assert held(rep.uri) == source.ds().version
    got = described(rep)
    assert got.pop("own_cat") == ("/lance.table.BitmapIndexDetails", ("cat",))
    assert got == described(source.ds())
