"""A real publishing service, the fenced and idempotent downstream of ``http_publish``: a Starlette app, every
write guarded by ``IdempotencyMiddleware``. ``docs/plans.md`` ("The example publishing service")."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentlease.clock import db_now_ms
from agentlease.demo.serving import serve_app
from agentlease.errors import StaleFencingTokenError
from agentlease.idempotency import IdempotencyMiddleware, IdempotencyStore, effect_transaction
from agentlease.idempotency.convention import MAX_KEY_LENGTH
from agentlease.idempotency.middleware import stale_fencing_response
from agentlease.ledger.engine import create_async_database_engine
from agentlease.ledger.tables import NAMING_CONVENTION
from agentlease.tools.builtin.http_publish import MAX_BODY_CHARS, MAX_TITLE_CHARS, SLUG_PATTERN, fenced_resource

DATABASE_FILE = "publishing.db"
"""The service's SQLite file under the data dir."""

SLUG = re.compile(SLUG_PATTERN)
"""A post's slug: lower-case letters, digits and ``-``, at most 120 characters."""

metadata = MetaData(naming_convention=NAMING_CONVENTION)

posts = Table(
    "posts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("slug", String(120), nullable=False, unique=True),
    Column("title", String(MAX_TITLE_CHARS), nullable=False),
    Column("body", Text, nullable=False),
    Column("idempotency_key", String(MAX_KEY_LENGTH), nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("updated_at_ms", BigInteger, nullable=False),
)
"""One row per slug: the post as its latest accepted write left it."""

publications = Table(
    "publications",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("post_id", Integer, ForeignKey("posts.id"), nullable=False),
    Column("idempotency_key", String(MAX_KEY_LENGTH), nullable=False, unique=True),
    Column("generation", BigInteger, nullable=False),
    Column("title", String(MAX_TITLE_CHARS), nullable=False),
    Column("body", Text, nullable=False),
    Column("accepted_at_ms", BigInteger, nullable=False),
)
"""One row per accepted write (at most one per idempotency key): the effects at this downstream."""


def database_url(data_dir: Path) -> str:
    """URL of the service's SQLite file under ``data_dir``."""
    return f"sqlite:///{(data_dir / DATABASE_FILE).resolve()}"


def _error(status: int, code: str, detail: str, **facts: object) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail, **facts}, status_code=status)


async def _load_post(conn: AsyncConnection, post_id: int) -> dict[str, Any] | None:
    """The post as the service answers it: its columns, its ``url`` and its ``publications``, oldest first."""
    post = (await conn.execute(select(posts).where(posts.c.id == post_id))).first()
    if post is None:
        return None
    history = select(publications).where(publications.c.post_id == post_id).order_by(publications.c.id)
    accepted = [{k: v for k, v in row._mapping.items() if k != "post_id"} for row in await conn.execute(history)]
    return {**post._mapping, "url": f"/posts/{post.id}", "publications": accepted}


def _check_post(payload: object) -> tuple[str, str, str] | str:
    """``(slug, title, body)`` from a request body, or what is wrong with it."""
    if not isinstance(payload, dict) or set(payload) != {"slug", "title", "body"}:
        return "the body is a JSON object with exactly slug, title and body"
    slug, title, body = payload["slug"], payload["title"], payload["body"]
    if not isinstance(slug, str) or not SLUG.match(slug):
        return "slug: 1 to 120 lower-case letters, digits and '-', starting with a letter or digit"
    if not isinstance(title, str) or not 0 < len(title) <= MAX_TITLE_CHARS:
        return f"title: 1 to {MAX_TITLE_CHARS} characters"
    if not isinstance(body, str) or len(body) > MAX_BODY_CHARS:
        return f"body: at most {MAX_BODY_CHARS} characters"
    return slug, title, body


AfterWrite = Callable[[int], Awaitable[None]]
"""Awaited with the post's id once a write committed, before the service answers (a test holds it there)."""


