"""``post_note``: the example agents' own tool, a fenced write to the demo's publishing service (the README's
"Writing a tool"): read back by key, then written with the claim generation as ``Fencing-Token``."""

from __future__ import annotations

from datetime import timedelta

import httpx
from pydantic import BaseModel, Field

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import PermanentToolError, RetryableToolError, raise_for_status
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools.builtin.http_publish import MAX_TITLE_CHARS, SLUG_PATTERN, fenced_resource


class Note(BaseModel):
    """A note to publish: its ``slug`` (its address), ``title`` and ``body``."""

    slug: str = Field(pattern=SLUG_PATTERN, description="lower-case letters, digits and '-', e.g. restock-a-1002")
    title: str = Field(min_length=1, max_length=MAX_TITLE_CHARS)
    body: str = Field(max_length=10_000)


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=timedelta(seconds=20))
async def post_note(ctx: LeaseContext, args: Note) -> ToolResult:
    """Publish a note for the team on the publishing service; returns its post id.

    Once per idempotency key; the service refuses the write of a superseded attempt.
    """
    base_url = ctx.settings.publish_base_url
    if not base_url:
        raise PermanentToolError("post_note needs AGENTLEASE_PUBLISH_BASE_URL")
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
            await ctx.advance(Stage.PREFLIGHT, f"looking for a note made with key {ctx.idempotency_key}")
            found = await http.get("posts", params={"idempotency_key": ctx.idempotency_key})
            raise_for_status(found, "GET /posts")
            posts = found.json()["posts"]
            written = not posts
            if written:  # no earlier attempt got through: write, carrying the fencing token
                await ctx.advance(Stage.EXTERNAL_CALL, f"POST /posts {args.slug} as generation {ctx.fencing_token}")
                headers = ctx.downstream_headers(resource=fenced_resource(args.slug, ctx.idempotency_key))
                created = await http.post("posts", json=args.model_dump(), headers=headers)
                raise_for_status(created, "POST /posts")
                posts = [created.json()]
                await ctx.advance(Stage.COMMIT, f"note {posts[0]['id']} accepted")
            await ctx.advance(Stage.VERIFY, f"reading note {posts[0]['id']} back")
            readback = await http.get(f"posts/{posts[0]['id']}")
            raise_for_status(readback, "GET /posts/{id}")
    except httpx.TransportError as exc:
        raise RetryableToolError(f"publishing service unreachable: {type(exc).__name__}") from None
    post = readback.json()
    receipt = ctx.receipt("publish", str(post["id"]), "published", slug=post["slug"], generation=post["generation"])
    return ToolResult(receipt=receipt, output={"post_id": post["id"], "url": post["url"], "written": written})
