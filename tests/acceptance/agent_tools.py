"""Tools of the agent fault tests: the pause/kill matrix's tools (hold points, a downstream that counts
its accepted writes) with a lease of 6 s, which an agent's worker process renewing every 0.5 s keeps on
a loaded machine. Loaded by worker processes with ``AGENTLEASE_TOOL_MODULES=tests.acceptance.agent_tools``."""

from __future__ import annotations

from datetime import timedelta

from agentlease.enums import SideEffectClass
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from tests.acceptance.matrix_tools import MatrixArgs, matrix_attempt

LEASE_TTL = timedelta(seconds=6)
"""Lease TTL (= heartbeat timeout) of these tools."""


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=LEASE_TTL, start_to_close=timedelta(minutes=2))
async def agent_idempotent(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Publish the document ``target`` under the task's idempotency key."""
    return await matrix_attempt(ctx, args)


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=LEASE_TTL, start_to_close=timedelta(minutes=2))
async def agent_fenced(ctx: LeaseContext, args: MatrixArgs) -> ToolResult:
    """Publish the document ``target`` with the claim generation as fencing token."""
    return await matrix_attempt(ctx, args)
