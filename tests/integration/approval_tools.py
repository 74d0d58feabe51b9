"""Tools of the approval tests (bound approvals, approval rules), served in-process
(``tests.integration.approval_tools``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel

from agentlease.enums import SideEffectClass, Stage
from agentlease.records import ApprovalRule
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool

SENT: dict[str, int] = {}
"""Messages each task sent (the effect a second approved execution would repeat)."""

GATES: dict[str, asyncio.Event] = {}


class Message(BaseModel):
    to: str
    body: str


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=2), start_to_close=timedelta(minutes=2))
async def approved_send(ctx: LeaseContext, args: Message) -> ToolResult:
    """Sends; attempt 1 then stops renewing until its gate opens (Temporal times it out meanwhile)."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending to {args.to}")
    SENT[ctx.claim.task_id] = SENT.get(ctx.claim.task_id, 0) + 1
    if ctx.claim.attempts == 1:
        gate = GATES.setdefault(ctx.claim.task_id, asyncio.Event())
        while not gate.is_set():
            try:
                await gate.wait()
            except asyncio.CancelledError:
                continue  # a paused worker notices nothing
    await ctx.advance(Stage.VERIFY, "sent")
    return ToolResult(receipt=ctx.receipt("mail", args.to, "sent"))


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=timedelta(seconds=2),
    approval_ttl=timedelta(milliseconds=1),
)
async def hasty_send(ctx: LeaseContext, args: Message) -> ToolResult:
    """Sends, if an approval of at most 1 ms ago is there: an approval always expires before its claim."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending to {args.to}")
    SENT[ctx.claim.task_id] = SENT.get(ctx.claim.task_id, 0) + 1
    return ToolResult(receipt=ctx.receipt("mail", args.to, "sent"))


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=2))
async def quick_send(ctx: LeaseContext, args: Message) -> ToolResult:
    """Sends once approved, and settles."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending to {args.to}")
    SENT[ctx.claim.task_id] = SENT.get(ctx.claim.task_id, 0) + 1
    return ToolResult(receipt=ctx.receipt("mail", args.to, "sent"))


class Refund(BaseModel):
    order_id: str
    amount_cents: int


REFUNDED: dict[str, int] = {}
"""The amount each task refunded."""


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=timedelta(seconds=2),
    requires_approval=ApprovalRule(field="amount_cents", above=100),
)
async def refund_above_100_approved(ctx: LeaseContext, args: Refund) -> ToolResult:
    """Refunds; a person approves refunds above 100 first."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"refunding {args.order_id}")
    REFUNDED[ctx.claim.task_id] = args.amount_cents
    return ToolResult(receipt=ctx.receipt("refund", args.order_id, "refunded"))


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=timedelta(seconds=2),
    requires_approval=ApprovalRule(approvers=2),
)
async def two_person_send(ctx: LeaseContext, args: Message) -> ToolResult:
    """Sends once two different people approved it, and settles."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending to {args.to}")
    SENT[ctx.claim.task_id] = SENT.get(ctx.claim.task_id, 0) + 1
    return ToolResult(receipt=ctx.receipt("mail", args.to, "sent"))