class PublishingService:
    """The handlers, over the service's ``engine`` (shared with its :class:`IdempotencyStore`), awaiting
    ``after_write`` (if given) once a write committed, before the answer."""

    def __init__(self, engine: AsyncEngine, *, after_write: AfterWrite | None = None) -> None:
        self.engine = engine
        self.after_write = after_write

    async def publish(self, request: Request) -> JSONResponse:
        """``POST /posts``: the write, its publication row and the fence, in one transaction."""
        try:
            checked = _check_post(await request.json())
        except ValueError:
            checked = "the body is not JSON"
        if isinstance(checked, str):
            return _error(422, "invalid_post", checked)
        slug, title, body = checked
        key: str = request.state.idempotency_key
        resource = fenced_resource(slug, key)
        fencing = request.state.fencing
        if request.state.idempotency.resource != resource:
            return _error(422, "wrong_fencing_resource", f"a write of this post is fenced as {resource!r}")
        try:
            async with effect_transaction(self.engine) as effect:  # the fence, the write and the key: one commit
                answer, post_id = await self._write(effect.conn, slug, title, body, key, fencing.generation)
                effect.done(answer)
        except StaleFencingTokenError as exc:
            return stale_fencing_response(exc)
        if self.after_write is not None and answer.status_code == 201:
            await self.after_write(post_id)
        return answer

    async def _write(
        self, conn: AsyncConnection, slug: str, title: str, body: str, key: str, generation: int
    ) -> tuple[JSONResponse, int]:
        done = (
            await conn.execute(select(publications.c.post_id).where(publications.c.idempotency_key == key))
        ).scalar()
        if done is not None:
            return JSONResponse(await _load_post(conn, done), status_code=200), done
        now_ms = db_now_ms(conn.dialect.name)
        written = {"title": title, "body": body, "idempotency_key": key, "generation": generation}
        revise = update(posts).where(posts.c.slug == slug).values(**written, updated_at_ms=now_ms)
        post_id = (await conn.execute(revise.returning(posts.c.id))).scalar()
        if post_id is None:
            create = insert(posts).values(slug=slug, **written, updated_at_ms=now_ms)
            post_id = (await conn.execute(create.returning(posts.c.id))).scalar_one()
        await conn.execute(insert(publications).values(post_id=post_id, **written, accepted_at_ms=now_ms))
        post = await _load_post(conn, post_id)
        return JSONResponse(post, status_code=201, headers={"Location": f"/posts/{post_id}"}), post_id

    async def find(self, request: Request) -> JSONResponse:
        """``GET /posts[?idempotency_key=K]``."""
        query = select(posts.c.id).order_by(posts.c.id)
        key = request.query_params.get("idempotency_key")
        if key is not None:
            query = query.join(publications, publications.c.post_id == posts.c.id).where(
                publications.c.idempotency_key == key
            )
        async with self.engine.connect() as conn:
            ids = (await conn.execute(query)).scalars().all()
            found = [await _load_post(conn, post_id) for post_id in ids]
        return JSONResponse({"posts": found})

    async def get(self, request: Request) -> JSONResponse:
        """``GET /posts/{id}``."""
        async with self.engine.connect() as conn:
            post = await _load_post(conn, request.path_params["post_id"])
        if post is None:
            return _error(404, "no_such_post", f"no post {request.path_params['post_id']}")
        return JSONResponse(post)


def publishing_app(
    store: IdempotencyStore, *, fencing_key: bytes | None = None, after_write: AfterWrite | None = None
) -> Starlette:
    """The service's ASGI app over ``store``'s engine, accepting only fencing tokens signed with ``fencing_key``
    (default ``None``: bare generations; ``docs/security-downstream.md``)."""
    service = PublishingService(store.engine, after_write=after_write)
    return Starlette(
        routes=[
            Route("/posts", service.publish, methods=["POST"]),
            Route("/posts", service.find, methods=["GET"]),
            Route("/posts/{post_id:int}", service.get, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                IdempotencyMiddleware,
                store=store,
                require_fencing_token=True,
                fencing_key=fencing_key,
                anonymous=True,  # the demo's one agent; a shared service names its callers
            )
        ],
    )


async def create_tables(engine: AsyncEngine) -> None:
    """Create ``posts`` and ``publications`` if they do not exist (safe to run again)."""
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)


async def count_publications(url: str, idempotency_key: str | None = None) -> int:
    """Accepted writes at the service, all or those of one idempotency key."""
    engine = create_async_database_engine(url, pool_size=1)
    query = select(func.count()).select_from(publications)
    if idempotency_key is not None:
        query = query.where(publications.c.idempotency_key == idempotency_key)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(query)).scalar_one()
    finally:
        await engine.dispose()


@asynccontextmanager
async def running_publishing(
    url: str, *, fencing_key: bytes | None = None, after_write: AfterWrite | None = None
) -> AsyncIterator[str]:
    """Create the service's tables in ``url`` and serve it on a loopback port; yields its base URL."""
    store = IdempotencyStore.from_url(url)
    try:
        await store.create_tables()
        await create_tables(store.engine)
        async with serve_app(publishing_app(store, fencing_key=fencing_key, after_write=after_write)) as base_url:
            yield base_url
    finally:
        await store.close()
