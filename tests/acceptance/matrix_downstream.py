"""The downstream service of the pause/kill matrix: a real HTTP server that counts its own effects.

A Starlette app served by uvicorn on 127.0.0.1 (:func:`agentlease.demo.downstream.serve_app`) in a
process of its own (``python -m tests.acceptance.matrix_downstream DATABASE_URL``, which prints
``serving <base url>`` and runs until SIGTERM), with its own database. Effects are counted there,
in the service's table of accepted writes (``effects``), never in the agentlease ledger.

Routes:

- ``/api/...``: behind :class:`~agentlease.idempotency.IdempotencyMiddleware` (``Idempotency-Key``
  required on writes; ``Fencing-Token`` enforced when sent, the fenced resource being the request
  path: the fenced tool sends a key per attempt, so that the fence, not the key, stops an older one).

  - ``POST /api/documents/{target}``: the write of the ``idempotent`` and ``fenced`` tools. Inside
    one transaction it advances the fence again (a newer writer may have passed the middleware
    meanwhile), upserts the document and records one row in ``effects``.
  - ``GET /api/documents/{target}``: the readback (404 when absent).
  - ``GET /api/catalog/{target}``: what the ``read_only`` tool reads; no effect.

- ``/plain/...``: no middleware; the target of the ``unsafe`` tool, which has neither key nor fence.

  - ``POST /plain/messages/{target}``: one row in ``effects`` per request, however often it comes.
  - ``GET /plain/messages/{target}``: how many messages ``target`` received; with ``?lag_ms=N``, only
    those accepted at least N ms before (a downstream that shows a write late: a search index, a replica).

Every request is logged in ``requests`` with the writer header, the status, the replay header and
the error code of the answer, so a test can show what the downstream answered to a late write.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Boolean, Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlease.demo.downstream import serve_app
from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import advance_fence, upsert_for
from agentlease.idempotency import (
    FENCING_TOKEN_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    REPLAYED_HEADER,
    IdempotencyMiddleware,
    IdempotencyStore,
    request_path,
)
from agentlease.idempotency.middleware import stale_fencing_response
from agentlease.ledger.engine import create_async_database_engine

_REPO = Path(__file__).resolve().parents[2]

WRITER_HEADER = "X-Writer"
"""``<lease owner>#g<claim generation>`` of the attempt that sent a request: evidence only, not hashed."""

metadata = MetaData()

effects = Table(
    "effects",
    metadata,
    Column("effect_id", Integer, primary_key=True, autoincrement=True),
    Column("endpoint", String(32), nullable=False),
    Column("target", String(200), nullable=False),
    Column("action", String(256), nullable=False),
    Column("request_key", String(256)),
    Column("generation", BigInteger),
    Column("writer", String(200)),
    Column("at_ms", BigInteger, nullable=False),
)
"""One row per write the service accepted and applied."""

documents = Table(
    "documents",
    metadata,
    Column("target", String(200), primary_key=True),
    Column("action", String(256), nullable=False),
    Column("generation", BigInteger),
    Column("writer", String(200)),
    Column("written_at_ms", BigInteger, nullable=False),
)
"""The published documents, read back by the tools."""

requests_log = Table(
    "requests",
    metadata,
    Column("request_id", Integer, primary_key=True, autoincrement=True),
    Column("method", String(8), nullable=False),
    Column("path", String(400), nullable=False),
    Column("idempotency_key", String(256)),
    Column("fencing_token", String(32)),
    Column("writer", String(200)),
    Column("status", Integer, nullable=False),
    Column("replayed", Boolean, nullable=False),
    Column("error", String(64)),
    Column("at_ms", BigInteger, nullable=False),
)
"""Every request and the service's answer."""


@dataclass(frozen=True)
class Effect:
    """An accepted write, as the service recorded it."""

    effect_id: int
    endpoint: str
    target: str
    action: str
    request_key: str | None
    generation: int | None
    writer: str | None
    at_ms: int


