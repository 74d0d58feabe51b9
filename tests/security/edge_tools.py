"""Tools of the security tests: one that echoes a marker into its output and receipt, and ones that
reach for settings and secrets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from agentlease.enums import SideEffectClass, Stage
from agentlease.records import SettlementReceipt
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool


class EchoArgs(BaseModel):
    text: str


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=30))
async def echo_marker(ctx: LeaseContext, args: EchoArgs) -> ToolResult:
    """Echo ``text`` into the reason, the output and the receipt."""
    await ctx.advance(Stage.PREFLIGHT, f"echoing {args.text}")
    return ToolResult(
        receipt=SettlementReceipt(
            external_system="echo", external_id=args.text, status="echoed", verified_at=datetime.now(UTC)
        ),
        output={"echo": args.text},
    )


class NameArgs(BaseModel):
    name: str


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=30), max_attempts=1)
async def read_setting(ctx: LeaseContext, args: NameArgs) -> ToolResult:
    """Read any setting by name (what a compromised or careless tool would do)."""
    value = str(getattr(ctx.settings, args.name))
    return ToolResult(
        receipt=SettlementReceipt(
            external_system="settings", external_id=args.name, status="read", verified_at=datetime.now(UTC)
        ),
        output={"value": value},
    )
