"""A table's definition (indexes, `update_config` keys, schema metadata) on the transaction
topic: `lance-cdf publish` sends each change once, on the END of the micro-batch's last
version (a BEGIN/END with no events where that version has no changes), never for an
index optimize; single table and `--database`, across a restart (with its head start); a
whole-version replicator goes through a version without events.
Decoded with TransactionDecoder; the oracle is what the test built."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from lance_cdf.cli import main
from lance_cdf.kafka.transactions import TransactionDecoder, TransactionRecord
from lance_cdf.replicate.replicator import Replicator
from tests.kafka.test_transactions import read_all
from tests.replicate.test_whole_versions import run_until_caught_up

pytestmark = pytest.mark.integration  # `lance-cdf publish` (Spark) in-process

DIM = 8


def rows(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi)
    rng = np.random.default_rng(lo)
    vec = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.random(len(ids) * DIM, dtype=np.float32)), DIM
    )
    return pa.table(
        {
            "id": ids,
            "cat": [f"c{i % 4}" for i in ids],
            "text": [f"word{i % 9} and more words {i}" for i in ids],
            "vec": vec,
        }
    )


def records(bootstrap: str, topic: str, registry: str) -> list[TransactionRecord]:
    decoder = TransactionDecoder(SchemaRegistryClient({"url": registry}))
    return [decoder.decode(m.value()) for m in read_all(bootstrap, topic)]


def definitions(txns: list[TransactionRecord]) -> dict[int, Any]:
    """version -> the definition its END carries; each version's BEGIN/END exactly once."""
    assert Counter((t.version, t.status) for t in txns) == Counter(
        {(t.version, s): 1 for t in txns for s in ("BEGIN", "END")}
    )
    return {t.version: t.definition for t in txns if t.definition is not None}


def indexes(d: Any) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {i.name: (i.index_type, i.columns) for i in d.indexes}


def publish(bootstrap: str, registry: str, checkpoint: Path, *target: str) -> None:
    args = [
        "publish",
        *target,
        "--bootstrap-servers",
        bootstrap,
        "--schema-registry",
        registry,
        "--checkpoint",
        str(checkpoint),
        "--starting-version",
        "1",
        "--available-now",
        "--master",
        "local[2]",
    ]
    assert main(args) == 0


def test_single_table_each_definition_change_once(tmp_path, kafka_broker, schema_registry):
    uri = str(tmp_path / "t.lance")
    ds = lance.write_dataset(rows(0, 1000), uri, enable_stable_row_ids=True)  # v1
    ds.create_scalar_index("id", "BTREE")  # v2
    ds.create_scalar_index("cat", "BITMAP")  # v3
    ds.create_scalar_index("text", "INVERTED", with_position=False)  # v4
    ds.create_index("vec", "IVF_PQ", num_partitions=2, num_sub_vectors=2)  # v5
    ds = lance.write_dataset(rows(1000, 1001), uri, mode="append")  # v6
    ds.create_index(  # v7
        "vec", "IVF_PQ", name="vec_idx", replace=True, num_partitions=3, num_sub_vectors=2
    )
    ds.update_config({"team": "search"})  # v8
    ds = lance.write_dataset(rows(1001, 1002), uri, mode="append")  # v9
    ds.drop_index("cat_idx")  # v10
    ds.delete("id = 0")  # v11
    ds.delete_config_keys(["team"])  # v12
    ds.replace_schema_metadata({"owner": "ml"})  # v13
    ds = lance.write_dataset(rows(1002, 1003), uri, mode="append")  # v14
    ds = lance.write_dataset(rows(1003, 1004), uri, mode="append")  # v15
    ds.optimize.optimize_indices()  # v16: new segments, same definition
    ds = lance.write_dataset(rows(1004, 1005), uri, mode="append")  # v17
    ds.update_config({"last": "1"})  # v18: the latest version, no changes
    assert lance.dataset(uri).version == 18
    topic = f"defs-{uuid.uuid4().hex[:8]}"
    bootstrap, registry = kafka_broker.bootstrap_servers, schema_registry.url
    # a micro-batch per version with changes (a version is never split; the versions
    # without changes go with the next one that has some): (0,1], (1,6], (6,9], ...
    target = ["--table", uri, "--topic", topic, "--max-rows-per-trigger", "1", "--no-head-start"]
    publish(bootstrap, registry, tmp_path / "ck", *target)
    txns = records(bootstrap, f"{topic}.transaction", registry)
    sent = definitions(txns)
    assert sorted(sent) == [6, 9, 11, 14, 18]
    assert indexes(sent[6]) == {
        "id_idx": ("BTREE", ("id",)),
        "cat_idx": ("BITMAP", ("cat",)),
        "text_idx": ("INVERTED", ("text",)),
        "vec_idx": ("IVF_PQ", ("vec",)),
    }
    assert sent[6].index("text_idx").parameters()["with_position"] is False
    assert sent[6].index("vec_idx").parameters()["num_partitions"] == 2
    assert sent[6].index("vec_idx").parameters()["num_sub_vectors"] == 2
    assert sent[6].config == ()
    assert sent[9].index("vec_idx").parameters()["num_partitions"] == 3
    assert dict(sent[9].config) == {"team": "search"}
    assert set(indexes(sent[11])) == {"id_idx", "text_idx", "vec_idx"}
    assert dict(sent[14].config) == {} and dict(sent[14].schema_metadata) == {"owner": b"ml"}
    assert dict(sent[18].config) == {"last": "1"}
    end = {t.version: t for t in txns if t.status == "END"}
    # version 18 has no changes: its BEGIN/END says so (routed, nothing in any partition)
    assert end[18].event_count == 0 and end[18].partitions == {}
    assert sorted(end) == [1, 6, 9, 11, 14, 15, 17, 18]  # no record for the optimize (16)

    # a restart with nothing new sends nothing; an optimize alone sends nothing either
    lance.dataset(uri).optimize.optimize_indices()  # v19
    lance.write_dataset(rows(1005, 1006), uri, mode="append")  # v20
    publish(bootstrap, registry, tmp_path / "ck", "--table", uri, "--topic", topic)
    again = records(bootstrap, f"{topic}.transaction", registry)
    assert definitions(again) == sent
    assert [t.version for t in again if t.status == "END"][-1] == 20
    # a whole-version replicator goes through the version without events (18) and on
    dst = str(tmp_path / "replica.lance")
    run_until_caught_up(Replicator(bootstrap, topic, registry, dst, group_id=topic), 20, dst)
    got = lance.dataset(dst).to_table(columns=["id"])["id"].to_pylist()
    assert sorted(got) == sorted(lance.dataset(uri).to_table(columns=["id"])["id"].to_pylist())


