"""Random Lance operation sequences on real pylance datasets, for differential tests."""

from __future__ import annotations

import random
import shutil

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DIM = 4


def make_rows(rng: random.Random, ids: list[int]) -> pa.Table:
    n = len(ids)
    vec = np.array([[rng.random() for _ in range(DIM)] for _ in range(n)], dtype=np.float32)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{rng.randrange(1000)}" for _ in range(n)]),
            "score": pa.array([rng.random() for _ in range(n)]),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), DIM),
        }
    )


class Workload:
    """Applies random operations to a table; every call commits one or more versions."""

    def __init__(
        self,
        uri: str,
        seed: int,
        rows: int = 300,
        rows_per_file: int = 64,
        storage_options: dict[str, str] | None = None,
    ):
        self.uri = uri
        self.storage_options = storage_options
        self.rng = random.Random(seed)
        self.next_id = rows
        self.rows_per_file = rows_per_file
        if "://" not in uri:
            shutil.rmtree(uri, ignore_errors=True)
        lance.write_dataset(
            make_rows(self.rng, list(range(rows))),
            uri,
            enable_stable_row_ids=True,
            max_rows_per_file=rows_per_file,
            storage_options=storage_options,
        )
        self.log: list[tuple[int, str]] = [(1, "create")]

    @property
    def ds(self) -> lance.LanceDataset:
        return self.open()

    def open(self, version: int | None = None) -> lance.LanceDataset:
        return lance.dataset(self.uri, version=version, storage_options=self.storage_options)

    def _ids(self) -> list[int]:
        return self.ds.to_table(columns=["id"])["id"].to_pylist()

    def _new_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    # -- operations -------------------------------------------------------
    def append(self):
        rows = make_rows(self.rng, self._new_ids(self.rng.randint(1, 150)))
        lance.write_dataset(
            self._fit(rows),
            self.uri,
            mode="append",
            max_rows_per_file=self.rows_per_file,
            storage_options=self.storage_options,
        )

    def delete_sparse(self):
        self.ds.delete(f"id % {self.rng.randint(7, 40)} = {self.rng.randint(0, 6)}")

    def delete_dense(self):
        lo = self.rng.randrange(max(self.next_id, 1))
        self.ds.delete(f"id >= {lo} AND id < {lo + self.rng.randint(20, 120)} AND id % 5 != 0")

    def delete_bulk(self):
        # thousands of deletions in one fragment: Lance switches to roaring .bin files
        self.ds.delete(
            f"id % 2 = {self.rng.randint(0, 1)} AND id < {self.rng.randint(10500, 15000)}"
        )

    def update(self):
        k = self.rng.randint(3, 30)
        label = "name" if "name" in self.ds.schema.names else "label"
        self.ds.update({"score": "score + 1.0", label: "'u'"}, where=f"id % {k} = 1")

    def upsert(self):
        ids = self._ids()
        if not ids:
            return self.append()
        old = self.rng.sample(ids, min(len(ids), self.rng.randint(1, 40)))
        rows = make_rows(self.rng, old + self._new_ids(self.rng.randint(0, 20)))
        rows = (
            rows.select(self.ds.schema.names)
            if set(self.ds.schema.names) <= set(rows.column_names)
            else rows
        )
        (
            self.ds.merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(self._fit(rows))
        )

    def upsert_delete_missing(self):
        ids = self._ids()
        keep = self.rng.sample(ids, max(1, len(ids) * 3 // 4)) if ids else []
        lo = min(keep) if keep else 0
        rows = make_rows(self.rng, keep[:20])
        (
            self.ds.merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete(f"id >= {lo} AND id % 9 = 2")
            .execute(self._fit(rows))
        )

    def compact(self):
        self.ds.optimize.compact_files(
            target_rows_per_fragment=self.rng.choice([100, 200, 1000]),
            materialize_deletions_threshold=0.0,
        )

    def index(self):
        self.ds.create_scalar_index("id", "BTREE", replace=True)

    def config(self):
        self.ds.update_config({"cdf.test": str(self.rng.random())})

    def add_column(self):
        self.extra = getattr(self, "extra", 0) + 1
        self.ds.add_columns({f"extra{self.extra}": "id * 2"})

    def drop_column(self):
        extras = [n for n in self.ds.schema.names if n.startswith("extra")]
        if extras:
            self.ds.drop_columns([extras[0]])

    def overwrite(self):
        rows = make_rows(self.rng, self._new_ids(self.rng.randint(20, 120)))
        lance.write_dataset(
            self._fit(rows),
            self.uri,
            mode="overwrite",
            max_rows_per_file=self.rows_per_file,
            storage_options=self.storage_options,
        )

    def restore(self):
        ds = self.ds
        target = self.rng.randint(max(1, ds.version - 4), ds.version)
        self.open(target).restore()

    def rename(self):
        """Rename a column back and forth (name <-> label): Lance keeps its field id."""
        names = self.ds.schema.names
        old, new = ("name", "label") if "name" in names else ("label", "name")
        self.ds.alter_columns({"path": old, "name": new})

    def cast(self):
        """Cast score between double and float (a type change with a new data file)."""
        t = self.ds.schema.field("score").type
        self.ds.alter_columns(
            {"path": "score", "data_type": pa.float32() if t == pa.float64() else pa.float64()}
        )

    def _fit(self, rows: pa.Table) -> pa.Table:
        """Shape generated rows to the table's current schema (added columns filled)."""
        schema = self.ds.schema
        cols = []
        for field in schema:
            if field.name == "label" and "name" in rows.column_names:  # renamed
                cols.append(rows["name"].cast(field.type))
            elif field.name in rows.column_names:
                cols.append(rows[field.name].cast(field.type))
            elif field.name.startswith("extra"):
                cols.append(pc.multiply(rows["id"], 2).cast(field.type))
            else:
                cols.append(pa.nulls(rows.num_rows, field.type))
        return pa.Table.from_arrays(cols, schema=schema)

    OPS = [
        "append",
        "delete_sparse",
        "delete_dense",
        "update",
        "upsert",
        "upsert_delete_missing",
        "compact",
        "index",
        "config",
        "add_column",
        "drop_column",
        "overwrite",
        "restore",
        "rename",
        "cast",
        "delete_bulk",
    ]
    WEIGHTS = [4, 3, 3, 3, 3, 2, 2, 1, 1, 1, 1, 1, 2, 2, 1, 0]

    def step(self, op: str | None = None) -> str:
        op = op or self.rng.choices(self.OPS, self.WEIGHTS)[0]
        before = self.ds.version
        getattr(self, op)()
        after = self.ds.version
        for v in range(before + 1, after + 1):
            self.log.append((v, op))
        return op
