"""lance_cdf.retry: a call repeated while it raises what the caller calls transient, within
the policy's attempts or deadline."""

from __future__ import annotations

import pytest

from lance_cdf.retry import RetryPolicy, retry


class Flaky:
    """Raises `exc` for the first `fails` calls, then returns the call count."""

    def __init__(self, fails: int, exc: Exception):
        self.fails, self.exc, self.calls = fails, exc, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.fails:
            raise self.exc
        return self.calls


FAST = RetryPolicy(pauses=(0.001, 0.002), jitter=0.0)


def transient(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError)


def test_a_transient_error_is_retried_until_the_call_succeeds():
    seen: list[tuple[int, float]] = []
    fn = Flaky(2, TimeoutError("slow"))
    assert retry(fn, FAST, transient, lambda exc, n, pause: seen.append((n, pause))) == 3
    assert seen == [(0, 0.001), (1, 0.002)]


def test_a_permanent_error_is_raised_at_once():
    fn = Flaky(5, ValueError("bad"))
    with pytest.raises(ValueError):
        retry(fn, FAST, transient)
    assert fn.calls == 1


def test_without_a_deadline_one_retry_per_pause():
    fn = Flaky(10, TimeoutError("slow"))
    with pytest.raises(TimeoutError):
        retry(fn, FAST, transient)
    assert fn.calls == 3


def test_with_a_deadline_the_last_pause_repeats_until_it_is_spent():
    fn = Flaky(10_000, TimeoutError("slow"))
    with pytest.raises(TimeoutError):
        retry(fn, RetryPolicy(pauses=(0.001,), deadline_s=0.05, jitter=0.0), transient)
    assert 3 < fn.calls < 10_000


def test_jitter_draws_from_the_upper_part_of_the_pause():
    policy = RetryPolicy(pauses=(1.0,), deadline_s=10.0, jitter=0.5)
    pauses = [policy.pause(0) for _ in range(200)]
    assert all(p is not None and 0.5 <= p <= 1.0 for p in pauses)
    assert len(set(pauses)) > 1
