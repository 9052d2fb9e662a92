"""The change feeds a process keeps for the tables it reads (the most recently used, bounded),
shared by the source's readers and the sink's writer tasks."""

from __future__ import annotations

import threading

from lance_cdf.core.feed import ChangeFeed
from lance_cdf.format.cache import LruCache
from lance_cdf.spark.source.options import SourceOptions

# The feeds a process keeps, the most recently used, so that memory stays flat over a run.
# Each feed caches what its table's versions cost to read again (up to 64 manifests, 16
# plans, 4 pylance datasets, row layouts, deletion vectors: each bounded per table), so a
# process that kept a feed for every table it met grew with the tables a database stream
# follows, linearly for as long as it ran, where keeping 16 held it flat. A table whose
# feed was let go opens it again when next asked (its version listing and a manifest or
# two). Figures: docs/benchmarks.md, "A whole database".
# One table's stream keeps its one feed.
FEEDS_KEPT = 16


# (path, sorted storage options) -> its feed
_FEEDS: LruCache[tuple[str, tuple[tuple[str, str], ...]], ChangeFeed] = LruCache(FEEDS_KEPT)


_FEEDS_LOCK = threading.Lock()


def feed_for(opts: SourceOptions) -> ChangeFeed:
    """One ChangeFeed per table per Python process (driver or executor worker), for the
    FEEDS_KEPT tables used last."""
    key = (opts.path, tuple(sorted(opts.storage_options.items())))
    with _FEEDS_LOCK:
        feed = _FEEDS.get(key)
        if feed is not None:
            _FEEDS.move_to_end(key)
            return feed
    feed = ChangeFeed(opts.path, opts.storage_options)  # (reads storage: not under the lock)
    with _FEEDS_LOCK:  # (another thread may have opened it meanwhile: that one is kept)
        kept = _FEEDS.get(key)
        return kept if kept is not None else _FEEDS.put(key, feed)


def forget_feed(path: str, storage_options: dict[str, str]) -> None:
    """Drop this process's feed of a table: a database stream lets the table go, or takes it
    up anew (a table created again at the same path is another table: its manifests are not
    the cached ones)."""
    with _FEEDS_LOCK:
        _FEEDS.pop((path, tuple(sorted(storage_options.items()))), None)


def keep_feed_if_same(path: str, storage_options: dict[str, str]) -> None:
    """Drop this process's feed of a table unless the oldest manifest it holds is still the
    table's own (`TableLog.still_own`: one request). A database stream's table may be
    dropped and created again at the same path (LanceDB reuses `<name>.lance`): another
    table, whose versions 1, 2, ... are not the cached ones. A kept feed reads only what
    is new: opened afresh for every micro-batch, a table's column names were traced from
    the stream's first version again, a manifest read per version the table has had."""
    key = (path, tuple(sorted(storage_options.items())))
    with _FEEDS_LOCK:
        feed = _FEEDS.get(key)
    if feed is not None and not feed.table.still_own():
        with _FEEDS_LOCK:
            if _FEEDS.get(key) is feed:
                _FEEDS.pop(key, None)
