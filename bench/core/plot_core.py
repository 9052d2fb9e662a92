"""Chart of the change-extraction matrix (BENCHMARKS.md).

python -m bench.core.plot_core bench/results/results_core.json bench/figures/core_extraction.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = (
    ("cold_s", "lance-cdf read_changes (fresh call)", "o"),
    ("warm_s", "lance-cdf warm ChangeFeed", "."),
    ("delta_take_s", "delta() + _take_rows of pre-images (hand-written)", "s"),
    ("delta_s", "delta() alone (no pre-images)", "^"),
)


def main(src: str, out: str) -> None:
    data = json.load(open(src))
    sizes = data["sizes"]
    fig, axes = plt.subplots(len(sizes), 1, figsize=(11, 4.2 * len(sizes)), dpi=110)
    axes = axes if len(sizes) > 1 else [axes]
    for ax, size in zip(axes, sizes, strict=True):
        rows = size["results"]
        x = range(len(rows))
        for key, label, marker in SERIES:
            ax.plot(x, [r[key] * 1000 for r in rows], marker=marker, label=label, linewidth=1)
        ax.set_xticks(list(x))
        ax.set_xticklabels(
            [f"{r['changes']:,} {r['layout'][:4]} {r['change']}" for r in rows],
            rotation=70,
            fontsize=7,
        )
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title(f"{size['rows']:,} rows, {size['fragments']} fragments", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Change extraction per cell ({data['meta']['machine']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
