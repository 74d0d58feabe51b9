"""Idempotency keys and fencing tokens at downstream services (HTTP convention + ASGI middleware).

- :mod:`agentlease.idempotency.middleware`: the middleware, and the convention it enforces
  (header names, how the fenced resource is identified, the answers and their order).
- :mod:`agentlease.idempotency.convention`: header parsing and request hashing (pure).
- :mod:`agentlease.idempotency.store`: the ``idempotency_keys`` table, retention and lock timeout.
"""

from agentlease.idempotency.convention import (
    FENCING_RESOURCE_HEADER,
    FENCING_TOKEN_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    REPLAYED_HEADER,
)
from agentlease.idempotency.middleware import IdempotencyMiddleware, request_path
from agentlease.idempotency.store import DEFAULT_LOCK_TIMEOUT, DEFAULT_RETENTION, IdempotencyStore

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_RETENTION",
    "FENCING_RESOURCE_HEADER",
    "FENCING_TOKEN_HEADER",
    "IDEMPOTENCY_KEY_HEADER",
    "REPLAYED_HEADER",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "request_path",
]
