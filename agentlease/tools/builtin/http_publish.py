"""``http_publish``: a fenced and idempotent HTTP write to a service of the ``docs/edge.md`` convention, read back
by idempotency key; its probe (:func:`published`) looks the key up (``docs/plans.md``, "Built-in tools").
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import httpx
from pydantic import BaseModel, Field

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import AmbiguousSideEffectError, PermanentToolError, RetryableToolError, ToolError
from agentlease.idempotency.convention import REPLAYED_HEADER
from agentlease.records import SettlementReceipt
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools._probe import ProbeQuery, ProbeResult

SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,119}$"
"""A post's slug: lower-case letters, digits and ``-``, at most 120 characters."""

MAX_TITLE_CHARS = 200
MAX_BODY_CHARS = 100_000


def fenced_resource(slug: str, idempotency_key: str) -> str:
    """The fenced resource of a post as written by one action: ``posts/<slug>/<idempotency key>`` (a fence orders
    the generations of one task; another action publishing the same slug writes a new revision)."""
    return f"posts/{slug}/{idempotency_key}"


class HttpPublishArgs(BaseModel):
    """Arguments of ``http_publish``.

    Attributes:
        slug: the post's slug (lower-case letters, digits, ``-``; at most 120 characters).
        title: 1 to 200 characters.
        body: the post's text.
        timeout_s: timeout of each request, in seconds. Default 10.
    """

    slug: str = Field(pattern=SLUG_PATTERN)
    title: str = Field(min_length=1, max_length=MAX_TITLE_CHARS)
    body: str = Field(max_length=MAX_BODY_CHARS)
    timeout_s: float = Field(default=10.0, gt=0)


def _publication(post: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((p for p in post.get("publications", []) if p.get("idempotency_key") == key), None)


def _check_ours(post: dict[str, Any], key: str, args: HttpPublishArgs) -> dict[str, Any]:
    """The publication of ``key`` in a post read back; a permanent error if it wrote other content."""
    publication = _publication(post, key)
    if publication is None:
        raise RetryableToolError(f"readback of post {post.get('id')} shows no publication for {key!r}")
    if (post["slug"], publication["title"], publication["body"]) != (args.slug, args.title, args.body):
        raise PermanentToolError(f"idempotency key {key!r} already published other content (post {post['id']})")
    return publication


def _receipt(post: dict[str, Any], publication: dict[str, Any], base_url: str) -> SettlementReceipt:
    return SettlementReceipt.now(
        "publish",
        str(post["id"]),
        "published",
        url=f"{base_url.rstrip('/')}/posts/{post['id']}",
        slug=post["slug"],
        publication_id=publication["id"],
        idempotency_key=publication["idempotency_key"],
        generation=publication["generation"],
        body_sha256=hashlib.sha256(publication["body"].encode()).hexdigest(),
    )


async def _get(client: httpx.AsyncClient, path: str, **params: str) -> httpx.Response:
    try:
        response = await client.get(path, params=params)
    except httpx.TransportError as exc:
        raise RetryableToolError(f"GET {path}: {type(exc).__name__}") from None
    if response.status_code >= 500 or response.status_code == 429:
        raise RetryableToolError(f"GET {path}: HTTP {response.status_code}")
    return response


async def _post(client: httpx.AsyncClient, ctx: LeaseContext, args: HttpPublishArgs) -> httpx.Response:
    # Signed for the resource when the worker has a fencing key (docs/security-downstream.md).
    headers = ctx.downstream_headers(resource=fenced_resource(args.slug, ctx.idempotency_key))
    try:
        response = await client.post(
            "posts", json={"slug": args.slug, "title": args.title, "body": args.body}, headers=headers
        )
    except httpx.ConnectError as exc:
        raise RetryableToolError(f"POST /posts: {type(exc).__name__}") from None
    except httpx.TransportError as exc:
        # The request may have reached the service: the same key and a newer token make a retry safe.
        raise AmbiguousSideEffectError(f"POST /posts: {type(exc).__name__} after sending") from None
    if response.status_code == 409:
        error = _error_code(response)
        if error == "stale_fencing_token":
            raise RetryableToolError(
                f"POST /posts refused generation {ctx.fencing_token}: a newer attempt has written {args.slug!r}"
            )
        raise RetryableToolError(f"POST /posts: HTTP 409 {error}")
    if response.status_code >= 500 or response.status_code == 429:
        raise RetryableToolError(f"POST /posts: HTTP {response.status_code}")
    if response.status_code >= 400:
        raise PermanentToolError(f"POST /posts: HTTP {response.status_code} {_error_code(response)}")
    return response


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", ""))
    except ValueError:
        return ""


async def _read_back_by_key(client: httpx.AsyncClient, key: str) -> dict[str, Any] | None:
    response = await _get(client, "posts", idempotency_key=key)
    if response.status_code != 200:
        raise PermanentToolError(f"GET /posts?idempotency_key: HTTP {response.status_code}")
    found = response.json()["posts"]
    return found[0] if found else None


async def published(query: ProbeQuery) -> ProbeResult:
    """``http_publish``'s probe: ``GET /posts?idempotency_key=K``. ``happened`` with the receipt a readback makes,
    ``not_happened`` without a publication of the key, ``cannot_tell`` unreachable or other content under it."""
    base_url = query.settings.publish_base_url if query.settings is not None else None
    if not base_url:
        return ProbeResult.cannot_tell("no AGENTLEASE_PUBLISH_BASE_URL to ask")
    args = query.arguments
    assert isinstance(args, HttpPublishArgs)
    key = query.idempotency_key
    asked = f"GET /posts?idempotency_key={key}"
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=args.timeout_s) as client:
            found = await _read_back_by_key(client, key)
        if found is None:
            return ProbeResult.not_happened(asked=asked, posts=0)
        publication = _check_ours(found, key, args)
    except ToolError as exc:
        return ProbeResult.cannot_tell(f"{asked}: {exc}")
    return ProbeResult.happened(_receipt(found, publication, base_url), asked=asked, post_id=found["id"])


