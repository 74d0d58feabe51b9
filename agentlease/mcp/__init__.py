"""Leased MCP tool calls (extra ``agentlease[mcp]``): the client side and the server side (``docs/mcp.md``).

Client side: declare an MCP server's tools as agentlease tools; each call runs as a leased activity
whose idempotency key, fencing token, resource and lease expiry travel in the request's ``_meta``
under ``io.agentlease/``::

    from agentlease.mcp import MCPServer, ToolPolicy, mcp_tools

    crm = MCPServer.stdio("crm", "python", ["-m", "crm_server"])
    CRM_TOOLS = mcp_tools(
        crm,
        default=ToolPolicy(side_effect="read_only", lease_ttl=timedelta(seconds=10)),
        tools={"create_contact": ToolPolicy(side_effect="fenced", args=CreateContact),
               "find_contact": ToolPolicy(args=FindContact)},
    )

The tools go to ``AgentLeasePlugin(tools=[*CRM_TOOLS])``, ``call_tool``, ``leased_tool`` and
``LeasedToolset``. Server side: :class:`LeaseGuard` makes an ``MCPServer`` (the SDK's) enforce what
the client sends: a repeated key replays the stored result, an older fencing token is refused, a
missing key is refused; a tool commits its effect with its key in ``effect_transaction``, and a call whose
outcome the guard cannot know is held in doubt, never run twice (``docs/edge.md``).
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
]
