"""Tools of the attack tests, with long lease TTLs (nothing here depends on a lease lapsing)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from agentlease.enums import SideEffectClass, Stage
from agentlease.records import SettlementReceipt
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool

SENT: list[dict[str, str]] = []
"""Every mail ``send_mail`` sent (in-process workers): for which task, with which key, and the lease
token its attempt held (so that a test can look for it where it must never appear)."""


class MailArgs(BaseModel):
    to: str


class NoArgs(BaseModel):
    pass


def _receipt(ctx: LeaseContext, system: str) -> SettlementReceipt:
    return SettlementReceipt(
        external_system=system,
        external_id=f"{ctx.claim.task_id}@{ctx.fencing_token}",
        status="present",
        verified_at=datetime.now(UTC),
    )


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(minutes=2))
async def send_mail(ctx: LeaseContext, args: MailArgs) -> ToolResult:
    """Sends a mail (records it in :data:`SENT`)."""
    await ctx.advance(Stage.EXTERNAL_CALL, f"sending to {args.to}")
    SENT.append(
        {
            "task_id": ctx.claim.task_id,
            "to": args.to,
            "idempotency_key": ctx.idempotency_key,
            "lease_token": ctx.claim.lease_token.get_secret_value(),
        }
    )
    await ctx.advance(Stage.VERIFY, "accepted by the server")
    return ToolResult(receipt=_receipt(ctx, "mail"))


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(minutes=2))
async def noop(ctx: LeaseContext, args: NoArgs) -> ToolResult:
    """Does nothing, settles at once."""
    await ctx.advance(Stage.VERIFY, "nothing to do")
    return ToolResult(receipt=_receipt(ctx, "noop"))