@tool(
    side_effect=SideEffectClass.FENCED,
    lease_ttl=timedelta(seconds=15),
    start_to_close=timedelta(minutes=2),
    probe=published,
)
async def http_publish(ctx: LeaseContext, args: HttpPublishArgs) -> ToolResult:
    """Publish a post at most once per idempotency key; the receipt comes from reading it back."""
    base_url = ctx.settings.publish_base_url
    if not base_url:
        raise PermanentToolError("http_publish needs AGENTLEASE_PUBLISH_BASE_URL")
    key = ctx.idempotency_key
    async with httpx.AsyncClient(base_url=base_url, timeout=args.timeout_s) as client:
        await ctx.advance(Stage.PREFLIGHT, f"looking up a post published with key {key} ({ctx.recovery.action})")
        found = await _read_back_by_key(client, key)
        if found is not None:
            publication = _check_ours(found, key, args)
            await ctx.advance(Stage.VERIFY, f"post {found['id']} already published with this key; settling from it")
            return ToolResult(
                receipt=_receipt(found, publication, base_url),
                output={"post_id": found["id"], "slug": args.slug, "written": False},
            )
        await ctx.advance(Stage.EXTERNAL_CALL, f"POST /posts {args.slug} with generation {ctx.fencing_token}")
        answer = await _post(client, ctx, args)
        written = answer.json()
        # 200 or a replay: an earlier attempt with this key wrote it; 201 first-hand: this attempt did.
        first_hand = answer.status_code == 201 and answer.headers.get(REPLAYED_HEADER) != "true"
        accepted = f"service accepted post {written['id']} ({args.slug}, first write: {first_hand})"
        await ctx.advance(Stage.COMMIT, accepted)
        await ctx.advance(Stage.VERIFY, f"reading back post {written['id']}")
        response = await _get(client, f"posts/{written['id']}")
        if response.status_code != 200:
            raise RetryableToolError(f"readback of post {written['id']}: HTTP {response.status_code}")
        post = response.json()
        publication = _check_ours(post, key, args)
    return ToolResult(
        receipt=_receipt(post, publication, base_url),
        output={"post_id": post["id"], "slug": args.slug, "written": first_hand},
    )
