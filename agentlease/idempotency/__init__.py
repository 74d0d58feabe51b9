"""Idempotency keys and fencing tokens at downstream services (``docs/edge.md``); the ASGI middleware needs the
extra ``agentlease[middleware]``. Names load on first use: a worker never imports the web framework."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentlease._lazy import exports

if TYPE_CHECKING:
    from agentlease.idempotency.convention import (
        FENCING_RESOURCE_HEADER,
        FENCING_TOKEN_HEADER,
        IDEMPOTENCY_KEY_HEADER,
        REPLAYED_HEADER,
    )
    from agentlease.idempotency.edge import GuardedCall, current_call, effect_transaction
    from agentlease.idempotency.middleware import IdempotencyMiddleware, request_path
    from agentlease.idempotency.store import DEFAULT_LOCK_TIMEOUT, DEFAULT_RETENTION, IdempotencyStore, KeyStatus

_MODULES = {
    "convention": ("FENCING_RESOURCE_HEADER", "FENCING_TOKEN_HEADER", "IDEMPOTENCY_KEY_HEADER", "REPLAYED_HEADER"),
    "edge": ("GuardedCall", "current_call", "effect_transaction"),
    "middleware": ("IdempotencyMiddleware", "request_path"),
    "store": ("DEFAULT_LOCK_TIMEOUT", "DEFAULT_RETENTION", "IdempotencyStore", "KeyStatus"),
}
_EXPORTS = {name: f"{__name__}.{module}" for module, names in _MODULES.items() for name in names}
__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_RETENTION",
    "FENCING_RESOURCE_HEADER",
    "FENCING_TOKEN_HEADER",
    "IDEMPOTENCY_KEY_HEADER",
    "REPLAYED_HEADER",
    "GuardedCall",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "KeyStatus",
    "current_call",
    "effect_transaction",
    "request_path",
]
__getattr__, __dir__ = exports(__name__, _EXPORTS)
