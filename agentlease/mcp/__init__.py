"""Leased MCP tool calls (extra ``agentlease[mcp]``, ``docs/mcp.md``): :func:`mcp_tools` declares a server's tools,
whose calls carry key, fencing token, resource and lease expiry in ``_meta``; :class:`LeaseGuard` enforces them.
"""

from __future__ import annotations

try:
    import mcp as _mcp  # noqa: F401 - the guard: this package needs the official SDK
except ImportError as _import_error:  # pragma: no cover - depends on the installed extras
    raise ImportError("agentlease.mcp needs the 'mcp' extra: pip install 'agentlease[mcp]'") from _import_error

from agentlease.idempotency.edge import effect_transaction
from agentlease.mcp._client import MCPServer, list_server_tools
from agentlease.mcp._convention import (
    EXTENSION,
    FENCING_TOKEN_META,
    IDEMPOTENCY_KEY_META,
    LEASE_EXPIRES_AT_META,
    REFUSAL_CODE,
    REPLAYED_META,
    RESOURCE_META,
    Refusal,
)
from agentlease.mcp._guard import READBACK_TOOL, GuardedCall, LeaseGuard, current_call
from agentlease.mcp._listing import record_server_tools
from agentlease.mcp._policy import ToolPolicy
from agentlease.mcp._tools import check_tools, guess_side_effect, mcp_tools

__all__ = [
    "EXTENSION",
    "FENCING_TOKEN_META",
    "IDEMPOTENCY_KEY_META",
    "LEASE_EXPIRES_AT_META",
    "READBACK_TOOL",
    "REFUSAL_CODE",
    "REPLAYED_META",
    "RESOURCE_META",
    "GuardedCall",
    "LeaseGuard",
    "MCPServer",
    "Refusal",
    "ToolPolicy",
    "check_tools",
    "current_call",
    "effect_transaction",
    "guess_side_effect",
    "list_server_tools",
    "mcp_tools",
    "record_server_tools",
]
