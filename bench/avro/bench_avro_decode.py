"""Avro -> Arrow decoding of change records: fastavro per record (the replicator's old
path) against the vectorized decoder (lance_cdf.avro.decode).

    python -m bench.avro.bench_avro_decode [--narrow 1000000] [--vectors 100000]

Two workloads, insert records of the real envelope schema (`envelope_schema`):
  * narrow   rows of id long, name string, score double, ts long, flag boolean;
  * vectors  rows of id long and a 768-d float32 vector (fixed_size_list).
Both paths start from the same list of bodies and end with Arrow: the old one with
fastavro.schemaless_reader per record + pa.Table.from_pylist of the `after` images, the new
one with Frames.of + BatchDecoder.decode (the whole envelope: before, after, op, source).
"""

from __future__ import annotations

import argparse
import io

import fastavro
import numpy as np
import pyarrow as pa

from bench.support.results import write_result
from bench.support.tables import narrow, timed, vectors
from lance_cdf.avro.decode import BatchDecoder, Frames
from lance_cdf.avro.schema import change_records, envelope_schema, row_arrow_schema


def bodies_of(rows: pa.Table) -> tuple[dict, list[bytes]]:
    """Insert records of `rows`, encoded as the publisher does (fastavro, no header)."""
    n = rows.num_rows
    events = rows.append_column("_rowid", pa.array(np.arange(n, dtype=np.uint64)))
    events = events.append_column("_change_type", pa.array(["insert"] * n))
    events = events.append_column("_commit_version", pa.array(np.ones(n, np.int64)))
    events = events.append_column(
        "_commit_timestamp", pa.array(np.full(n, 1_700_000_000_000, "datetime64[ms]"))
    )
    schema = envelope_schema(rows.schema, "bench")
    parsed = fastavro.parse_schema(schema)
    out = []
    for start in range(0, n, 100_000):
        records = change_records(
            events.slice(start, 100_000),
            rows.column_names,
            {1: "Append"},
            "bench",
            None,
            "0.1",
            0,
        )
        for _, value, _ in records:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, value)
            out.append(buf.getvalue())
    return schema, out


def old_path(schema: dict, bodies: list[bytes]) -> pa.Table:
    parsed = fastavro.parse_schema(schema)
    images = [fastavro.schemaless_reader(io.BytesIO(b), parsed, None)["after"] for b in bodies]
    return pa.Table.from_pylist(images, schema=row_arrow_schema(schema))


def new_path(schema: dict, bodies: list[bytes]) -> pa.Table:
    decoded, err = BatchDecoder(schema).decode(Frames.of(bodies))
    assert not err.any()
    return pa.Table.from_struct_array(decoded.field("after"))


def run(name: str, rows: pa.Table, repeat_old: int) -> dict:
    schema, bodies = bodies_of(rows)
    n = len(bodies)
    t_old, a = timed(old_path, schema, bodies, repeat=repeat_old)
    t_new, b = timed(new_path, schema, bodies, repeat=3)
    assert a.equals(b.cast(a.schema)), "the two paths disagree"
    result = {
        "workload": name,
        "records": n,
        "bytes_per_record": sum(map(len, bodies)) / n,
        "fastavro_us_per_record": t_old / n * 1e6,
        "vectorized_us_per_record": t_new / n * 1e6,
        "speedup": t_old / t_new,
    }
    print(
        f"{name:8s} {n:>9,} records ({result['bytes_per_record']:.0f} B each): "
        f"fastavro+from_pylist {result['fastavro_us_per_record']:.2f} us/record, "
        f"vectorized {result['vectorized_us_per_record']:.3f} us/record, "
        f"{result['speedup']:.1f}x"
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--narrow", type=int, default=1_000_000)
    ap.add_argument("--vectors", type=int, default=100_000)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    results = [run("narrow", narrow(args.narrow), 1), run("vectors", vectors(args.vectors), 1)]
    write_result(args.out, results, indent=1)


if __name__ == "__main__":
    main()
