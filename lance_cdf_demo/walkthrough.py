"""`python -m lance_cdf_demo --walkthrough`: a sample table with stable row IDs, a few
commits of every kind, and their change feed printed. No Kafka, no Spark: seconds."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import lance
import numpy as np

from lance_cdf.cli.render import render_changes
from lance_cdf.core.feed import read_changes
from lance_cdf_demo.sample import sample


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=None, help="where to create the table (default: a temp dir)")
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="lance-cdf-demo-")
    uri = os.path.join(root, "demo.lance")
    shutil.rmtree(uri, ignore_errors=True)

    steps = []
    lance.write_dataset(
        sample(np.arange(8), 1), uri, enable_stable_row_ids=True, max_rows_per_file=4
    )
    steps.append((lance.dataset(uri).version, "create 8 rows"))
    lance.write_dataset(sample(np.arange(8, 11), 2), uri, mode="append")
    steps.append((lance.dataset(uri).version, "append 3 rows"))
    lance.dataset(uri).update({"price": "price * 2"}, where="city = 'Oslo'")
    steps.append((lance.dataset(uri).version, "update: double Oslo prices"))
    lance.dataset(uri).delete("id IN (1, 9)")
    steps.append((lance.dataset(uri).version, "delete ids 1 and 9"))
    upsert = sample(np.array([2, 3, 42]), 3)
    lance.dataset(uri).merge_insert(
        "id"
    ).when_matched_update_all().when_not_matched_insert_all().execute(upsert)
    steps.append((lance.dataset(uri).version, "merge_insert: upsert ids 2, 3, 42"))
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=100)
    steps.append((lance.dataset(uri).version, "compact_files (moves rows, no logical change)"))

    print(f"Sample table: {uri}\n")
    for version, step in steps:
        print(f"  version {version}: {step}")
    print()
    render_changes(read_changes(uri, 1, columns=["id", "city", "price"]), sys.stdout)
    print(
        "\nExplore it yourself:\n"
        f"  .venv/bin/lance-cdf changes {uri} --from 2\n"
        f"  .venv/bin/lance-cdf changes {uri} --from 1 --format jsonl --columns id,price\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
