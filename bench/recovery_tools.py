"""Tools of the recovery benchmark (``bench/recovery.py``): hold a lease until a fault, then settle.

Worker processes load them with ``AGENTLEASE_TOOL_MODULES=bench.recovery_tools``. The attempt of
generation 1 enters ``external_call`` and holds there, renewing every TTL / 4, until its
``release_file`` exists, so the benchmark can kill or pause its worker at a known point; any later
generation runs straight through ``commit`` and ``verify`` and settles.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from agentlease.enums import SideEffectClass, Stage
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool

HOLDING = "holding until the benchmark's fault"
"""Renewal reason of a holding attempt (the benchmark waits for it in the ledger)."""


class HoldArgs(BaseModel):
    """``release_file``: generation 1 holds while it does not exist."""

    release_file: str


async def _hold_then_settle(ctx: LeaseContext, args: HoldArgs) -> ToolResult:
    await ctx.advance(Stage.PREFLIGHT, "nothing to check")
    await ctx.advance(Stage.EXTERNAL_CALL, f"writing {ctx.idempotency_key}")
    if ctx.fencing_token == 1:
        every = ctx.claim.lease_ttl.total_seconds() / 4
        while not Path(args.release_file).exists():
            await ctx.renew(HOLDING)
            await asyncio.sleep(every)
    await ctx.advance(Stage.COMMIT, "written")
    await ctx.advance(Stage.VERIFY, "reading back")
    return ToolResult(receipt=ctx.receipt("recovery-bench", ctx.idempotency_key, "present"))


_START_TO_CLOSE = timedelta(minutes=10)


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=2), start_to_close=_START_TO_CLOSE)
async def recovery_hold_2s(ctx: LeaseContext, args: HoldArgs) -> ToolResult:
    """Holds a 2 s lease until the fault."""
    return await _hold_then_settle(ctx, args)


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=5), start_to_close=_START_TO_CLOSE)
async def recovery_hold_5s(ctx: LeaseContext, args: HoldArgs) -> ToolResult:
    """Holds a 5 s lease until the fault."""
    return await _hold_then_settle(ctx, args)


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=10), start_to_close=_START_TO_CLOSE)
async def recovery_hold_10s(ctx: LeaseContext, args: HoldArgs) -> ToolResult:
    """Holds a 10 s lease until the fault."""
    return await _hold_then_settle(ctx, args)


TOOL_OF_TTL = {2: "recovery_hold_2s", 5: "recovery_hold_5s", 10: "recovery_hold_10s"}
"""The benchmark's tool for each lease TTL (seconds)."""
