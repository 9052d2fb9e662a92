"""A replica to serve from under a stream of small commits: query latency replica / source
sampled every minute while both change (replicate/replica_shape.py keeps the replica's
index segments and fragments bounded).

A LanceDB table of `--rows` rows (a 128-d vector, an id, a category, a text, a list of
tags) with IVF_PQ, BTREE, BITMAP, LABEL_LIST and INVERTED indexes, then a commit every
`--commit-interval` seconds for `--minutes`: `--batch` new rows, updates of 1/4 of that
many old ones and deletes of 1/20 (a merge_insert and a delete). The table's owner runs
every index merged into one segment and the table compacted every
`--source-optimize-every` commits (default 5: the source is rarely far from its fastest;
`--source-upkeep lancedb`: LanceDB's `optimize()` instead, which adds a vector index
segment each time and so leaves the source slower and slower). Each commit is applied to
the replica as one replicator batch through the replicator's apply path and upkeep
(`ReplicaTable.apply`, then `maintain` as `BatchApplier.maintain` calls it, by the
replica's shape or with `--compact-every N` every N batches, with the
source's definition captured as the publisher does; no Kafka: one batch per source commit,
the most fragments a replicator can make of them). Every `--sample-every` seconds the same
queries run on both tables (opened afresh through LanceDB; after a warm-up round, `--rounds`
rounds, each query on one table right after the other, which first alternating): vector
top-10 (nprobes 8, refine 5), full-text top-10, a filter by id (BTREE), by category
(BITMAP) and by tag (LABEL_LIST); the median of each kind, the replica / source ratio, and
both tables' segments per index and fragments.

    .venv/bin/python -m bench.replicate.bench_serving_stream --minutes 30 \\
        --out bench/results/results_serving_stream.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from bench.support import stats
from bench.support.results import write_result

DIM = 128
CATS = ["red", "green", "blue", "gold"]
WORDS = [f"w{i}" for i in range(2000)]
TAGS = [f"t{i}" for i in range(40)]
STABLE = {"new_table_enable_stable_row_ids": "true"}
KINDS = ("vector", "fts", "filter_id", "filter_cat", "filter_tags")


def rows(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    words = rng.zipf(1.3, size=(len(ids), 8)) % len(WORDS)
    tags = rng.integers(0, len(TAGS), size=(len(ids), 3))
    vec = rng.normal(size=(len(ids), DIM)).astype("float32")
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "cat": [CATS[i % len(CATS)] for i in ids],
            "text": [" ".join(WORDS[w] for w in ws) for ws in words],
            "tags": [[TAGS[t] for t in ts] for ts in tags],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), DIM),
        }
    )


def source(root: str, n: int) -> Any:
    import lancedb

    rng = np.random.default_rng(1)
    t = lancedb.connect(root).create_table("items", rows(rng, np.arange(n)), storage_options=STABLE)
    t.create_index("vec", config=lancedb.index.IvfPq(distance_type="cosine", num_partitions=16))
    t.create_index("id", config=lancedb.index.BTree())
    t.create_index("cat", config=lancedb.index.Bitmap())
    t.create_index("tags", config=lancedb.index.LabelList())
    t.create_index("text", config=lancedb.index.FTS(with_position=False))
    return t


def plan(rng: np.random.Generator, top: int) -> list[tuple[str, Callable[[Any], Any]]]:
    """The queries of one round: (kind, a function building the query on a table)."""
    out: list[tuple[str, Callable[[Any], Any]]] = []
    for q in rng.normal(size=(30, DIM)).astype("float32"):
        out.append(("vector", lambda t, q=q: t.search(q).nprobes(8).refine_factor(5).limit(10)))
    out += [("fts", lambda t, w=w: t.search(w, query_type="fts").limit(10)) for w in WORDS[:20]]
    out += [
        ("filter_id", lambda t, i=i: t.search().where(f"id = {i}"))
        for i in rng.integers(0, top, 20)
    ]
    out += [
        ("filter_cat", lambda t, c=c: t.search().where(f"cat = '{c}'").limit(100)) for c in CATS * 4
    ]
    out += [
        ("filter_tags", lambda t, g=g: t.search().where(f"array_has_any(tags, ['{g}'])").limit(100))
        for g in TAGS[:16]
    ]
    return out


def timed(table: Any, build: Callable[[Any], Any]) -> float:
    """One query's latency (ms): built first, then timed from its execution to its last row."""
    query = build(table).select(["id"])
    t0 = time.perf_counter()
    query.to_arrow()
    return (time.perf_counter() - t0) * 1000


