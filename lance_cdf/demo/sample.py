"""The demo's sample table and the random commits a writer makes to it."""

from __future__ import annotations

import random

import lance
import numpy as np
import pyarrow as pa

DIM = 128
CITIES = ["Oslo", "Lima", "Pune", "Kyiv", "Accra", "Quito"]


def sample(ids: np.ndarray, seed: int) -> pa.Table:
    """Rows with an id, a few scalar columns and a 128-d embedding."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "city": pa.array(rng.choice(CITIES, ids.size)),
            "price": pa.array(np.round(rng.random(ids.size) * 100, 2)),
            "stock": pa.array(rng.integers(0, 500, ids.size), pa.int32()),
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(ids.size * DIM, dtype=np.float32)), DIM
            ),
        }
    )


def create(uri: str, rows: int = 2000) -> None:
    lance.write_dataset(
        sample(np.arange(rows), 0), uri, mode="overwrite", enable_stable_row_ids=True,
        max_rows_per_file=500,
    )  # fmt: skip


class Writer:
    """One random commit per `step()`: append, update, delete, merge_insert upsert, and
    now and then a compaction."""

    OPS = ["append", "update", "delete", "upsert", "compact"]
    WEIGHTS = [3, 3, 2, 3, 1]

    def __init__(self, uri: str, seed: int = 1):
        self.uri = uri
        self.rng = random.Random(seed)
        self.next_id = lance.dataset(uri).count_rows()
        self.commits = 0

    def _ids(self, n: int) -> list[int]:
        ids = lance.dataset(self.uri).to_table(columns=["id"])["id"].to_pylist()
        return self.rng.sample(ids, min(n, len(ids)))

    def step(self) -> str:
        op = self.rng.choices(self.OPS, self.WEIGHTS)[0]
        ds = lance.dataset(self.uri)
        seed = self.rng.randrange(2**31)
        if op == "append":
            n = self.rng.randint(50, 400)
            lance.write_dataset(
                sample(np.arange(self.next_id, self.next_id + n), seed), self.uri, mode="append"
            )
            self.next_id += n
            what = f"append {n} rows"
        elif op == "update":
            city = self.rng.choice(CITIES)
            ds.update({"price": "round(price * 1.1, 2)"}, where=f"city = '{city}' AND id % 7 = 0")
            what = f"update prices in {city}"
        elif op == "delete":
            ids = self._ids(self.rng.randint(5, 60))
            ds.delete(f"id IN ({', '.join(map(str, ids)) or '-1'})")
            what = f"delete {len(ids)} rows"
        elif op == "upsert":
            old = self._ids(self.rng.randint(10, 80))
            new = list(range(self.next_id, self.next_id + self.rng.randint(0, 40)))
            self.next_id += len(new)
            rows = sample(np.array(old + new, dtype=np.int64), seed)
            ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
                rows
            )
            what = f"merge_insert {len(old)} updates + {len(new)} inserts"
        else:
            ds.optimize.compact_files(target_rows_per_fragment=2000)
            what = "compact_files"
        self.commits += 1
        return what
