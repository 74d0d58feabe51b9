"""A tool for the spoofed-progress tests: it stops at two gates, renewing, with a stage change between them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel

from agentlease import LeaseContext, ToolResult, tool
from agentlease.enums import SideEffectClass, Stage
from tests.integration.tools import gate


class NoArgs(BaseModel):
    pass


KEYS: dict[str, str | None] = {}
"""Per task id: the progress key its call carried (what the codec test looks for in raw history)."""


async def _renew_until(ctx: LeaseContext, name: str, reason: str) -> None:
    opened = gate(name)
    while not opened.is_set():
        try:
            await asyncio.wait_for(opened.wait(), timeout=0.5)
        except TimeoutError:
            await ctx.renew(reason)


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=5))
async def two_gates(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """``preflight`` until ``<task>#1`` opens, then ``external_call`` until ``<task>#2`` opens, then settles."""
    task_id = ctx.claim.task_id
    KEYS[task_id] = ctx._progress_key
    await ctx.advance(Stage.PREFLIGHT, "before the first gate")
    await _renew_until(ctx, f"{task_id}#1", "still before the first gate")
    await ctx.advance(Stage.EXTERNAL_CALL, "past the first gate")
    await _renew_until(ctx, f"{task_id}#2", "still past the first gate")
    return ToolResult(receipt=ctx.receipt("gates", task_id, "passed"))
