"""Tools whose probes answer badly (another key's receipt, or not at all within the lease), for
:mod:`tests.integration.test_probe_answers`."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import AmbiguousSideEffectError, RetryableToolError
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools._probe import ProbeQuery, ProbeResult

STUBBORN_TTL = timedelta(seconds=2)
"""Lease TTL of ``stubborn_send``; its probe goes on for :data:`STUBBORN_FOR_S`, well past it."""

STUBBORN_FOR_S = 3 * STUBBORN_TTL.total_seconds()


class NoArgs(BaseModel):
    pass


async def _ambiguous(ctx: LeaseContext) -> ToolResult:
    await ctx.advance(Stage.EXTERNAL_CALL, "sending the message")
    raise AmbiguousSideEffectError("the connection dropped while sending")


async def another_keys_receipt(query: ProbeQuery) -> ProbeResult:
    """Answers "happened" with the receipt of another action: its readback names another key."""
    receipt = query.receipt("outbox", "msg-1", "sent", idempotency_key=f"{query.idempotency_key}-other")
    return ProbeResult.happened(receipt, found="msg-1")


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=timedelta(seconds=10),
    requires_approval=False,
    probe=another_keys_receipt,
)
async def misread_send(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Cannot tell whether its message went out; its probe answers with another key's receipt."""
    return await _ambiguous(ctx)


async def stubborn_probe(query: ProbeQuery) -> ProbeResult:
    """Swallows every cancellation and answers only after :data:`STUBBORN_FOR_S`, well past its lease."""
    loop = asyncio.get_running_loop()
    until = loop.time() + STUBBORN_FOR_S
    while (left := until - loop.time()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            continue
    return ProbeResult.not_happened(late=True)


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=STUBBORN_TTL,
    requires_approval=False,
    max_attempts=5,
    probe=stubborn_probe,
)
async def stubborn_send(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Cannot tell whether its message went out; its probe does not end within the lease."""
    return await _ambiguous(ctx)


@tool(
    side_effect=SideEffectClass.IDEMPOTENT,
    lease_ttl=STUBBORN_TTL,
    max_attempts=3,
    probe=stubborn_probe,
)
async def stubborn_retry(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Writes with its key, then fails as another attempt may fix, every time; its probe (asked before each retry)
    does not end within the lease."""
    await ctx.advance(Stage.EXTERNAL_CALL, "writing with the key")
    raise RetryableToolError("the service answered 503")
