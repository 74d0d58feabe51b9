"""agentlease: leased agent tool calls on Temporal (``docs/README.md``).

What a tool author and a worker need is importable from here, loaded on first use::

    from agentlease import AgentLeasePlugin, LeaseContext, SideEffectClass, Stage, ToolResult, lease, leased, tool
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentlease._lazy import exports

__version__ = "0.4.0"

if TYPE_CHECKING:
    from agentlease import lease
    from agentlease.enums import ProbeAnswer, SideEffectClass, Stage, TaskStatus
    from agentlease.errors import (
        AgentLeaseError,
        AmbiguousSideEffectError,
        CredentialToolError,
        LeaseLostError,
        PermanentToolError,
        RetryableToolError,
        ToolError,
        raise_for_status,
    )
    from agentlease.lease import NotInLeaseError
    from agentlease.ledger.store import Ledger
    from agentlease.plugin import AgentLeasePlugin
    from agentlease.records import SettlementReceipt
    from agentlease.settings import AgentLeaseSettings
    from agentlease.tools._context import LeaseContext
    from agentlease.tools._declaration import ToolResult, tool
    from agentlease.tools._fenced_http import FencedClient
    from agentlease.tools._probe import ProbeQuery, ProbeResult
    from agentlease.tools._wrap import leased

_EXPORTS: dict[str, str] = {
    # writing a tool
    "tool": "agentlease.tools._declaration",
    "leased": "agentlease.tools._wrap",
    "lease": "agentlease.lease",
    "FencedClient": "agentlease.tools._fenced_http",
    "ToolResult": "agentlease.tools._declaration",
    "LeaseContext": "agentlease.tools._context",
    "ProbeQuery": "agentlease.tools._probe",
    "ProbeResult": "agentlease.tools._probe",
    "ProbeAnswer": "agentlease.enums",
    "SettlementReceipt": "agentlease.records",
    "Stage": "agentlease.enums",
    "SideEffectClass": "agentlease.enums",
    "NotInLeaseError": "agentlease.lease",
    "raise_for_status": "agentlease.errors",
    # how a tool says an attempt ended
    "ToolError": "agentlease.errors",
    "RetryableToolError": "agentlease.errors",
    "PermanentToolError": "agentlease.errors",
    "CredentialToolError": "agentlease.errors",
    "AmbiguousSideEffectError": "agentlease.errors",
    # a worker, an operator's script
    "AgentLeasePlugin": "agentlease.plugin",
    "AgentLeaseSettings": "agentlease.settings",
    "Ledger": "agentlease.ledger.store",
    "TaskStatus": "agentlease.enums",
    "AgentLeaseError": "agentlease.errors",
    "LeaseLostError": "agentlease.errors",
}
"""The 25 names of the facade; the rest are on the faces of their rooms: ``agentlease.errors``,
``agentlease.enums``, ``agentlease.records``, ``agentlease.fencing`` (fenced writes at a downstream),
``agentlease.idempotency`` (the downstream's guards), ``agentlease.tools``, ``agentlease.workflow``,
``agentlease.recovery``, ``agentlease.mcp`` and the framework adapters."""

__all__ = ["__version__", *_EXPORTS]
__getattr__, __dir__ = exports(__name__, _EXPORTS)
