"""Versions a whole-version replicator stopped without: records it held whose version's
END (the transaction topic's `TransactionRecord`) had not arrived, so none of them was
applied. Said in one line when the replicator stops, and kept for `lance-cdf status` in
`<replica>/_lance_cdf/unfinished.json` (a local replica; removed when a replicator stops
holding none). The cure is the publisher's: a publisher run completes the versions it
published (their END), and the next replicator run applies them."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from lance_cdf.format.io import local_path
from lance_cdf.ops.state_files import read_record, write_record

STATE_FILE = "unfinished.json"
STATE_DIR = "_lance_cdf"  # (the replica's lease directory: `start_checks.LEASE_DIR`)


@dataclass(frozen=True)
class Unfinished:
    """`records` held of source versions `first`-`last`, none with its END read."""

    records: int
    first: int
    last: int
    topic: str
    transaction_topic: str
    at: float = 0.0  # unix time the replicator stopped

    def versions(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"

    def line(self) -> str:
        return (
            f"stopped holding {self.records} record(s) of source version(s) {self.versions()} "
            f"from {self.topic!r} without their END on {self.transaction_topic!r}, so none "
            "was applied: the publisher stopped before completing those versions; run "
            "`lance-cdf publish` on the source again (it completes them), then replicate"
        )


def state_path(target: str) -> str | None:
    """Where a local replica keeps it (None: a replica on object storage)."""
    root = local_path(target)
    return None if root is None else os.path.join(root, STATE_DIR, STATE_FILE)


def record(target: str, unfinished: Unfinished | None) -> None:
    """Keep `unfinished` for `status` (None: remove what an earlier run left). Best effort:
    the replica itself is right either way."""
    path = state_path(target)
    if path is None:
        return
    if unfinished is None:
        with contextlib.suppress(OSError):
            os.remove(path)
        return
    with contextlib.suppress(OSError):
        write_record(path, unfinished, parents=True)


def read(target: str, held: int | None) -> Unfinished | None:
    """What the last replicator to stop left unfinished, if the replica (holding source
    version `held`) has not got past it since."""
    path = state_path(target)
    if path is None:
        return None
    found = read_record(path, Unfinished)
    if found is None or (held is not None and held >= found.last):
        return None
    return found


def describe(found: Unfinished) -> str:
    """`status`'s line."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(found.at))
    return (
        f"the replicator stopped at {when} UTC holding {found.records} record(s) of source "
        f"version(s) {found.versions()} without their END on {found.transaction_topic!r}: "
        "run `lance-cdf publish` on the source to complete them"
    )
