"""The polling helpers the suite uses instead of sleeps."""

from __future__ import annotations

import pytest

from tests.eventually import assert_eventually, assert_eventually_sync


class Countdown:
    """Fails (``AssertionError``) until it has been called ``n`` times."""

    def __init__(self, n: int) -> None:
        self.calls = 0
        self.n = n

    def __call__(self) -> str:
        self.calls += 1
        assert self.calls >= self.n, f"only {self.calls} calls"
        return "done"


async def test_async_check_passes_once_it_stops_failing() -> None:
    countdown = Countdown(3)

    async def check() -> str:
        return countdown()

    assert await assert_eventually(check, timeout=5, interval=0.001) == "done"
    assert countdown.calls == 3


async def test_predicate_is_polled_until_truthy() -> None:
    answers = iter([False, 0, [], "yes"])
    assert await assert_eventually(lambda: next(answers), timeout=5, interval=0.001) == "yes"


async def test_none_means_an_assert_style_check_passed() -> None:
    def check() -> None:
        return None

    assert await assert_eventually(check, timeout=0.1) is None  # type: ignore[func-returns-value]


async def test_timeout_reports_the_last_failure() -> None:
    countdown = Countdown(10**9)
    with pytest.raises(AssertionError, match=r"lease lapse not met within 0\.050s .*only \d+ calls") as failed:
        await assert_eventually(countdown, timeout=0.05, interval=0.01, message="lease lapse")
    assert isinstance(failed.value.__cause__, AssertionError)
    assert countdown.calls >= 2


async def test_other_errors_propagate_at_once() -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await assert_eventually(broken, timeout=5)
    assert len(calls) == 1


def test_sync_variant() -> None:
    countdown = Countdown(2)
    assert assert_eventually_sync(countdown, timeout=5, interval=0.001) == "done"
    with pytest.raises(AssertionError, match="not met within"):
        assert_eventually_sync(lambda: False, timeout=0.02, interval=0.005)


def test_sync_variant_refuses_coroutines() -> None:
    async def check() -> bool:
        return True

    with pytest.raises(TypeError, match="use assert_eventually"):
        assert_eventually_sync(check, timeout=0.1)  # type: ignore[unused-coroutine]
