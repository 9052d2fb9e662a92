"""A small least-recently-used cache (manifests, deletion vectors, plans, open datasets)."""

from __future__ import annotations

from collections import OrderedDict


class LruCache(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def put(self, key, value):
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
        return value
