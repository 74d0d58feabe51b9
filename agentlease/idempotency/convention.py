"""The HTTP convention between agentlease tools and downstream services: its headers, their parsing and the
request hash, without I/O (``docs/edge.md``, "Over HTTP: the headers")."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from agentlease import limits
from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import MAX_GENERATION, MAX_RESOURCE_KEY_LENGTH, FencingToken, check_resource_key

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
FENCING_TOKEN_HEADER = "Fencing-Token"
FENCING_RESOURCE_HEADER = "Fencing-Resource"
REPLAYED_HEADER = "Idempotent-Replayed"

# The ``error`` of a 409: the key's request still executes (ask again after ``Retry-After``), its outcome is
# unknown (not retried), or the resource has accepted a newer generation.
IN_FLIGHT = "idempotency_key_in_flight"
IN_DOUBT = "idempotency_key_in_doubt"
STALE = "stale_fencing_token"
MISSING_CREDENTIALS = "missing_credentials"
"""The ``error`` of a 401 (and an MCP refusal): the request names no caller, and the service scopes keys to callers."""
ANONYMOUS_REFUSED = (
    "idempotency keys and fences are scoped to the caller: send Authorization or X-API-Key "
    "(or run the service with anonymous=True)"
)

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Methods that need an ``Idempotency-Key``; every other method passes through untouched."""

MAX_KEY_LENGTH = limits.MAX_WIRE_KEY_CHARS
"""Longest idempotency key, in characters."""

_SF_STRING = re.compile(r'^"((?:[\x20\x23-\x5b\x5d-\x7e]|\\["\\])*)"$')
_GENERATION = re.compile(r"^[0-9]{1,19}$")


def downstream_headers(idempotency_key: str, generation: int, resource: str | None = None) -> dict[str, str]:
    """The convention's request headers for one write of a leased tool call.

    Args:
        idempotency_key / generation: the task's key; the claim generation, the fencing token.
        resource: the fenced resource (``Fencing-Resource``); omitted: the service names it.

    Returns:
        ``{"Idempotency-Key": ..., "Fencing-Token": ..., ["Fencing-Resource": ...]}``.
    """
    headers = {IDEMPOTENCY_KEY_HEADER: idempotency_key, FENCING_TOKEN_HEADER: str(generation)}
    if resource is not None:
        headers[FENCING_RESOURCE_HEADER] = resource
    return headers


class HeaderError(ValueError):
    """A convention header is missing or malformed; the middleware answers 400.

    Attributes:
        header / code: the header's name; a short reason (``missing_idempotency_key``, ...).
    """

    def __init__(self, header: str, code: str, detail: str) -> None:
        super().__init__(detail)
        self.header = header
        self.code = code


def _single(values: list[str], header: str) -> str | None:
    if len(values) > 1:
        code = "repeated_" + header.lower().replace("-", "_")
        raise HeaderError(header, code, f"send {header} once, not {len(values)} times")
    return values[0].strip() if values else None


def parse_idempotency_key(values: list[str]) -> str:
    """The idempotency key (bare, or unquoted from a structured-field string) from the ``values`` of every
    ``Idempotency-Key`` header of a request, in order.

    Raises:
        HeaderError: absent, repeated, empty, longer than 255 characters, or not printable ASCII.
    """
    header = IDEMPOTENCY_KEY_HEADER
    raw = _single(values, header)
    if raw is None:
        raise HeaderError(header, "missing_idempotency_key", f"{header} is required on POST, PUT, PATCH and DELETE")
    key = raw
    if raw.startswith('"'):
        quoted = _SF_STRING.match(raw)
        if quoted is None:
            raise HeaderError(header, "invalid_idempotency_key", f"{header} has a malformed quoted string")
        key = re.sub(r"\\(.)", r"\1", quoted.group(1))
    if not limits.is_wire_key(key):
        raise HeaderError(
            header, "invalid_idempotency_key", f"{header} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters"
        )
    return key


