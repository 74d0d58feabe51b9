"""Who may read the web view: the ``Host`` check (DNS rebinding), the operator token, and the security headers
of every answer (a CSP with no script). ``docs/security-operations.md`` ("The web view")."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import socket
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""Host names every view answers to."""

SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; "
        b"frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_names(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` names a view bound to ``bind_host`` answers to (lower case, no port): loopback's, this
    machine's own names (``socket.gethostname()``, ``socket.getfqdn()``), ``bind_host`` unless a wildcard, and
    ``extra``."""
    names = set(LOOPBACK_NAMES) | {name.lower() for name in extra}
    names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    if bind_host not in ("0.0.0.0", "::", ""):
        names.add(bind_host.lower().strip("[]"))
    return frozenset(names)


def _hostname(header: str) -> str:
    """``Host`` without its port, lower case (``[::1]:8080`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def token_matches(authorization: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``: ``Bearer TOKEN``, or Basic with it as password."""
    scheme, _, credentials = authorization.strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        given = credentials
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(credentials, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    else:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8"))


class UiGuard:
    """Pure ASGI middleware around ``app``: the ``Host`` must be one of ``allowed_hosts`` (:func:`host_names`), then
    the ``token`` (``None``: none, loopback only), then the security headers on every answer."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str], token: str | None = None) -> None:
        self.app = app
        self.allowed_hosts = frozenset(allowed_hosts)
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        headers = Headers(scope=scope)
        answer: ASGIApp = self.app
        if _hostname(headers.get("host", "")) not in self.allowed_hosts:
            answer = PlainTextResponse("this view does not answer to that host name", status_code=421)
        elif self.token is not None and not token_matches(headers.get("authorization", ""), self.token):
            challenge = {"WWW-Authenticate": 'Basic realm="agentlease"'}
            answer = PlainTextResponse("a token is required", status_code=401, headers=challenge)
        await answer(scope, receive, with_headers)


__all__ = ["LOOPBACK_NAMES", "UiGuard", "host_names", "is_loopback", "token_matches"]
