"""`python -m lance_cdf_demo` (`make demo`): see the `lance_cdf_demo` package's docstring."""

from __future__ import annotations

import argparse
import sys

from lance_cdf.errors import LanceCdfError

# the documentation's first page, in the repository (the site: `make docs`)
DOCS = "docs/getting-started.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lance_cdf_demo",
        description="The whole lance-cdf pipeline on this machine: a writer makes random "
        "commits to a sample database of three tables (one in a child namespace), one "
        "`lance-cdf publish --database` streams them to a local Kafka broker, one "
        "`lance-cdf replicate --database-target` applies them to a replica database, and "
        "each replica table is checked against its source at the end.",
    )
    ap.add_argument(
        "--dir",
        default="demo-data",
        help="where the tables, checkpoint and logs go (recreated; default ./demo-data)",
    )
    ap.add_argument("--seconds", type=float, default=60, help="how long the writer runs")
    ap.add_argument(
        "--commit-interval", type=float, default=1.5, help="seconds between random commits"
    )
    ap.add_argument("--partitions", type=int, default=3, help="partitions of each table's topic")
    ap.add_argument(
        "--walkthrough",
        action="store_true",
        help="instead: the change feed of a few commits, no Kafka (fast)",
    )
    args = ap.parse_args(argv)
    if args.walkthrough:
        from lance_cdf_demo.walkthrough import main as walkthrough

        code = walkthrough(["--dir", args.dir])
        print(f"next: {DOCS} (getting started; `make docs` builds the site into site/)")
        return code
    from lance_cdf_demo.pipeline import run

    try:
        code = run(args.dir, args.seconds, args.commit_interval, args.partitions)
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started has been stopped", file=sys.stderr)
        return 130
    except LanceCdfError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    print(f"\nnext: {DOCS} (getting started; `make docs` builds the site into site/)")
    return code


if __name__ == "__main__":
    sys.exit(main())
