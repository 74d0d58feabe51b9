"""A write awaited to its end through a cancel of its caller (``to_its_end``): the caller waits for it (within a
bound), the cancel is then raised as it came, counted as ``asyncio.timeout`` and task groups count it, and the
write's outcome is always read."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentlease.runtime.shutdown import to_its_end


class Refused(Exception):
    pass


def _unheard() -> list[Any]:
    """What the running loop reports from now on as an exception nobody retrieved."""
    unheard: list[Any] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unheard.append(context.get("exception")))
    return unheard


async def _collected() -> None:
    """Let finished tasks be collected, so that an unread outcome is reported."""
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()
    await asyncio.sleep(0)


async def _cancelled_mid_write(wait: Callable[[Awaitable[None]], Awaitable[None]]) -> tuple[list[str], list[Any]]:
    """A caller whose write (refused once let go) is cancelled half-way: what happened, in order, and what the
    loop reported as never retrieved."""
    unheard = _unheard()
    entered, let_go = asyncio.Event(), asyncio.Event()
    seen: list[str] = []

    async def write() -> None:
        entered.set()
        await let_go.wait()
        seen.append("write ended")
        raise Refused("release refused: generation 2 holds the lease")

    async def caller() -> None:
        try:
            await wait(write())
        except Refused:
            seen.append("refusal reached the caller")

    task = asyncio.ensure_future(caller())
    await entered.wait()
    task.cancel()
    await asyncio.sleep(0)
    let_go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    seen.append("caller cancelled")
    await _collected()
    return seen, unheard


async def test_a_cancelled_caller_waits_for_its_write_then_is_cancelled_and_the_outcome_is_read() -> None:
    seen, unheard = await _cancelled_mid_write(to_its_end)

    assert seen == ["write ended", "caller cancelled"]
    assert unheard == []


async def test_a_plain_shield_leaves_before_the_write_ends_and_its_refusal_unheard() -> None:
    """What ``to_its_end`` replaces."""
    seen, unheard = await _cancelled_mid_write(asyncio.shield)

    assert seen[0] == "caller cancelled"
    assert [type(error) for error in unheard] == [Refused]


async def test_a_timeout_that_falls_during_the_write_is_a_timeout_after_it() -> None:
    let_go = asyncio.Event()
    written: list[str] = []

    async def write() -> None:
        await let_go.wait()
        written.append("written")

    async def caller() -> str:
        try:
            async with asyncio.timeout(0):  # already due: it cancels the caller at its first wait
                await to_its_end(write())
        except TimeoutError:
            await asyncio.sleep(0)  # no cancel left behind to fall here
            return "timed out"
        return "not timed out"

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    let_go.set()
    assert await task == "timed out"
    assert written == ["written"]
    assert not task.cancelling()


async def test_a_cancel_from_outside_during_a_timeout_is_not_lost() -> None:
    entered, let_go = asyncio.Event(), asyncio.Event()

    async def write() -> None:
        entered.set()
        await let_go.wait()

    async def caller() -> str:
        try:
            async with asyncio.timeout(0):  # falls during the write, as the cancel from outside does
                await to_its_end(write())
        except TimeoutError:
            await asyncio.sleep(0)
            return "timed out, the cancel from outside lost"
        return "went on"

    task = asyncio.ensure_future(caller())
    await entered.wait()
    task.cancel()  # a worker's shutdown: not the timeout's
    await asyncio.sleep(0)
    let_go.set()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_write_that_outlasts_the_wait_goes_on_alone_and_its_outcome_is_read() -> None:
    unheard = _unheard()
    entered, let_go = asyncio.Event(), asyncio.Event()

    async def write() -> None:
        entered.set()
        await let_go.wait()
        raise Refused("ended after its caller left")

    task = asyncio.ensure_future(to_its_end(write(), wait_after_cancel_s=0))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    let_go.set()
    await _collected()
    assert unheard == []


async def test_a_write_that_ends_normally_returns_its_value() -> None:
    async def write() -> int:
        return 7

    assert await to_its_end(write()) == 7


async def test_a_cancel_of_the_write_itself_is_raised_at_once() -> None:
    async def write() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await to_its_end(write())
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
