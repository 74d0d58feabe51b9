"""The two sides of the overhead benchmark: the same three stages, with and without a lease.

- :func:`plain_stages`: a plain Temporal activity that heartbeats the stage details at
  ``preflight``, ``external_call`` and ``commit`` and returns; no ledger.
- :data:`BENCH_TOOL`: a declared tool that calls ``ctx.advance`` for the same three stages and
  returns a :class:`ToolResult` with a :class:`SettlementReceipt`; run through
  :class:`agentlease.tools._leased.LeasedActivities` it claims, renews three times and settles in the ledger.

Neither talks to an external system: the benchmark measures what the lease adds to a tool call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel
from temporalio import activity

from agentlease.enums import SideEffectClass, Stage, TaskStatus
from agentlease.records import SettlementReceipt, ToolCall, ToolOutcome
from agentlease.tools._context import LeaseContext, LeaseHeartbeat
from agentlease.tools._declaration import ToolResult, tool

BENCH_TOOL_NAME = "bench_stages"
PLAIN_ACTIVITY = "bench_plain_stages"
LEASE_TTL = timedelta(seconds=30)
"""Lease TTL of the bench tool, hence the heartbeat timeout of both sides. Default 30s."""

STAGES = (
    (Stage.PREFLIGHT, "checking the call's arguments"),
    (Stage.EXTERNAL_CALL, "calling the (simulated) external system"),
    (Stage.COMMIT, "committing the (simulated) result"),
)


class BenchArgs(BaseModel):
    index: int = 0


def _receipt(call_key: str, index: int) -> SettlementReceipt:
    return SettlementReceipt(
        external_system="bench",
        external_id=call_key,
        status="done",
        details={"index": index},
        verified_at=datetime.now(UTC),
    )


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=LEASE_TTL, name=BENCH_TOOL_NAME)
async def bench_stages(ctx: LeaseContext, args: BenchArgs) -> ToolResult:
    """The leased side: three recorded stages, then a receipt."""
    for stage, reason in STAGES:
        await ctx.advance(stage, reason)
    return ToolResult(receipt=_receipt(ctx.idempotency_key, args.index), output={"index": args.index})


BENCH_TOOL = bench_stages


def _details(call: ToolCall, stage: Stage, reason: str) -> LeaseHeartbeat:
    """The heartbeat details a plain activity sends: the shape a leased call heartbeats."""
    ttl = activity.info().heartbeat_timeout or LEASE_TTL
    return LeaseHeartbeat(
        task_id=call.task_id,
        claim_generation=1,
        stage=stage,
        reason=reason,
        lease_expires_at=datetime.now(UTC) + ttl,
    )


def _settled(call: ToolCall) -> ToolOutcome:
    """A plain activity's outcome: the shape a leased call returns."""
    index = int(call.arguments.get("index", 0))
    return ToolOutcome(
        task_id=call.task_id,
        status=TaskStatus.SETTLED,
        stage=Stage.SETTLED,
        claim_generation=1,
        attempts=1,
        receipt=_receipt(call.idempotency_key, index),
        result={"index": index},
    )


@activity.defn(name=PLAIN_ACTIVITY)
async def plain_stages(call: ToolCall) -> ToolOutcome:
    """The plain side: the same three stages as heartbeats only, then the same outcome shape."""
    for stage, reason in STAGES:
        activity.heartbeat(_details(call, stage, reason))
    return _settled(call)


READ_TOOL_NAME = "bench_read"
PLAIN_READ_ACTIVITY = "bench_plain_read"
READ_STAGE = (Stage.EXTERNAL_CALL, "reading the (simulated) source")


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=LEASE_TTL, name=READ_TOOL_NAME)
async def bench_read(ctx: LeaseContext, args: BenchArgs) -> ToolResult:
    """The leased side of ``bench.runs``: a fast read-only tool, one recorded stage, then a receipt."""
    await ctx.advance(*READ_STAGE)
    return ToolResult(receipt=_receipt(ctx.idempotency_key, args.index), output={"index": args.index})


READ_TOOL = bench_read


@activity.defn(name=PLAIN_READ_ACTIVITY)
async def plain_read(call: ToolCall) -> ToolOutcome:
    """The plain side of ``bench.runs``: the same stage as one heartbeat, then the same outcome shape."""
    activity.heartbeat(_details(call, *READ_STAGE))
    return _settled(call)


HOLD_TOOL_NAME = "bench_hold"
PLAIN_HOLD_ACTIVITY = "bench_plain_hold"
HOLD_STAGE = (Stage.EXTERNAL_CALL, "waiting for the (simulated) slow system")


class Holding:
    """What the long calls of ``bench.memory`` wait for, in their worker process: released, and how many run."""

    released = asyncio.Event()
    in_flight = 0

    @classmethod
    async def hold(cls, keep_alive: Callable[[], Awaitable[None] | None]) -> None:
        """Wait until released, calling ``keep_alive`` (a renewal, a heartbeat) every TTL/3."""
        cls.in_flight += 1
        try:
            while not cls.released.is_set():
                try:
                    await asyncio.wait_for(cls.released.wait(), timeout=LEASE_TTL.total_seconds() / 3)
                except TimeoutError:
                    pending = keep_alive()
                    if pending is not None:
                        await pending
        finally:
            cls.in_flight -= 1


@tool(
    side_effect=SideEffectClass.READ_ONLY,
    lease_ttl=LEASE_TTL,
    start_to_close=timedelta(minutes=30),
    name=HOLD_TOOL_NAME,
)
async def bench_hold(ctx: LeaseContext, args: BenchArgs) -> ToolResult:
    """The leased side of ``bench.memory``: enter a stage, then hold (renewing) until released."""
    await ctx.advance(*HOLD_STAGE)
    await Holding.hold(lambda: ctx.renew("still waiting for the (simulated) slow system"))
    return ToolResult(receipt=_receipt(ctx.idempotency_key, args.index), output={"index": args.index})


HOLD_TOOL = bench_hold


@activity.defn(name=PLAIN_HOLD_ACTIVITY)
async def plain_hold(call: ToolCall) -> ToolOutcome:
    """The plain side of ``bench.memory``: heartbeat the same stage, then hold (heartbeating) until released."""
    details = _details(call, *HOLD_STAGE)
    activity.heartbeat(details)
    await Holding.hold(lambda: activity.heartbeat(details))
    return _settled(call)
