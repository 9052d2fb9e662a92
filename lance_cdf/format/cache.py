"""A small least-recently-used cache (manifests, deletion vectors, plans, open datasets)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruCache(OrderedDict[K, V]):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def put(self, key: K, value: V) -> V:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
        return value
