"""The figures the benchmarks report from their samples: medians, percentiles and ratios,
defined once, so that a "median" or a "p99" means the same in every result file."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any


def median(values: Iterable[Any]) -> Any:
    """The middle value (the mean of the middle two for an even count): `statistics.median`,
    so integers stay integers where the middle value is one."""
    return statistics.median(values)


def percentile(values: Sequence[float] | Any, q: float) -> float:
    """The `q`-th percentile (0-100) of a non-empty sequence or array, interpolated linearly
    between the closest ranks (numpy's default), as a float."""
    import numpy as np  # (here: the scripts that report only medians do not load numpy)

    return float(np.percentile(values, q))


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either is missing (None) or zero."""
    return a / b if a and b else None
