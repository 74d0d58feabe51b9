"""Idempotency keys and fencing tokens at downstream services (HTTP convention + ASGI middleware).

- :mod:`agentlease.idempotency.middleware`: the middleware (extra ``agentlease[middleware]``), and the
  convention it enforces (header names, how the fenced resource is identified, the answers and their order).
- :mod:`agentlease.idempotency.convention`: header parsing and request hashing (pure).
- :mod:`agentlease.idempotency.edge`: what a guarded handler sees of its call and how its key ends
  (:func:`effect_transaction` commits an effect and its key together), shared with the MCP guard.
- :mod:`agentlease.idempotency.store`: the ``idempotency_keys`` table, retention and lock timeout.

The names load on first use, so a worker's lease path never imports the middleware's web framework.
"""

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

_CONVENTION = "agentlease.idempotency.convention"
_EDGE = "agentlease.idempotency.edge"
_MIDDLEWARE = "agentlease.idempotency.middleware"
_STORE = "agentlease.idempotency.store"
_EXPORTS = {
    "FENCING_RESOURCE_HEADER": _CONVENTION,
    "FENCING_TOKEN_HEADER": _CONVENTION,
    "IDEMPOTENCY_KEY_HEADER": _CONVENTION,
    "REPLAYED_HEADER": _CONVENTION,
    "GuardedCall": _EDGE,
    "current_call": _EDGE,
    "effect_transaction": _EDGE,
    "IdempotencyMiddleware": _MIDDLEWARE,
    "request_path": _MIDDLEWARE,
    "DEFAULT_LOCK_TIMEOUT": _STORE,
    "DEFAULT_RETENTION": _STORE,
    "IdempotencyStore": _STORE,
    "KeyStatus": _STORE,
}
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
