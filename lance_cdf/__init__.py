"""lance-cdf: a row-level change data feed for Lance tables."""

from lance_cdf.errors import LanceCdfError
from lance_cdf.feed import ChangeFeed, read_changes

__version__ = "0.1.0"

__all__ = ["ChangeFeed", "LanceCdfError", "__version__", "read_changes"]
