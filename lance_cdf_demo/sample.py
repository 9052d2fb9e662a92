"""The demo's sample database and the random commits a writer makes to its tables.

A Lance directory namespace (what LanceDB writes, readable with `lancedb.connect`) of three
tables with stable row IDs: `items` (a 128-d embedding per row), `users`, and `orders` in
the child namespace `sales` (qualified name `sales.orders`)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa

from lance_cdf.format.namespace import table_location

DIM = 128
CITIES = ["Oslo", "Lima", "Pune", "Kyiv", "Accra", "Quito"]
NAMES = ["Ada", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana"]


def sample(ids: np.ndarray, seed: int) -> pa.Table:
    """Items: an id, a few scalar columns and a 128-d embedding."""
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


def users(ids: np.ndarray, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array(rng.choice(NAMES, ids.size)),
            "city": pa.array(rng.choice(CITIES, ids.size)),
            "points": pa.array(rng.integers(0, 1000, ids.size), pa.int64()),
        }
    )


def orders(ids: np.ndarray, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "item": pa.array(rng.integers(0, 2000, ids.size), pa.int64()),
            "user": pa.array(rng.integers(0, 300, ids.size), pa.int64()),
            "qty": pa.array(rng.integers(1, 9, ids.size), pa.int32()),
            "city": pa.array(rng.choice(CITIES, ids.size)),
        }
    )


@dataclass(frozen=True)
class Spec:
    """One table of the sample database: its qualified name, rows and updates."""

    name: str  # qualified name: namespace levels and table name joined by "."
    rows: Callable[[np.ndarray, int], pa.Table]
    size: int  # rows at creation
    update: dict[str, str]  # column -> SQL expression of an update
    columns: str  # a few columns to show (`lance-cdf changes --columns`)
    weight: int  # how often the writer picks it

    @property
    def identifier(self) -> tuple[str, ...]:
        return tuple(self.name.split("."))


TABLES = [
    Spec("items", sample, 2000, {"price": "round(price * 1.1, 2)"}, "id,city,price", 3),
    Spec("users", users, 300, {"points": "points + 10"}, "id,name,points", 1),
    Spec("sales.orders", orders, 500, {"qty": "qty + 1"}, "id,item,qty", 2),
]


def create(root: str) -> dict[str, str]:
    """The sample database at `root` (its namespace levels and tables declared as the Lance
    directory namespace does); qualified name -> table URI."""
    uris = {}
    for spec in TABLES:
        uri = table_location(root, spec.identifier)
        lance.write_dataset(
            spec.rows(np.arange(spec.size), 0),
            uri,
            mode="create",
            enable_stable_row_ids=True,
            max_rows_per_file=500,
        )
        uris[spec.name] = uri
    return uris


class Writer:
    """One random commit per `step()`: append, update, delete, merge_insert upsert, and
    now and then a compaction, on one table picked at random."""

    OPS = ["append", "update", "delete", "upsert", "compact"]
    WEIGHTS = [3, 3, 2, 3, 1]

    def __init__(self, uris: dict[str, str], seed: int = 1):
        self.uris = uris
        self.rng = random.Random(seed)
        self.specs = [s for s in TABLES if s.name in uris]
        self.next_id = {s.name: lance.dataset(uris[s.name]).count_rows() for s in self.specs}
        self.commits = 0

    def _ids(self, uri: str, n: int) -> list[int]:
        ids = lance.dataset(uri).to_table(columns=["id"])["id"].to_pylist()
        return self.rng.sample(ids, min(n, len(ids)))

    def step(self) -> str:
        spec = self.rng.choices(self.specs, [s.weight for s in self.specs])[0]
        uri = self.uris[spec.name]
        op = self.rng.choices(self.OPS, self.WEIGHTS)[0]
        ds = lance.dataset(uri)
        seed = self.rng.randrange(2**31)
        first = self.next_id[spec.name]
        if op == "append":
            n = self.rng.randint(20, spec.size // 5)
            lance.write_dataset(spec.rows(np.arange(first, first + n), seed), uri, mode="append")
            self.next_id[spec.name] += n
            what = f"append {n} rows"
        elif op == "update":
            city = self.rng.choice(CITIES)
            ds.update(spec.update, where=f"city = '{city}' AND id % 7 = 0")
            what = f"update {', '.join(spec.update)} in {city}"
        elif op == "delete":
            ids = self._ids(uri, self.rng.randint(5, 60))
            ds.delete(f"id IN ({', '.join(map(str, ids)) or '-1'})")
            what = f"delete {len(ids)} rows"
        elif op == "upsert":
            old = self._ids(uri, self.rng.randint(10, 80))
            new = list(range(first, first + self.rng.randint(0, 40)))
            self.next_id[spec.name] += len(new)
            rows = spec.rows(np.array(old + new, dtype=np.int64), seed)
            ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
                rows
            )
            what = f"merge_insert {len(old)} updates + {len(new)} inserts"
        else:
            ds.optimize.compact_files(target_rows_per_fragment=2000)
            what = "compact_files"
        self.commits += 1
        return f"{spec.name}: {what}"
