"""Tools of ``bench/readback.py``: the tests' ``lagging_send`` (its probe reads a downstream that shows a message
``lag_ms`` late, with a settle window) and the same tool without the window."""

from __future__ import annotations

from datetime import timedelta

from agentlease.enums import SideEffectClass
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from tests.acceptance.reconciling_tools import LAGGING_TTL, LaggingArgs, lagging_send, messages_received, sent_or_lost

__all__ = ["lagging_send", "unwindowed_send"]


@tool(
    side_effect=SideEffectClass.UNSAFE,
    lease_ttl=LAGGING_TTL,
    start_to_close=timedelta(minutes=2),
    requires_approval=False,
    probe=messages_received,
)
async def unwindowed_send(ctx: LeaseContext, args: LaggingArgs) -> ToolResult:
    """``lagging_send`` without a settle window: its probe's first "not happened" is trusted."""
    return await sent_or_lost(ctx, args)
