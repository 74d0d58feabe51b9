"""Wait for a condition by polling it, never with a bare sleep.

A check is a callable (sync or async) that either raises ``AssertionError`` or returns a value.
It passes when it returns without raising and its value is ``None`` (an assert-style check)
or truthy (a predicate). Any other exception propagates at once: only "not yet" is retried.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _verdict(result: Any) -> Any:
    """``result`` if it counts as a pass, else raise ``AssertionError``."""
    if result is None or result:
        return result
    raise AssertionError(f"check returned {result!r}")


def _timed_out(message: str, timeout: float, attempts: int, last: BaseException | None) -> AssertionError:
    what = message or "condition"
    return AssertionError(f"{what} not met within {timeout:.3f}s ({attempts} attempts); last failure: {last}")


@overload
async def assert_eventually(
    check: Callable[[], Awaitable[T]], *, timeout: float = ..., interval: float = ..., message: str = ...
) -> T: ...
@overload
async def assert_eventually(
    check: Callable[[], T], *, timeout: float = ..., interval: float = ..., message: str = ...
) -> T: ...
async def assert_eventually(
    check: Callable[[], Any],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "",
) -> Any:
    """Poll ``check`` until it passes.

    Args:
        check: a sync or async callable; it passes by returning ``None`` or a truthy value and
            fails by raising ``AssertionError`` or returning a falsy value other than ``None``.
        timeout: seconds to keep trying. Default 10s.
        interval: seconds between attempts. Default 0.05s.
        message: what is awaited, for the failure message.

    Returns:
        The value of the passing call.

    Raises:
        AssertionError: ``check`` did not pass within ``timeout``; chained to the last failure.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    attempts = 0
    last: BaseException | None = None
    while True:
        attempts += 1
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            return _verdict(result)
        except AssertionError as exc:
            last = exc
        if loop.time() >= deadline:
            raise _timed_out(message, timeout, attempts, last) from last
        await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))


def assert_eventually_sync(
    check: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "",
) -> T:
    """Synchronous :func:`assert_eventually` for code that runs outside an event loop.

    Raises:
        AssertionError: ``check`` did not pass within ``timeout``; chained to the last failure.
        TypeError: ``check`` returned an awaitable (use :func:`assert_eventually`).
    """
    deadline = time.monotonic() + timeout
    attempts = 0
    last: BaseException | None = None
    while True:
        attempts += 1
        try:
            result = check()
            if inspect.isawaitable(result):
                if inspect.iscoroutine(result):
                    result.close()
                raise TypeError("assert_eventually_sync got an awaitable; use assert_eventually")
            return _verdict(result)
        except AssertionError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise _timed_out(message, timeout, attempts, last) from last
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
