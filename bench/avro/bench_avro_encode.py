"""Avro encoding of change records: fastavro per record vs the vectorised encoder.

    python -m bench.avro.bench_avro_encode --narrow-rows 1000000 --vector-rows 100000

Both paths produce the key and value bodies of every record of one batch of
inserts (no Kafka): the old path is `change_records` + `fastavro.schemaless_writer`
per record (what `KafkaChangePublisher.publish` did), the new one
`avro_encode.encode_changes` plus turning the binary columns into `bytes` objects
(what `publish` now hands to the producer). The outputs are checked to be equal.
"""

from __future__ import annotations

import argparse
import io

import fastavro
import numpy as np
import pyarrow as pa

from bench.support.results import write_result
from bench.support.tables import narrow, timed, vectors
from lance_cdf.avro.encode import RecordShape, encode_changes
from lance_cdf.avro.schema import change_records, envelope_schema, key_schema

OPS = {1: "Append"}


def as_inserts(user: pa.Table) -> pa.Table:
    n = user.num_rows
    meta = {
        "_rowid": pa.array(np.arange(n), pa.uint64()),
        "_change_type": pa.array(["insert"] * n),
        "_commit_version": pa.array(np.ones(n, np.int64)),
        "_commit_timestamp": pa.array(
            np.full(n, 1_767_225_600_000_000), pa.timestamp("us", tz="UTC")
        ),
    }
    for name, col in meta.items():
        user = user.append_column(name, col)
    return user


def old_path(events, schema, now_ms):
    value = fastavro.parse_schema(envelope_schema(schema, "t"))
    key = fastavro.parse_schema(key_schema(schema, None, "t"))
    out = []
    for k, v, _ in change_records(events, schema.names, OPS, "t", None, "0.1", now_ms):
        kb, vb = io.BytesIO(), io.BytesIO()
        fastavro.schemaless_writer(kb, key, k)
        fastavro.schemaless_writer(vb, value, v)
        out.append((kb.getvalue(), vb.getvalue()))
    return out


def new_path(events, schema, now_ms):
    enc = encode_changes(events, RecordShape(schema, "t", None, "0.1"), OPS, now_ms)
    return list(zip(enc.keys.to_pylist(), enc.values.to_pylist(), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--narrow-rows", type=int, default=1_000_000)
    parser.add_argument("--vector-rows", type=int, default=100_000)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    now_ms = 1_767_225_600_123
    results = {}
    for name, user in (("narrow", narrow(args.narrow_rows)), ("vector", vectors(args.vector_rows))):
        events = as_inserts(user)
        n = events.num_rows
        t_new, new = timed(new_path, events, user.schema, now_ms, repeat=3)
        t_old, old = timed(old_path, events, user.schema, now_ms)
        assert new == old, "the vectorised encoder's bytes differ from fastavro's"
        results[name] = {
            "rows": n,
            "old_us_per_record": t_old / n * 1e6,
            "new_us_per_record": t_new / n * 1e6,
            "speedup": t_old / t_new,
        }
        r = results[name]
        print(
            f"{name:7s} {n:>9,d} records: fastavro {r['old_us_per_record']:8.2f} us/rec, "
            f"vectorised {r['new_us_per_record']:7.3f} us/rec, {r['speedup']:6.1f}x",
            flush=True,
        )
    write_result(args.out, results)


if __name__ == "__main__":
    main()
