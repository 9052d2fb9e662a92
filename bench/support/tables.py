"""The benchmark tables and a best-of timer, shared by the bench/ scripts."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

DIM = 768


def narrow(n: int, start: int = 0) -> pa.Table:
    """5 scalar columns: id int64, name string, score double, ts int64, flag bool."""
    ids = np.arange(start, start + n)
    return pa.table(
        {
            "id": ids,
            "name": pa.array([f"n{i}" for i in ids], pa.string()),
            "score": ids * 0.5,
            "ts": ids * 1000,
            "flag": ids % 2 == 0,
        }
    )


def vectors(n: int, dim: int = DIM) -> pa.Table:
    """id int64 and a dim-d float32 embedding."""
    vec = np.random.default_rng(0).random(n * dim, dtype=np.float32)
    return pa.table(
        {"id": np.arange(n), "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec), dim)}
    )


def timed(fn, *args, repeat: int = 1):
    """(best time in seconds, last result) over `repeat` calls."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, result


def id_name_vec(start: int, n: int, seed: int, dim: int) -> pa.Table:
    """Rows start..start+n: id int64, name string, a dim-d float32 vector (random, seeded)."""
    vec = np.random.default_rng(seed).random((n, dim), dtype=np.float32)
    return pa.table(
        {
            "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "name": pa.array([f"name-{i}" for i in range(start, start + n)], pa.string()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), dim),
        }
    )