@dataclass(frozen=True)
class LoggedRequest:
    """A request and the answer it got."""

    request_id: int
    method: str
    path: str
    idempotency_key: str | None
    fencing_token: str | None
    writer: str | None
    status: int
    replayed: bool
    error: str | None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _app(engine: AsyncEngine, store: IdempotencyStore) -> ASGIApp:
    async def write_document(request: Request) -> JSONResponse:
        target = request.path_params["target"]
        body = json.loads(await request.body())
        fencing = request.state.fencing
        writer = request.headers.get(WRITER_HEADER)
        generation = None if fencing is None else fencing.generation
        try:
            async with engine.begin() as conn:
                if fencing is not None:
                    await advance_fence(conn, fencing.resource_key, fencing.generation)
                values = {
                    "target": target,
                    "action": body["action"],
                    "generation": generation,
                    "writer": writer,
                    "written_at_ms": _now_ms(),
                }
                upsert = upsert_for(conn.dialect.name, documents).values(**values)
                await conn.execute(
                    upsert.on_conflict_do_update(
                        index_elements=["target"], set_={k: upsert.excluded[k] for k in values if k != "target"}
                    )
                )
                await conn.execute(
                    effects.insert().values(
                        endpoint="documents",
                        target=target,
                        action=body["action"],
                        request_key=request.state.idempotency_key,
                        generation=generation,
                        writer=writer,
                        at_ms=_now_ms(),
                    )
                )
        except StaleFencingTokenError as exc:  # A newer writer passed the middleware meanwhile.
            return stale_fencing_response(exc)
        return JSONResponse({"target": target, "generation": generation, "writer": writer}, status_code=201)

    async def read_document(request: Request) -> JSONResponse:
        target = request.path_params["target"]
        async with engine.connect() as conn:
            row = (await conn.execute(select(documents).where(documents.c.target == target))).first()
        if row is None:
            return JSONResponse({"error": "not_found"}, status_code=404)
        return JSONResponse(
            {"target": row.target, "action": row.action, "generation": row.generation, "writer": row.writer}
        )

    async def read_catalog(request: Request) -> JSONResponse:
        return JSONResponse({"target": request.path_params["target"], "items": ["alpha", "beta"]})

    async def send_message(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        async with engine.begin() as conn:
            result = await conn.execute(
                effects.insert().values(
                    endpoint="messages",
                    target=request.path_params["target"],
                    action=body["action"],
                    request_key=None,
                    generation=None,
                    writer=request.headers.get(WRITER_HEADER),
                    at_ms=_now_ms(),
                )
            )
        assert result.inserted_primary_key is not None
        return JSONResponse({"message_id": result.inserted_primary_key[0]}, status_code=201)

    async def count_messages(request: Request) -> JSONResponse:
        target = request.path_params["target"]
        shown_before_ms = _now_ms() - int(request.query_params.get("lag_ms", "0"))
        shown = (effects.c.endpoint == "messages", effects.c.target == target, effects.c.at_ms <= shown_before_ms)
        async with engine.connect() as conn:
            count = (await conn.execute(select(func.count()).where(*shown))).scalar_one()
        return JSONResponse({"target": target, "count": count})

    api = IdempotencyMiddleware(
        Starlette(
            routes=[
                Route("/documents/{target}", write_document, methods=["POST"]),
                Route("/documents/{target}", read_document, methods=["GET"]),
                Route("/catalog/{target}", read_catalog, methods=["GET"]),
            ]
        ),
        store=store,
        resource_for=request_path,
        anonymous=True,
    )
    plain = Starlette(
        routes=[
            Route("/messages/{target}", send_message, methods=["POST"]),
            Route("/messages/{target}", count_messages, methods=["GET"]),
        ]
    )
    return _RequestLog(Starlette(routes=[Mount("/api", app=api), Mount("/plain", app=plain)]), engine)


class _RequestLog:
    """Outermost ASGI layer: records each request and the answer the service gave it."""

    def __init__(self, app: ASGIApp, engine: AsyncEngine) -> None:
        self.app = app
        self.engine = engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        body: list[bytes] = []

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, record)
        request_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        response_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start.get("headers", [])}
        status = start.get("status", 0)
        error = None
        if status >= 400:
            try:
                error = json.loads(b"".join(body)).get("error")
            except (ValueError, AttributeError):
                error = None
        async with self.engine.begin() as conn:
            await conn.execute(
                requests_log.insert().values(
                    method=scope["method"],
                    path=scope["path"],
                    idempotency_key=request_headers.get(IDEMPOTENCY_KEY_HEADER.lower()),
                    fencing_token=request_headers.get(FENCING_TOKEN_HEADER.lower()),
                    writer=request_headers.get(WRITER_HEADER.lower()),
                    status=status,
                    replayed=response_headers.get(REPLAYED_HEADER.lower()) == "true",
                    error=error,
                    at_ms=_now_ms(),
                )
            )


@dataclass(frozen=True)
class MatrixDownstream:
    """Where a running matrix downstream is, and how to count what it accepted.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/``.
        engine: the service's own database, opened by the test to count effects.
    """

    base_url: str
    engine: AsyncEngine

    async def effects(self, action: str) -> list[Effect]:
        """The accepted writes of one logical action (one idempotency key), oldest first."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(effects).where(effects.c.action == action).order_by(effects.c.effect_id))
            return [Effect(**row._mapping) for row in rows]

    async def accepted(self) -> list[Effect]:
        """Every accepted write, in the order the service accepted them."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(effects).order_by(effects.c.effect_id))
            return [Effect(**row._mapping) for row in rows]

    async def requests(self, target: str) -> list[LoggedRequest]:
        """Every request about ``target`` (its document, catalog entry or messages), oldest first."""
        columns = [requests_log.c[name] for name in LoggedRequest.__dataclass_fields__]
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(*columns).where(requests_log.c.path.like(f"%/{target}")).order_by(requests_log.c.request_id)
            )
            return [LoggedRequest(**row._mapping) for row in rows]


async def serve(database_url: str) -> None:
    """Create the service's tables in ``database_url``, serve on loopback until SIGTERM or SIGINT."""
    engine = create_async_database_engine(database_url)
    store = IdempotencyStore(engine)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await store.create_tables()
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        async with serve_app(_app(engine, store)) as base_url:
            print(f"serving {base_url}", flush=True)
            await stop.wait()
    finally:
        await store.close()


@asynccontextmanager
async def running_matrix_downstream(database_url: str) -> AsyncIterator[MatrixDownstream]:
    """Start the service in its own process on ``database_url``; stop it when the block exits."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__, database_url, stdout=asyncio.subprocess.PIPE, cwd=_REPO
    )
    engine = create_async_database_engine(database_url, pool_size=2)
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=60)).decode()
        assert line.startswith("serving "), f"the downstream did not start (exit {process.returncode}): {line!r}"
        yield MatrixDownstream(base_url=line.split()[1], engine=engine)
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
