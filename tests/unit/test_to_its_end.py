"""A write awaited to its end through a cancel of its caller (``to_its_end``): the write's outcome, an error
included, reaches the caller's handling, and the cancel is raised after."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentlease.runtime.shutdown import to_its_end


class Refused(Exception):
    pass


async def _cancelled_mid_write(wait: Callable[[Awaitable[None]], Awaitable[None]]) -> tuple[list[str], list[Any]]:
    """A caller whose write (refused once it is let go) is cancelled half-way: what the caller saw, in order, and
    what the loop reported as never retrieved."""
    loop = asyncio.get_running_loop()
    unheard: list[Any] = []
    loop.set_exception_handler(lambda _loop, context: unheard.append(context.get("exception")))
    entered, let_go = asyncio.Event(), asyncio.Event()
    seen: list[str] = []

    async def write() -> None:
        entered.set()
        await let_go.wait()
        raise Refused("release refused: generation 2 holds the lease")

    async def caller() -> None:
        try:
            await wait(write())
        except Refused:
            seen.append("refusal handled")
        await asyncio.sleep(0)  # the caller's next await
        seen.append("went on after the cancel")

    task = asyncio.ensure_future(caller())
    await entered.wait()
    task.cancel()
    await asyncio.sleep(0)
    let_go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    seen.append("caller cancelled")
    for _ in range(3):  # the write's task, if nobody read it, is reported when it is collected
        await asyncio.sleep(0)
    gc.collect()
    await asyncio.sleep(0)
    return seen, unheard


async def test_a_cancelled_caller_still_handles_its_writes_refusal_then_is_cancelled() -> None:
    seen, unheard = await _cancelled_mid_write(to_its_end)

    assert seen == ["refusal handled", "caller cancelled"]
    assert unheard == []


async def test_a_plain_shield_leaves_the_refusal_unheard() -> None:
    """What ``to_its_end`` replaces: the caller leaves at the cancel and the write's refusal is never read."""
    seen, unheard = await _cancelled_mid_write(asyncio.shield)

    assert seen == ["caller cancelled"]
    assert [type(error) for error in unheard] == [Refused]


async def test_a_write_that_ends_normally_returns_its_value_and_the_cancel_follows() -> None:
    let_go = asyncio.Event()
    got: list[int] = []

    async def write() -> int:
        await let_go.wait()
        return 7

    async def caller() -> None:
        got.append(await to_its_end(write()))
        await asyncio.sleep(0)
        got.append(-1)  # never: the cancel is raised here

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    let_go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got == [7]


async def test_a_cancel_of_the_write_itself_is_raised_at_once() -> None:
    async def write() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await to_its_end(write())
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
