"""`python -m lance_cdf.cli`: the `lance-cdf` command."""

from lance_cdf.cli import entry

entry()
