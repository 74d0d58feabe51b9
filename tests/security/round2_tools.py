"""Tools of the second round of attack tests (issue 21): an approval-gated mailer, a read-only fetcher
whose name an attacker's input borrows, a tool that echoes whatever secrets it is given into every
way out, and one with a float argument."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import PermanentToolError
from agentlease.records import ApprovalRule, SettlementReceipt
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool

MAILED: list[dict[str, str]] = []
"""Every mail ``gated_mail`` and ``bulk_mail`` sent (in-process workers)."""

STAMPED: list[str] = []
"""Every key ``record_row`` wrote a row for."""


class MailArgs(BaseModel):
    to: str


class NoArgs(BaseModel):
    pass


def _receipt(ctx: LeaseContext, system: str, **details: Any) -> SettlementReceipt:
    return SettlementReceipt(
        external_system=system,
        external_id=f"{ctx.claim.task_id}@{ctx.fencing_token}",
        status="done",
        details=details,
        verified_at=datetime.now(UTC),
    )


@tool(side_effect=SideEffectClass.UNSAFE, lease_ttl=timedelta(seconds=30))
async def gated_mail(ctx: LeaseContext, args: MailArgs) -> ToolResult:
    """Sends a mail; unsafe, so each call waits for an operator's approval."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending to {args.to}")
    MAILED.append({"task_id": ctx.claim.task_id, "to": args.to})
    await ctx.advance(Stage.VERIFY, "accepted")
    return ToolResult(receipt=_receipt(ctx, "mail"))


class BulkMailArgs(BaseModel):
    to: str
    recipients: int


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=timedelta(seconds=30),
    requires_approval=ApprovalRule(field="recipients", above=10),
)
async def bulk_mail(ctx: LeaseContext, args: BulkMailArgs) -> ToolResult:
    """Sends a mail to a list; a person approves a list of more than 10 first."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending to {args.to}")
    MAILED.append({"task_id": ctx.claim.task_id, "to": args.to})
    await ctx.advance(Stage.VERIFY, "accepted")
    return ToolResult(receipt=_receipt(ctx, "mail"))


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=30))
async def fetch_page(ctx: LeaseContext, args: MailArgs) -> ToolResult:
    """Reads; needs no approval (the name an attacker's input borrows)."""
    await ctx.advance(Stage.VERIFY, "read")
    return ToolResult(receipt=_receipt(ctx, "page"))


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=30))
async def record_row(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Writes a row for its key (records it in :data:`STAMPED`)."""
    await ctx.advance(Stage.COMMIT, "writing the row")
    STAMPED.append(ctx.idempotency_key)
    return ToolResult(receipt=_receipt(ctx, "sql:rows"))


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=30))
async def stamp(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Settles at once, writing nothing (the tool an attacker runs under another's name)."""
    await ctx.advance(Stage.VERIFY, "nothing to write")
    return ToolResult(receipt=_receipt(ctx, "stamp"))


class LeakArgs(BaseModel):
    text: str
    data: dict[str, Any] = {}
    fail: bool = False


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=30), max_attempts=1)
async def leak_secrets(ctx: LeaseContext, args: LeakArgs) -> ToolResult:
    """Puts ``text`` and ``data`` everywhere a careless tool would: the stage reason, the output, the
    receipt, and (``fail``) its error."""
    await ctx.advance(Stage.PREFLIGHT, f"calling with {args.text}")
    if args.fail:
        raise PermanentToolError(f"the call failed: {args.text} {args.data}")
    return ToolResult(
        receipt=_receipt(ctx, "leak", note=args.text, **args.data), output={"text": args.text, **args.data}
    )


class AmountArgs(BaseModel):
    amount: float


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=30), max_attempts=1)
async def charge(ctx: LeaseContext, args: AmountArgs) -> ToolResult:
    """Takes a float argument."""
    await ctx.advance(Stage.VERIFY, f"charging {args.amount}")
    return ToolResult(receipt=_receipt(ctx, "charge", amount=args.amount), output={"amount": args.amount})