def parse_fencing_token(values: list[str]) -> int | None:
    """The generation from the values of every ``Fencing-Token`` header, or ``None`` when absent.

    Raises:
        HeaderError: repeated, or not a decimal integer from 0 to 2**63 - 1 (no sign, no spaces inside).
    """
    header = FENCING_TOKEN_HEADER
    raw = _single(values, header)
    if raw is None:
        return None
    if not _GENERATION.match(raw) or int(raw) > MAX_GENERATION:
        raise HeaderError(
            header, "invalid_fencing_token", f"{header} must be a decimal integer from 0 to {MAX_GENERATION}"
        )
    return int(raw)


_SIGNED = re.compile(r"^[0-9]{1,19}(\.[A-Za-z0-9_-]{1,128})?$")


def raw_fencing_token(values: list[str]) -> str | None:
    """The ``Fencing-Token`` as sent: a generation or a signed ``<generation>.<signature>``; ``None`` when absent.

    Raises:
        HeaderError: repeated, or neither form (the generation at most 2**63 - 1).
    """
    header = FENCING_TOKEN_HEADER
    raw = _single(values, header)
    if raw is None:
        return None
    if not _SIGNED.match(raw) or int(raw.partition(".")[0]) > MAX_GENERATION:
        raise HeaderError(
            header,
            "invalid_fencing_token",
            f"{header} must be a decimal integer from 0 to {MAX_GENERATION}, or <generation>.<signature>",
        )
    return raw


def parse_fencing_resource(values: list[str]) -> str | None:
    """The resource from the values of every ``Fencing-Resource`` header, or ``None`` when absent.

    Raises:
        HeaderError: repeated, empty or longer than 400 characters.
    """
    header = FENCING_RESOURCE_HEADER
    raw = _single(values, header)
    if raw is None:
        return None
    try:
        return check_resource_key(raw)
    except ValueError as exc:
        raise HeaderError(header, "invalid_fencing_resource", str(exc)) from None


def caller_of(headers: Mapping[str, str]) -> str:
    """The caller a key is scoped to: the ``Authorization`` (or else ``X-API-Key``) header's value, ``""`` with
    neither. An ``Authorization`` scheme is case-insensitive and the spaces around it do not count
    (``Bearer x`` and ``bearer  x`` are one caller); the credentials compare exactly."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, credentials = authorization.strip().partition(" ")
        return f"{scheme.lower()} {credentials.strip()}" if credentials.strip() else scheme.lower()
    return headers.get("x-api-key") or ""


def scoped_key(caller: str, key: str, *, limit: int = MAX_KEY_LENGTH) -> str:
    """The stored form of ``key`` for ``caller``: ``<16 hex of the caller's digest>:<key>``, or a digest
    of both when that would be over ``limit`` characters (default the store's key column)."""
    tag = hashlib.sha256(caller.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    scoped = f"{tag}:{key}"
    if len(scoped) <= limit:
        return scoped
    return "sha256:" + hashlib.sha256(f"{caller}\n{key}".encode("utf-8", "surrogatepass")).hexdigest()


def scoped_fence(caller: str, fence: FencingToken | None) -> FencingToken | None:
    """``fence`` on ``caller``'s own copy of its resource (:func:`scoped_key`): a caller moves and pins only its
    own fences, as it reads back only its own keys (``docs/security-downstream.md``)."""
    if fence is None:
        return None
    return FencingToken(scoped_key(caller, fence.resource_key, limit=MAX_RESOURCE_KEY_LENGTH), fence.generation)


def stale_facts(exc: StaleFencingTokenError, named: str | None) -> dict[str, Any]:
    """A stale-token refusal's ``detail``, ``resource``, ``generation`` and ``current_generation``, naming the
    resource as its client named it (``named``; ``None``: as the fence check saw it)."""
    shown = StaleFencingTokenError(named or exc.resource_key, exc.generation, exc.current_generation)
    return {
        "detail": str(shown),
        "resource": shown.resource_key,
        "generation": shown.generation,
        "current_generation": shown.current_generation,
    }


def request_hash(method: str, path: str, query: bytes, body: bytes) -> str:
    """SHA-256 (hex) of a request's method, path, query string and body, each length-prefixed (not the fencing
    headers: a newer attempt matches). One key with another hash is a misuse of the key (422)."""
    digest = hashlib.sha256()
    # surrogatepass: a server that does not decode paths strictly may pass a lone surrogate on
    for part in (method.upper().encode("ascii"), path.encode("utf-8", "surrogatepass"), query, body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
