"""A replica you can serve from: a LanceDB table with an IVF_PQ index on a 128-d vector, a
BTREE on `id`, a BITMAP on a category and an INVERTED index on text, published by
`lance-cdf publish` while appends, updates, deletes and merge_inserts go on, with its
vector index replaced midway and the BITMAP dropped, replicated by a whole-version
replicator. Oracles: the source table through LanceDB (its indexes, its query plans,
its answers to the same queries)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pytest

from lance_cdf.replicate.replicator import Replicator
from tests.replicate.test_whole_versions import new_topic, run_until_caught_up, status

lancedb = pytest.importorskip("lancedb")
pytestmark = pytest.mark.integration  # `lance-cdf publish` in a subprocess

STABLE = {"new_table_enable_stable_row_ids": "true"}
DIM = 128
CATS = ["red", "green", "blue", "gold"]
WORDS = [f"w{i}" for i in range(300)]
# (s) how long the publisher may take to bring the topic to the source's latest version
CATCH_UP_S = 300
BATCH_ROWS = 300  # the replicator's batches (so "one batch" bounds the unindexed rows)


def _rows(rng: np.random.Generator, ids: np.ndarray, tag: str) -> pa.Table:
    vec = rng.normal(size=(len(ids), DIM)).astype("float32")
    # word frequencies fall off (Zipf-like), so BM25 scores rarely tie
    words = rng.zipf(1.3, size=(len(ids), 6)) % len(WORDS)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "cat": [CATS[i % len(CATS)] for i in ids],
            "text": [" ".join(WORDS[w] for w in ws) + f" {tag}" for ws in words],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), DIM),
        }
    )


def _changes(t, rng: np.random.Generator, start: int, rounds: int) -> int:
    """Appends, updates, deletes and merge_inserts through LanceDB; the next free id."""
    nxt = start
    for r in range(rounds):
        t.add(_rows(rng, np.arange(nxt, nxt + 150), f"add{r}"))
        nxt += 150
        t.update(where=f"id % 37 = {r}", values={"cat": "gold"})
        t.delete(f"id % 41 = {r}")
        keys = np.concatenate([rng.integers(0, nxt, 60), np.arange(nxt, nxt + 40)])
        upsert = _rows(rng, np.unique(keys), f"merge{r}")
        t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(upsert)
        nxt += 40
    return nxt


def _indexes(table) -> set[tuple[str, str, tuple[str, ...]]]:
    return {
        (i.name, str(i.index_type), tuple(i.columns))
        for i in table.list_indices()
        if not i.name.startswith("_")  # the replicator's own key index, if any
    }


def _queries(t, rng: np.random.Generator, n: int):
    """The same queries against a table: vector top-10 (ids), filters."""
    out: dict[str, list] = {"vector": [], "filter": []}
    for q in rng.normal(size=(n, DIM)).astype("float32"):
        hits = t.search(q).nprobes(8).refine_factor(10).limit(10).select(["id"]).to_arrow()
        out["vector"].append(hits["id"].to_pylist())
    for where in ("id < 100", "id BETWEEN 500 AND 520", "cat = 'gold'"):
        rows = t.search().where(where).select(["id"]).limit(100_000).to_arrow()
        out["filter"].append(sorted(rows["id"].to_pylist()))
    return out


def _full_text(t) -> list[tuple[list[float], list[int]]]:
    """Full-text top-10 of 20 words: equal scores come in any order, so the scores, and
    the ids scored above the tenth."""
    out = []
    for w in WORDS[:20]:
        hits = t.search(w, query_type="fts").limit(10).select(["id", "_score"]).to_arrow()
        scores = [round(s, 4) for s in hits["_score"].to_pylist()]
        above = [i for i, s in zip(hits["id"].to_pylist(), scores, strict=True) if s > scores[-1]]
        out.append((scores, sorted(above)))
    return out


def _plans(t) -> dict[str, str]:
    q = np.zeros(DIM, dtype="float32")
    return {
        "vector": t.search(q).limit(10).explain_plan(True),
        "fts": t.search(WORDS[1], query_type="fts").limit(10).explain_plan(True),
        "btree": t.search().where("id = 7").explain_plan(True),
    }


@pytest.fixture
def publisher(tmp_path, kafka_broker, schema_registry):
    """Starts `lance-cdf publish` on a table; stopped with SIGTERM at the end."""
    procs = []

    def start(src: str, topic: str) -> subprocess.Popen:
        log = open(tmp_path / "publish.log", "w")
        args = [
            *(sys.executable, "-m", "lance_cdf.cli", "publish", "--table", src),
            *("--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic),
            *("--schema-registry", schema_registry.url, "--checkpoint", str(tmp_path / "ck")),
            *("--starting-version", "1", "--key", "id", "--master", "local[2]"),
            *("--trigger-interval", "1"),
        ]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=log, start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_a_replica_serves_the_same_queries_through_the_same_indexes(
    tmp_path, kafka_broker, schema_registry, publisher
):
    warnings.simplefilter("ignore", DeprecationWarning)
    rng = np.random.default_rng(49)
    src_root, dst_root = tmp_path / "src", tmp_path / "dst"
    db = lancedb.connect(str(src_root))
    t = db.create_table("items", _rows(rng, np.arange(2000), "seed"), storage_options=STABLE)
    t.create_index("vec", config=lancedb.index.IvfPq(distance_type="cosine", num_partitions=4))
    t.create_index("id", config=lancedb.index.BTree())
    t.create_index("cat", config=lancedb.index.Bitmap())
    t.create_index("text", config=lancedb.index.FTS(with_position=False))
    src, dst = str(src_root / "items.lance"), str(dst_root / "items.lance")
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap, "serving")
    proc = publisher(src, topic)

    def caught_up() -> None:
        t.add(_rows(rng, np.arange(10**6 + t.version, 10**6 + t.version + 1), "mark"))
        rep = Replicator(
            bootstrap,
            topic,
            schema_registry.url,
            dst,
            key=["id"],
            group_id=topic,
            max_batch_rows=BATCH_ROWS,
        )
        run_until_caught_up(rep, t.version, dst, within=CATCH_UP_S)
        assert proc.poll() is None, (tmp_path / "publish.log").read_text()[-3000:]

    nxt = _changes(t, rng, 2000, 3)
    caught_up()
    replica = lancedb.connect(str(dst_root)).open_table("items")
    assert _indexes(replica) == _indexes(t)
    # midway: the vector index replaced (other parameters), the BITMAP dropped
    t.create_index(
        "vec",
        config=lancedb.index.IvfPq(distance_type="cosine", num_partitions=8, num_sub_vectors=32),
        replace=True,
    )
    t.drop_index("cat_idx")
    _changes(t, rng, nxt, 3)
    caught_up()
    replica = lancedb.connect(str(dst_root)).open_table("items")
    assert _indexes(replica) == _indexes(t)
    assert "cat_idx" not in {i.name for i in replica.list_indices()}
    t.optimize()  # the source's indexes cover every row (the replicator's upkeep keeps its own)
    # the rows: equal
    want = t.to_arrow().select(["id", "cat", "text"]).sort_by("id")
    assert replica.to_arrow().select(["id", "cat", "text"]).sort_by("id").equals(want)
    # the plans of the same queries use the indexes on both
    for kind, plan in _plans(replica).items():
        src_plan = _plans(t)[kind]
        for used in ("ANNSubIndex", "MatchQuery", "ScalarIndexQuery"):
            assert (used in plan) == (used in src_plan), (kind, plan, src_plan)
    # the same answers
    got, exp = (
        _queries(replica, np.random.default_rng(7), 100),
        _queries(t, np.random.default_rng(7), 100),
    )
    overlap = np.mean(
        [len(set(a) & set(b)) / 10 for a, b in zip(got["vector"], exp["vector"], strict=True)]
    )
    assert overlap >= 0.9, overlap
    assert got["filter"] == exp["filter"]
    # unindexed rows on the replica stay under max(1%, one batch) after upkeep
    rows = replica.count_rows()
    for i in replica.list_indices():
        if not i.name.startswith("_"):
            stats = replica.index_stats(i.name)
            # (a batch is whole versions: up to BATCH_ROWS rows and the rest of a version)
            assert stats.num_unindexed_rows <= max(rows // 100, 2 * BATCH_ROWS), (i.name, stats)
    # full text: BM25 scores rows outside the index with other statistics (the source's
    # own answers change with its optimize), so compared with every row indexed on both
    replica.optimize()
    assert _full_text(replica) == _full_text(t)
    report, text = status(src, dst)  # each replica index with its unindexed rows
    assert {i["name"] for i in report["replica_indexes"]} == {n for n, _, _ in _indexes(t)}
    assert re.search(r"vec_idx \(\w+ on vec\): \d+ rows unindexed", text), text