def shape(uri: str) -> dict[str, Any]:
    import lance

    ds = lance.dataset(uri)
    segments: dict[str, int] = {}
    for s in ds.list_indices():
        segments[s["name"]] = segments.get(s["name"], 0) + 1
    return {"fragments": len(ds.get_fragments()), "segments": segments, "rows": ds.count_rows()}


def sample(src_root: str, rep_root: str, top: int, seed: int, rounds: int) -> dict[str, Any]:
    """Each query of `plan` run on both tables, one right after the other (which goes first
    alternates), for `rounds` rounds after one unrecorded warm-up round: a burst of load
    elsewhere on the machine falls on both tables of a pair, not on one table's round."""
    import lancedb

    tables = {
        "source": lancedb.connect(src_root).open_table("items"),
        "replica": lancedb.connect(rep_root).open_table("items"),
    }
    lat: dict[str, dict[str, list[float]]] = {n: {k: [] for k in KINDS} for n in tables}
    for r in range(rounds + 1):
        for i, (kind, build) in enumerate(plan(np.random.default_rng(seed * 100 + r), top)):
            order = ("source", "replica") if (i + r) % 2 == 0 else ("replica", "source")
            for name in order:
                ms = timed(tables[name], build)
                if r:
                    lat[name][kind].append(ms)
    p50 = {
        name: {k: round(stats.median(v), 3) for k, v in kinds.items()}
        for name, kinds in lat.items()
    }
    return {
        "ms_p50": p50,
        "ratio": {k: round(stats.ratio(p50["replica"][k], p50["source"][k]), 2) for k in KINDS},
        "source_shape": shape(os.path.join(src_root, "items.lance")),
        "replica_shape": shape(os.path.join(rep_root, "items.lance")),
    }


