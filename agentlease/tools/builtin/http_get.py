"""``http_get``: a read-only HTTP fetch; the response itself is the readback."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import timedelta

import httpx
from pydantic import BaseModel, Field

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import ConfigurationError, PermanentToolError, RetryableToolError
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool

PREVIEW_CHARS = 2_000
"""Characters of the body kept in the tool's output."""


class HttpGetArgs(BaseModel):
    """Arguments of ``http_get``.

    Attributes:
        url: absolute URL, or a path relative to ``AGENTLEASE_HTTP_BASE_URL``; only the base's
            host and path, and the hosts of ``AGENTLEASE_HTTP_ALLOWED_HOSTS``, are fetched
            (:func:`check_authority`).
        timeout_s: request timeout in seconds. Default 10.
    """

    url: str = Field(min_length=1)
    timeout_s: float = Field(default=10.0, gt=0)


def resolve_url(base_url: str | None, url: str) -> str:
    """``url`` if absolute, else joined to ``base_url``. Raises ConfigurationError without a base."""
    if url.startswith(("http://", "https://")):
        return url
    if not base_url:
        raise ConfigurationError(f"relative URL {url!r} needs AGENTLEASE_HTTP_BASE_URL")
    return str(httpx.URL(base_url).join(url))


class UrlRefusedError(ConfigurationError):
    """A URL (``url``, resolved against the base) ``http_get`` has no authority to fetch
    (``docs/security-input.md``, "Tool authority")."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"refused to fetch {url}: {why}")
        self.url = url


def check_authority(url: str, base_url: str | None, allowed_hosts: Iterable[str] = ()) -> str:
    """``url`` (resolved) if ``http_get`` may fetch it; else :class:`UrlRefusedError`.

    Allowed: a URL on the base's scheme, host and port whose path lies under the base's path, and
    any ``http``/``https`` URL on a host of ``allowed_hosts`` (``host`` for every port, or
    ``host:port``). Refused: every other host (a cloud metadata address, ``//other.host/x``), a
    path outside the base's (``../admin``), any ``..`` segment (also percent-encoded), a URL with
    credentials in it, and any scheme but ``http``/``https``.

    Raises:
        UrlRefusedError: with the reason.
        ConfigurationError: a relative URL without a base.
    """
    resolved = resolve_url(base_url, url)
    try:
        target = httpx.URL(resolved)
    except httpx.InvalidURL as exc:
        raise UrlRefusedError(resolved, f"not a valid URL ({exc})") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise UrlRefusedError(resolved, "only http and https URLs with a host are fetched")
    if target.userinfo:
        hidden = str(target.copy_with(username=None, password=None))  # the refusal is recorded: no secret in it
        raise UrlRefusedError(hidden, "credentials in the URL are not accepted")
    if ".." in target.path.replace("\\", "/").split("/"):
        raise UrlRefusedError(resolved, "a '..' segment leaves the allowed path")
    host, port = target.host.lower(), target.port or _DEFAULT_PORTS[target.scheme]
    for entry in allowed_hosts:
        name, _, entry_port = entry.strip().lower().rpartition(":") if ":" in entry else (entry.strip().lower(), "", "")
        if name == host and (not entry_port or entry_port == str(port)):
            return resolved
    if base_url:
        base = httpx.URL(base_url)
        same_origin = (base.scheme, base.host.lower(), base.port or _DEFAULT_PORTS.get(base.scheme)) == (
            target.scheme,
            host,
            port,
        )
        prefix = base.path if base.path.endswith("/") else base.path + "/"
        if same_origin and (target.path == base.path or target.path.startswith(prefix)):
            return resolved
        if same_origin:
            raise UrlRefusedError(resolved, f"outside the base path {base.path} of AGENTLEASE_HTTP_BASE_URL")
    raise UrlRefusedError(
        resolved,
        f"{target.host}:{port} is not the host of AGENTLEASE_HTTP_BASE_URL; "
        "name it in AGENTLEASE_HTTP_ALLOWED_HOSTS to allow it",
    )


_DEFAULT_PORTS = {"http": 80, "https": 443}


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=15), start_to_close=timedelta(minutes=2))
async def http_get(ctx: LeaseContext, args: HttpGetArgs) -> ToolResult:
    """Fetch a URL; the receipt carries the status, size and SHA-256 of the body.

    A URL outside its authority (:func:`check_authority`) is a permanent tool error: the step is
    dead-lettered with the reason, and nothing is fetched."""
    try:
        url = check_authority(args.url, ctx.settings.http_base_url, ctx.settings.http_allowed_hosts)
    except ConfigurationError as exc:
        raise PermanentToolError(str(exc)) from None
    await ctx.advance(Stage.PREFLIGHT, f"resolved {url}")
    await ctx.advance(Stage.EXTERNAL_CALL, f"GET {url}")
    try:
        async with httpx.AsyncClient(timeout=args.timeout_s) as client:
            response = await client.get(url)
    except httpx.TransportError as exc:
        raise RetryableToolError(f"GET {url}: {type(exc).__name__}") from None
    if response.status_code >= 500 or response.status_code == 429:
        raise RetryableToolError(f"GET {url}: HTTP {response.status_code}")
    if response.status_code >= 400:
        raise PermanentToolError(f"GET {url}: HTTP {response.status_code}")
    digest = hashlib.sha256(response.content).hexdigest()
    await ctx.advance(Stage.VERIFY, f"read {len(response.content)} bytes, sha256 {digest[:12]}")
    facts = {"status_code": response.status_code, "bytes": len(response.content), "sha256": digest}
    return ToolResult(
        receipt=ctx.receipt("http", url, "fetched", **facts),
        output={"url": url, **facts, "preview": response.text[:PREVIEW_CHARS]},
    )
