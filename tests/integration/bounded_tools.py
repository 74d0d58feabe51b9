"""Tools whose results are over the bounds on what a tool or a probe returns (``docs/limits.md``), for
:mod:`tests.integration.test_result_bounds`."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import AmbiguousSideEffectError
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools._probe import ProbeQuery, ProbeResult

HUGE = 3 * 1024 * 1024
"""Characters of the output ``huge_output`` returns (3 MiB, over Temporal's 2 MiB payload limit)."""

HUGE_EVIDENCE = 5 * 1024 * 1024
"""Characters of the evidence ``flooding_probe`` returns (5 MB)."""


class NoArgs(BaseModel):
    pass


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=10))
async def small_read(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Settles with a small output."""
    return ToolResult(receipt=ctx.receipt("bounds", ctx.idempotency_key, "present"), output={"rows": 1})


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=timedelta(seconds=10))
async def huge_output(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Makes its call, then returns 3 MiB of output."""
    await ctx.advance(Stage.EXTERNAL_CALL, "writing the report")
    await ctx.advance(Stage.VERIFY, "reading the report back")
    return ToolResult(receipt=ctx.receipt("bounds", ctx.idempotency_key, "present"), output={"report": "x" * HUGE})


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=timedelta(seconds=10))
async def huge_receipt(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Makes its call, then returns a receipt of 3 MiB."""
    await ctx.advance(Stage.EXTERNAL_CALL, "writing the report")
    await ctx.advance(Stage.VERIFY, "reading the report back")
    return ToolResult(receipt=ctx.receipt("bounds", ctx.idempotency_key, "present", report="x" * HUGE))


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=10), requires_approval=False)
async def huge_unsafe_output(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Sends a message (no key, no fence), then returns 3 MiB of output."""
    await ctx.advance(Stage.EXTERNAL_CALL, "sending the message")
    return ToolResult(receipt=ctx.receipt("bounds", ctx.idempotency_key, "sent"), output={"log": "x" * HUGE})


async def flooding_probe(query: ProbeQuery) -> ProbeResult:
    """Answers "not happened" with 5 MB of evidence."""
    return ProbeResult.not_happened(dump="e" * HUGE_EVIDENCE)


@tool(
    side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=10), requires_approval=False, probe=flooding_probe
)
async def probed_send(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Its first attempt reaches ``external_call`` and cannot tell whether its message went out; then it sends."""
    await ctx.advance(Stage.EXTERNAL_CALL, "sending the message")
    if ctx.claim.attempts == 1:
        raise AmbiguousSideEffectError("the connection dropped while sending")
    return ToolResult(receipt=ctx.receipt("bounds", ctx.idempotency_key, "sent"))