def test_database_definitions_per_table_across_a_restart(tmp_path, kafka_broker, schema_registry):
    root = str(tmp_path / "db")
    a = lance.write_dataset(rows(0, 200), f"{root}/a.lance", enable_stable_row_ids=True)  # v1
    a.create_scalar_index("id", "BTREE")  # v2
    b = lance.write_dataset(rows(0, 100), f"{root}/b.lance", enable_stable_row_ids=True)  # v1
    b.create_scalar_index("text", "INVERTED")  # v2
    b.update_config({"k": "v"})  # v3 (the latest: no changes)
    prefix = f"dbd{uuid.uuid4().hex[:6]}"
    bootstrap, registry = kafka_broker.bootstrap_servers, schema_registry.url
    target = ["--database", root, "--topic-prefix", prefix]
    publish(bootstrap, registry, tmp_path / "ck", *target)
    a_sent = definitions(records(bootstrap, f"{prefix}.a.transaction", registry))
    b_sent = definitions(records(bootstrap, f"{prefix}.b.transaction", registry))
    assert sorted(a_sent) == [2] and indexes(a_sent[2]) == {"id_idx": ("BTREE", ("id",))}
    assert sorted(b_sent) == [3] and indexes(b_sent[3]) == {"text_idx": ("INVERTED", ("text",))}
    assert dict(b_sent[3].config) == {"k": "v"}

    # after a restart (the head start publishes a's new rows): a's optimize sends nothing,
    # b's drop (an index commit, b's latest) is sent once on its own version
    lance.write_dataset(rows(200, 210), f"{root}/a.lance", mode="append")  # a v3
    lance.dataset(f"{root}/a.lance").optimize.optimize_indices()  # a v4
    lance.write_dataset(rows(210, 211), f"{root}/a.lance", mode="append")  # a v5
    lance.dataset(f"{root}/b.lance").drop_index("text_idx")  # b v4
    publish(bootstrap, registry, tmp_path / "ck", *target)
    a_txns = records(bootstrap, f"{prefix}.a.transaction", registry)
    b_txns = records(bootstrap, f"{prefix}.b.transaction", registry)
    assert definitions(a_txns) == a_sent
    assert [t.version for t in a_txns if t.status == "END"][-2:] == [3, 5]
    b_now = definitions(b_txns)
    assert sorted(b_now) == [3, 4] and b_now[4].indexes == ()
    assert dict(b_now[4].config) == {"k": "v"}
