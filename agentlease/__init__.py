"""agentlease: leased agent tool calls on Temporal.

Claim generations as fencing tokens, idempotency keys stable across attempts, settlement receipts
after readback, stage-aware retries and a recovery policy, human decisions, an evidence trail.

What a tool author and an operator's script need is importable from here::

    from agentlease import LeaseContext, SideEffectClass, Stage, ToolResult, lease, leased, tool

The names load on first use, so importing ``agentlease`` stays cheap and the package's own modules
never import this facade (they import each other directly).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.4.0"

if TYPE_CHECKING:
    from agentlease import lease
    from agentlease.enums import ErrorClass, ProbeAnswer, RecoveryAction, RunState, SideEffectClass, Stage, TaskStatus
    from agentlease.errors import (
        AgentLeaseError,
        AmbiguousSideEffectError,
        ApprovalRefusedError,
        ClockBehindError,
        ConfigurationError,
        CredentialToolError,
        LeaseHeldError,
        LeaseLostError,
        LedgerUnavailableError,
        PermanentToolError,
        RetryableToolError,
        StaleFencingTokenError,
        TaskClosedError,
        TaskNotFoundError,
        ToolError,
        raise_for_status,
    )
    from agentlease.fencing import FencingToken, advance_fence, create_fence_table, fenced_write, read_fence
    from agentlease.idempotency import IdempotencyMiddleware, IdempotencyStore
    from agentlease.lease import NotInLeaseError
    from agentlease.ledger.store import Ledger
    from agentlease.plugin import AgentLeasePlugin
    from agentlease.records import Claim, LeaseEvent, SettlementReceipt, StoredReceipt, TaskRecord
    from agentlease.settings import AgentLeaseSettings
    from agentlease.tools._context import LeaseContext
    from agentlease.tools._declaration import ToolResult, ToolSpec, tool
    from agentlease.tools._probe import ProbeQuery, ProbeResult
    from agentlease.tools._wrap import leased

_EXPORTS: dict[str, str] = {
    # writing a tool
    "tool": "agentlease.tools._declaration",
    "leased": "agentlease.tools._wrap",
    "lease": "agentlease.lease",
    "ToolResult": "agentlease.tools._declaration",
    "ToolSpec": "agentlease.tools._declaration",
    "LeaseContext": "agentlease.tools._context",
    "ProbeQuery": "agentlease.tools._probe",
    "ProbeResult": "agentlease.tools._probe",
    "ProbeAnswer": "agentlease.enums",
    "SettlementReceipt": "agentlease.records",
    "Stage": "agentlease.enums",
    "SideEffectClass": "agentlease.enums",
    "ToolError": "agentlease.errors",
    "RetryableToolError": "agentlease.errors",
    "PermanentToolError": "agentlease.errors",
    "CredentialToolError": "agentlease.errors",
    "AmbiguousSideEffectError": "agentlease.errors",
    "LeaseLostError": "agentlease.errors",
    "NotInLeaseError": "agentlease.lease",
    "raise_for_status": "agentlease.errors",
    # fencing at a downstream
    "FencingToken": "agentlease.fencing",
    "advance_fence": "agentlease.fencing",
    "create_fence_table": "agentlease.fencing",
    "fenced_write": "agentlease.fencing",
    "read_fence": "agentlease.fencing",
    "StaleFencingTokenError": "agentlease.errors",
    "IdempotencyMiddleware": "agentlease.idempotency",
    "IdempotencyStore": "agentlease.idempotency",
    # a worker
    "AgentLeasePlugin": "agentlease.plugin",
    # an operator's script
    "Ledger": "agentlease.ledger.store",
    "AgentLeaseSettings": "agentlease.settings",
    "TaskStatus": "agentlease.enums",
    "RunState": "agentlease.enums",
    "ErrorClass": "agentlease.enums",
    "RecoveryAction": "agentlease.enums",
    "Claim": "agentlease.records",
    "LeaseEvent": "agentlease.records",
    "StoredReceipt": "agentlease.records",
    "TaskRecord": "agentlease.records",
    "AgentLeaseError": "agentlease.errors",
    "ConfigurationError": "agentlease.errors",
    "LedgerUnavailableError": "agentlease.errors",
    "ClockBehindError": "agentlease.errors",
    "LeaseHeldError": "agentlease.errors",
    "TaskClosedError": "agentlease.errors",
    "ApprovalRefusedError": "agentlease.errors",
    "TaskNotFoundError": "agentlease.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentlease' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if module == f"{__name__}.{name}" else getattr(loaded, name)  # a module export: the module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
