"""A tool of the security tests that declares the one setting it needs and takes its credential from
its own secrets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentlease.enums import SideEffectClass
from agentlease.records import SettlementReceipt
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from tests.security.edge_tools import NameArgs


@tool(
    side_effect=SideEffectClass.READ_ONLY,
    lease_ttl=timedelta(seconds=30),
    max_attempts=1,
    settings=("publish_base_url",),
)
async def scoped_client(ctx: LeaseContext, args: NameArgs) -> ToolResult:
    """A tool that declares the one setting it needs and takes its credential from ``ctx.secrets``."""
    token = ctx.secrets.get("api_token")
    base = ctx.settings.publish_base_url
    other = str(getattr(ctx.settings, args.name)) if args.name else ""
    return ToolResult(
        receipt=SettlementReceipt(
            external_system="scoped",
            external_id=f"{base}",
            status="authorized" if token else "anonymous",
            details={"token_chars": len(token)},
            verified_at=datetime.now(UTC),
        ),
        output={"base": base, "other": other},
    )
