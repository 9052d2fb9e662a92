"""A small least-recently-used cache (manifests, deletion vectors, plans, open datasets,
a process's Kafka clients and publishers)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruCache(OrderedDict[K, V]):
    """At most `size` entries; `put` makes its key the most recently used and lets the
    least recently used go past `size`, each handed to `on_evict` (a client to close)."""

    def __init__(self, size: int, on_evict: Callable[[V], None] | None = None):
        super().__init__()
        self.size = size
        self.on_evict = on_evict

    def put(self, key: K, value: V) -> V:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            evicted = self.popitem(last=False)[1]
            if self.on_evict is not None:
                self.on_evict(evicted)
        return value
