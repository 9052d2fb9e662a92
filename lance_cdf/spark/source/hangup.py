"""Quiet exits of pyspark's helper processes when Spark hangs up on them.

Stopping a streaming query interrupts its thread, and Java closes a socket channel that an
interrupted thread uses (ClosedByInterruptException) before Spark kills the Python process
at its other end. The stream's source runner (latestOffset / partitions / commit) and the
sink's commit runner then read EOF, their error report meets a closed pipe, and Python
printed three chained tracebacks on `lance-cdf publish`'s stderr on a clean SIGINT or
SIGTERM stop (seen in CI). In those processes only, an exit whose exceptions are all the
peer hanging up prints nothing; any other error, or a hang-up while one of ours was being
reported, is printed as before.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType

from lance_cdf.ops.internals import PYSPARK_STREAMING_RUNNERS as RUNNERS

_HANG_UPS = (EOFError, BrokenPipeError, ConnectionResetError)
_ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


def quiet_when_spark_hangs_up() -> None:
    """Install the quiet exit if this process is one of pyspark's streaming runners (the
    data source's streamReader() / the sink's streamWriter() are called there)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", None) not in RUNNERS or isinstance(sys.excepthook, _QuietHook):
        return
    sys.excepthook = _QuietHook(sys.excepthook)


class _QuietHook:
    """The excepthook installed: `previous` for anything but the peer hanging up."""

    def __init__(self, previous: _ExceptHook):
        self.previous = previous

    def __call__(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        if not only_hang_ups(exc):
            self.previous(kind, exc, tb)


def only_hang_ups(exc: BaseException | None) -> bool:
    """Whether every exception in the chain is the peer closing the connection."""
    seen = 0
    while exc is not None and seen < 16:
        if not isinstance(exc, _HANG_UPS):
            return False
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return seen > 0
