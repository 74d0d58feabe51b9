"""``http_get``: a read-only HTTP fetch; the response itself is the readback."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import httpx
from pydantic import BaseModel, Field

from activities.lease_context import LeaseContext
from activities.tool import ToolResult, tool
from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import ConfigurationError, PermanentToolError, RetryableToolError
from agentlease.records import SettlementReceipt

PREVIEW_CHARS = 2_000
"""Characters of the body kept in the tool's output."""


class HttpGetArgs(BaseModel):
    """Arguments of ``http_get``.

    Attributes:
        url: absolute URL, or a path relative to ``AGENTLEASE_HTTP_BASE_URL``.
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


@tool(side_effect=SideEffectClass.READ_ONLY, lease_ttl=timedelta(seconds=15), start_to_close=timedelta(minutes=2))
async def http_get(ctx: LeaseContext, args: HttpGetArgs) -> ToolResult:
    """Fetch a URL; the receipt carries the status, size and SHA-256 of the body."""
    try:
        url = resolve_url(ctx.settings.http_base_url, args.url)
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
        receipt=SettlementReceipt(
            external_system="http",
            external_id=url,
            status="fetched",
            details=facts,
            verified_at=datetime.now(UTC),
        ),
        output={"url": url, **facts, "preview": response.text[:PREVIEW_CHARS]},
    )
