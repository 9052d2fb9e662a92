"""Chart of change-extraction time against change size (BENCHMARKS.md).

python bench/plot_core.py bench/results_core_10m.json bench/core_extraction.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, out: str) -> None:
    data = json.load(open(src))
    rows = data["results"]
    changes = [r["changes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for key, label, marker in (
        ("cdf_s", "lance-cdf (read_changes)", "o"),
        ("delta_s", "Lance Dataset.delta()", "s"),
        ("full_diff_s", "full snapshot diff", "^"),
    ):
        ax.plot(changes, [r[key] * 1000 for r in rows], marker=marker, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows changed by the commit")
    ax.set_ylabel("extraction time (ms, log)")
    meta = data["meta"]
    ax.set_title(f"One commit on a {meta['rows']:,}-row table ({meta['machine']})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
