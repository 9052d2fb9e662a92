"""One way to retry: a call repeated, with growing pauses, while what it raises is
transient, until a number of attempts or a deadline is spent.

    retry(fn, RetryPolicy(pauses=(0.1, 0.5, 2.0), deadline_s=30.0), retriable=...)

The pauses are jittered (each drawn from its upper half) so that processes started
together, racing for the same object, do not retry in step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How a call is retried.

    Attributes:
        pauses: the pause (s) before each retry, in order; the last one repeats while
            the deadline allows.
        deadline_s: give up once a further pause would end past this many seconds since
            the first attempt; None: after one retry per entry of `pauses`.
        jitter: each pause is drawn from [(1 - jitter) * pause, pause].
    """

    pauses: tuple[float, ...] = (0.1, 0.2, 0.5, 1.0, 2.0)
    deadline_s: float | None = None
    jitter: float = 0.5

    def pause(self, retries: int) -> float | None:
        """The pause before retry number `retries` + 1 (None: no more retries by count)."""
        if not self.pauses:
            return None
        if retries >= len(self.pauses) and self.deadline_s is None:
            return None
        base = self.pauses[min(retries, len(self.pauses) - 1)]
        return base * (1.0 - self.jitter * random.random())


def retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    retriable: Callable[[BaseException], bool],
    on_retry: Callable[[BaseException, int, float], None] | None = None,
) -> T:
    """`fn()`, called again after a pause while it raises an exception `retriable` accepts
    and `policy` allows another attempt.

    Args:
        fn: the call; it must be safe to repeat.
        policy: the pauses and the deadline.
        retriable: whether an exception `fn` raised is worth another attempt.
        on_retry: told (exception, retries so far, pause) before each pause: for a log
            line or a counter.

    Returns:
        What `fn` returned on the first attempt that did not raise.

    Raises:
        The last exception of `fn`: one `retriable` refused, or the one in hand when
        the attempts or the deadline were spent.
    """
    started = time.monotonic()
    retries = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not retriable(exc):
                raise
            pause = policy.pause(retries)
            spent = time.monotonic() - started
            if pause is None or (
                policy.deadline_s is not None and spent + pause > policy.deadline_s
            ):
                raise
            if on_retry is not None:
                on_retry(exc, retries, pause)
            time.sleep(pause)
            retries += 1
