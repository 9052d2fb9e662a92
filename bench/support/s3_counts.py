"""The S3 request counts the object-storage benchmarks report (bench_idle_polls.py,
bench_database.py --s3), from `lance_cdf_devtools.S3Server`'s per-table counters: the
benchmark's own writes go through `uncounted` storage options, so what the server counts
is what the code under test asked for."""

from __future__ import annotations

import statistics
from typing import Any

from lance_cdf_devtools import S3Server
from lance_cdf_devtools.s3app import UNCOUNTED_AGENT


def uncounted(options: dict[str, str]) -> dict[str, str]:
    """`options` with a User-Agent the server serves but does not count."""
    return {**options, "user_agent": f"{UNCOUNTED_AGENT} bench writer"}


def table_key(uri: str) -> str:
    """The server's key of a table (`bucket/path`, as `request_counts_by_table` names it)
    from its `s3://` URI."""
    return uri.removeprefix("s3://").rstrip("/")


def requests_per_table(
    server: S3Server, keys: list[str]
) -> tuple[list[int], dict[str, dict[str, int]]]:
    """Requests counted since the last reset: per table of `keys` (in their order; a key
    below a table's folder counts for the table), and by key and kind for everything else
    (the database's own: its namespace manifest, the root listing)."""
    counts = server.request_counts_by_table()
    index = {k: i for i, k in enumerate(keys)}
    per = [0] * len(keys)
    other: dict[str, dict[str, int]] = {}
    for key, kinds in counts.items():
        parts = key.split("/")
        owner = next(
            (
                index["/".join(parts[:n])]
                for n in range(len(parts), 1, -1)
                if "/".join(parts[:n]) in index
            ),
            None,
        )
        if owner is not None:
            per[owner] += sum(kinds.values())
        else:
            other[key] = dict(kinds)
    return per, other


def request_figures(
    per: list[int], other: dict[str, dict[str, int]], seconds: float
) -> dict[str, Any]:
    """The counts of a window of `seconds`: per table per minute (mean, max), for all the
    tables per hour, and the database's own requests per hour apart (and by key and kind,
    in the window)."""
    minutes = seconds / 60
    return {
        "seconds": round(seconds, 1),
        "requests_per_table_per_minute_mean": round(statistics.mean(per) / minutes, 2),
        "requests_per_table_per_minute_max": round(max(per) / minutes, 2),
        "table_requests_per_hour": round(sum(per) / minutes * 60),
        "database_listing_requests_per_hour": round(
            sum(sum(k.values()) for k in other.values()) / minutes * 60
        ),
        "database_requests": other,
    }
