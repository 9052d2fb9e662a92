"""Listing a database's tables: lance_cdf.format.namespace (its own reading of `__manifest` and of
the root's `.lance` directories) against the same functions on pylance's DirectoryNamespace
(bench/support/namespace_pylance.py), alternated in one run on the same databases.

    python -m bench.format.bench_namespace --tables 200 --rounds 5 \
        --out bench/results/results_namespace.json

Builds a LanceDB database of --tables tables of 20 rows, a tenth in child namespace `ns`
(as bench_database.py does), on local disk and on `lance_cdf_devtools.S3Server` (moto on
127.0.0.1). Each round, with each implementation (the order swapped every round) and on
each database: the time of `list_tables`, and on S3 the requests the server served for it
(by kind); the same for `resolve_table` of a namespaced table by its qualified name
(`ns.t0`); and for pylance's, the walk of `list_namespaces` / `list_tables` alone
(`names`: the listing without `describe_table`'s locations). Both must list the same tables.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from bench.support import stats
from bench.support.results import write_result
from lance_cdf_devtools import S3Server

STABLE = {"new_table_enable_stable_row_ids": "true"}
BUCKET = "bench-namespace"


def make_database(root: str, n: int, opts: dict[str, str] | None) -> None:
    import lancedb

    db = lancedb.connect(root, storage_options=opts)
    db.create_namespace(["ns"])
    data = pa.table({"id": list(range(20)), "s": [f"a{j}" for j in range(20)]})
    for i in range(n):
        path = ["ns"] if i % 10 == 0 else []
        db.create_table(
            f"t{i}", data, namespace_path=path, storage_options={**(opts or {}), **STABLE}
        )


def measure(server: S3Server | None, fn: Any, *args: Any) -> tuple[float, dict[str, int], Any]:
    """`fn(*args)`: seconds, the requests the S3 server served for it, its result."""
    if server is not None:
        server.reset_counts()
    t0 = time.perf_counter()
    out = fn(*args)
    elapsed = time.perf_counter() - t0
    counts = dict(server.request_counts()) if server is not None else {}
    return elapsed, counts, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import lance_cdf.format.namespace as hand
    from bench.support import namespace_pylance

    def names(ns: Any) -> list[tuple[str, ...]]:
        return list(namespace_pylance._identifiers(ns))

    work = tempfile.mkdtemp(prefix="bench-ns-")
    impls = {"hand": hand, "pylance": namespace_pylance}
    server = S3Server(os.path.join(work, "s3"))
    server.start()
    try:
        server.create_bucket(BUCKET)
        opts = server.storage_options()
        places = {
            "local": (os.path.join(work, "db"), None),
            "s3": (f"s3://{BUCKET}/db", opts),
        }
        t0 = time.perf_counter()
        for root, o in places.values():
            make_database(root, args.tables, o)
        print(f"built both databases in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

        results: dict = {
            p: {i: {"list": [], "resolve": [], "names": []} for i in impls} for p in places
        }
        for r in range(args.rounds):
            order = list(impls) if r % 2 == 0 else list(reversed(impls))
            for place, (root, o) in places.items():
                srv = server if o else None
                for name in order:
                    mod = impls[name]
                    secs, counts, refs = measure(srv, mod.list_tables, root, o)
                    got = [(x.qualified_name, x.uri) for x in refs]
                    assert len(got) == args.tables, (name, place, len(got))
                    results[place][name].setdefault("tables", got)
                    results[place][name]["list"].append({"seconds": secs, "requests": counts})
                    secs, counts, uri = measure(srv, mod.resolve_table, root, "ns.t0", o)
                    results[place][name]["resolve"].append({"seconds": secs, "requests": counts})
                    if mod is namespace_pylance:
                        ns = mod._open(root, o)
                        secs, counts, _ = measure(srv, names, ns)
                        results[place][name]["names"].append({"seconds": secs, "requests": counts})
        for place in places:
            a, b = (results[place][i].pop("tables") for i in impls)
            assert a == b, f"{place}: the implementations list different tables"
    finally:
        server.close()

    summary: dict = {}
    for place in places:
        for name in impls:
            for op in ("list", "resolve", "names"):
                runs = results[place][name][op]
                if not runs:
                    continue
                total = Counter()
                for run in runs:
                    total.update(run["requests"])
                per = {k: v / len(runs) for k, v in sorted(total.items())}
                secs = [run["seconds"] for run in runs]
                summary[f"{place} {name} {op}"] = {
                    "median_s": stats.median(secs),
                    "min_s": min(secs),
                    "requests_per_call": per,
                    "requests_total_per_call": sum(per.values()),
                }
                line = f"{place:5} {name:7} {op:7} median {stats.median(secs) * 1000:8.1f} ms"
                if per:
                    line += f"  requests/call {sum(per.values()):6.1f} {per}"
                print(line)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": head,
        "pylance": importlib.metadata.version("pylance"),
        "command": " ".join(["python", "-m", __spec__.name, *sys.argv[1:]]),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "tables": args.tables,
        "rounds": args.rounds,
        "summary": summary,
        "runs": results,
    }
    write_result(args.out, doc, indent=1)


if __name__ == "__main__":
    main()
