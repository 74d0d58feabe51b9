"""The ``_meta`` convention of a leased MCP ``tools/call`` (``docs/mcp.md``, "The _meta convention"): pure
functions, no ``mcp`` import, shared by the client side (:mod:`agentlease.mcp._call`) and the guard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from agentlease.idempotency.convention import (
    FENCING_RESOURCE_HEADER,
    FENCING_TOKEN_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    HeaderError,
    parse_fencing_resource,
    parse_idempotency_key,
    raw_fencing_token,
)

NAMESPACE = "io.agentlease/"
"""The prefix of every ``_meta`` key of the convention."""
IDEMPOTENCY_KEY_META = f"{NAMESPACE}idempotency-key"
FENCING_TOKEN_META = f"{NAMESPACE}fencing-token"
RESOURCE_META = f"{NAMESPACE}resource"
LEASE_EXPIRES_AT_META = f"{NAMESPACE}lease-expires-at"
REPLAYED_META = f"{NAMESPACE}replayed"
"""On a result: ``true`` when the server replayed the result stored under the key."""

READBACK_TOOL = "agentlease_was_applied"
"""The default name of the readback tool a guard serves: agentlease's own, never declared for the model from a
recorded listing (a guard serving it under another name: name the model's tools with ``tools=``)."""

EXTENSION = "io.agentlease/lease"
"""The identifier a guarded server advertises under ``capabilities.extensions`` (with its settings:
``tools``, ``readback_tool``, ``require_key``, ``require_fencing_token``)."""

REFUSAL_CODE = -32060
"""The JSON-RPC error code of every refusal of a guarded server (an implementation-defined server error)."""

_HEADER_OF = {
    IDEMPOTENCY_KEY_META: (IDEMPOTENCY_KEY_HEADER, parse_idempotency_key),
    FENCING_TOKEN_META: (FENCING_TOKEN_HEADER, raw_fencing_token),
    RESOURCE_META: (FENCING_RESOURCE_HEADER, parse_fencing_resource),
}
"""The HTTP convention's header and parser of each ``_meta`` entry they share (one home for the rules)."""


class Refusal(StrEnum):
    """Why a guarded server refused a ``tools/call`` (the ``error`` of the refusal's ``data``)."""

    MISSING_KEY = "missing_idempotency_key"
    """No key, and the server requires one. Not retried: the client is misconfigured."""
    INVALID_KEY = "invalid_idempotency_key"
    """A key that is not 1 to 255 printable ASCII characters."""
    MISSING_TOKEN = "missing_fencing_token"
    """No fencing token, and the server requires one."""
    INVALID_TOKEN = "invalid_fencing_token"
    """Not a generation nor a signed token, or a signature that does not verify for the resource."""
    INVALID_RESOURCE = "invalid_fencing_resource"
    """A resource that is not 1 to 400 characters."""
    INVALID_EXPIRY = "invalid_lease_expires_at"
    """A lease expiry that is not an RFC 3339 timestamp."""
    LEASE_EXPIRED = "lease_expired"
    """The lease expiry sent passed more than a moment ago by the server's clock: the holder's lease lapsed (G2)."""
    KEY_REUSED = "idempotency_key_reused"
    """The key was used for a call of another tool or with other arguments."""
    IN_FLIGHT = "idempotency_key_in_flight"
    """A call with the key is still running; try again later (``retry_after_ms``)."""
    IN_DOUBT = "idempotency_key_in_doubt"
    """A call with the key started and its outcome is unknown: it may have taken effect; not retried."""
    STALE_TOKEN = "stale_fencing_token"
    """The resource has accepted a newer generation (``generation``, ``current_generation``)."""
    MISSING_CREDENTIALS = "missing_credentials"
    """Over HTTP, a call that names no caller (no ``Authorization`` nor ``X-API-Key``) where the server scopes keys
    to callers and does not accept anonymous ones."""


class MetaError(ValueError):
    """A convention entry (``key``) is missing or malformed, refused with ``refusal``."""

    def __init__(self, refusal: Refusal, key: str, detail: str) -> None:
        super().__init__(detail)
        self.refusal = refusal
        self.key = key


@dataclass(frozen=True)
class LeaseMeta:
    """The convention's entries of one request, checked (``None`` when absent)."""

    idempotency_key: str | None
    fencing_token: str | None
    resource: str | None
    lease_expires_at: datetime | None


def default_resource(tool: str, idempotency_key: str) -> str:
    """The fenced resource both sides name a call by unless configured otherwise: ``mcp/<tool>/<key>``."""
    return f"mcp/{tool}/{idempotency_key}"


def lease_meta(
    idempotency_key: str, fencing_token: int | str, resource: str, lease_expires_at: datetime
) -> dict[str, str]:
    """The convention's ``_meta`` entries of one leased ``tools/call`` (``ValueError``: a naive expiry)."""
    if lease_expires_at.tzinfo is None:
        raise ValueError("lease_expires_at must be timezone-aware")
    expires = lease_expires_at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {
        IDEMPOTENCY_KEY_META: idempotency_key,
        FENCING_TOKEN_META: str(fencing_token),
        RESOURCE_META: resource,
        LEASE_EXPIRES_AT_META: expires,
    }


def _text(meta: Mapping[str, Any], key: str) -> str | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, str):  # the convention's entries are strings, a generation too
        raise MetaError(_INVALID[key], key, f"{key} must be a string")
    return value


_INVALID = {
    IDEMPOTENCY_KEY_META: Refusal.INVALID_KEY,
    FENCING_TOKEN_META: Refusal.INVALID_TOKEN,
    RESOURCE_META: Refusal.INVALID_RESOURCE,
    LEASE_EXPIRES_AT_META: Refusal.INVALID_EXPIRY,
}


def read_lease_meta(meta: Mapping[str, Any] | None) -> LeaseMeta:
    """The convention's entries of a request's ``_meta``, each checked (``MetaError``: a malformed one)."""
    meta = meta or {}
    found = {key: _text(meta, key) for key in _INVALID}
    for key, (header, parse) in _HEADER_OF.items():
        value = found[key]
        try:
            found[key] = None if value is None else parse([value])
        except HeaderError as exc:
            text = str(exc)
            raise MetaError(
                Refusal(exc.code), key, text.replace(header, key) if header in text else f"{key}: {text}"
            ) from None
    expires = found[LEASE_EXPIRES_AT_META]
    expires_at = None
    if expires is not None:
        try:
            expires_at = datetime.fromisoformat(expires)
        except ValueError:
            expires_at = None
        if expires_at is None or expires_at.tzinfo is None:
            raise MetaError(
                Refusal.INVALID_EXPIRY, LEASE_EXPIRES_AT_META, f"{LEASE_EXPIRES_AT_META} must be an RFC 3339 time"
            )
    return LeaseMeta(found[IDEMPOTENCY_KEY_META], found[FENCING_TOKEN_META], found[RESOURCE_META], expires_at)


def refusal_data(refusal: Refusal, detail: str, **facts: Any) -> dict[str, Any]:
    """The ``data`` of a refusal: ``{"error": <reason>, "detail": <one line>, ...facts}``."""
    return {"error": refusal.value, "detail": detail, **facts}


def refusal_of(code: int, data: Any) -> Refusal | None:
    """The reason of an MCP error a guarded server answered, ``None`` for any other error."""
    if code != REFUSAL_CODE or not isinstance(data, Mapping):
        return None
    try:
        return Refusal(str(data.get("error")))
    except ValueError:
        return None