class Stream:
    """The source's commits, each applied to the replica as one batch with its upkeep."""

    def __init__(
        self,
        work: str,
        n: int,
        batch: int,
        optimize_every: int,
        compact_every: int | None,
        source_upkeep: str,
    ):
        from lance_cdf.format.definition_capture import capture
        from lance_cdf.replicate.index_keeper import IndexKeeper
        from lance_cdf.replicate.replica import OFFSETS_PROPERTY, ReplicaTable

        self.src_root, self.rep_root = os.path.join(work, "src"), os.path.join(work, "rep")
        self.t = source(self.src_root, n)
        self.src_uri = os.path.join(self.src_root, "items.lance")
        self.keeper = IndexKeeper()
        self.replica = ReplicaTable(
            os.path.join(self.rep_root, "items.lance"), ["id"], keeper=self.keeper
        )
        self.props = {OFFSETS_PROPERTY: "{}"}
        self.capture = capture
        self.rng = np.random.default_rng(2)
        self.live = set(range(n))
        self.next_id, self.batch, self.optimize_every = n, batch, optimize_every
        self.commits, self.upkeep_s, self.compactions = 0, 0.0, 0
        self.compact_every, self.since_compaction = compact_every, 0
        self.source_upkeep = source_upkeep
        import lance

        self.replica.apply(lance.dataset(self.src_uri).to_table(), None, self.props)
        self._upkeep()

    def _upkeep(self) -> None:
        import lance

        self.keeper.want(self.capture(lance.dataset(self.src_uri)))
        # as BatchApplier.maintain asks (--compact-every N: every N batches instead)
        self.since_compaction += 1
        every, compact = self.compact_every, None
        if every is not None:
            compact = 0 < every <= self.since_compaction
        t0 = time.perf_counter()
        done = self.replica.maintain(compact=compact, batch_rows=self.batch)
        self.upkeep_s += time.perf_counter() - t0
        if "fragments_removed" in done:
            self.compactions += 1
            self.since_compaction = 0

    def optimize_source(self) -> None:
        """The source's owner at work: LanceDB's `optimize()` (`--source-upkeep lancedb`),
        or (`merged`, the default) every index merged into one segment and the table
        compacted, the BTREE built again through LanceDB (pylance would rewrite it in a
        format LanceDB 0.40 ignores): a source at its fastest."""
        import lance
        import lancedb

        if self.source_upkeep == "lancedb":
            self.t.optimize()
            return
        ds = lance.dataset(self.src_uri)
        segments: dict[str, int] = {}
        for s in ds.list_indices():
            segments[s["name"]] = segments.get(s["name"], 0) + 1
        names = [n for n in segments if n != "id_idx"]
        ds.optimize.optimize_indices(index_names=names, num_indices_to_merge=max(segments.values()))
        self.t.create_index("id", config=lancedb.index.BTree(), replace=True)
        lance.dataset(self.src_uri).optimize.compact_files()

    def commit(self) -> None:
        """One source commit (new rows and updates, then deletes: two source commits)
        and its replica batch."""
        b = self.batch
        new = np.arange(self.next_id, self.next_id + b)
        self.next_id += b
        old = self.rng.choice(np.fromiter(self.live, np.int64), b // 4 + b // 20, replace=False)
        updated, gone = old[: b // 4], old[b // 4 :]
        upserts = rows(self.rng, np.concatenate([new, updated]))
        self.t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
            upserts
        )
        self.t.delete(f"id IN ({', '.join(map(str, gone.tolist()))})")
        self.live.update(new.tolist())
        self.live.difference_update(gone.tolist())
        self.replica.apply(upserts, pa.table({"id": pa.array(gone, pa.int64())}), self.props)
        self.commits += 1
        if self.optimize_every and self.commits % self.optimize_every == 0:
            self.optimize_source()
        self._upkeep()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--commit-interval", type=float, default=2.0)
    ap.add_argument("--sample-every", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--source-optimize-every", type=int, default=5)
    ap.add_argument("--compact-every", type=int, default=None)  # (the replicator's flag)
    ap.add_argument("--source-upkeep", choices=["merged", "lancedb"], default="merged")
    ap.add_argument("--out")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    result: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "out"}
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        s = Stream(
            work,
            args.rows,
            args.batch,
            args.source_optimize_every,
            args.compact_every,
            args.source_upkeep,
        )
        start = time.monotonic()
        next_sample = start + args.sample_every
        while time.monotonic() - start < args.minutes * 60:
            t0 = time.monotonic()
            s.commit()
            if time.monotonic() >= next_sample:
                got = sample(s.src_root, s.rep_root, s.next_id, len(samples), args.rounds)
                got.update(minute=round((time.monotonic() - start) / 60, 1), commits=s.commits)
                got.update(compactions=s.compactions, upkeep_s=round(s.upkeep_s, 1))
                samples.append(got)
                print(json.dumps({k: got[k] for k in ("minute", "commits", "ratio")}), flush=True)
                next_sample = time.monotonic() + args.sample_every
            time.sleep(max(0.0, args.commit_interval - (time.monotonic() - t0)))
        result["samples"] = samples
        result["max_ratio"] = {k: max(x["ratio"][k] for x in samples) for k in KINDS}
        result["median_ratio"] = {k: stats.median(x["ratio"][k] for x in samples) for k in KINDS}
        result["commits"], result["compactions"] = s.commits, s.compactions
        result["upkeep_s"] = round(s.upkeep_s, 1)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    write_result(args.out, result, indent=1)


if __name__ == "__main__":
    sys.exit(main())
