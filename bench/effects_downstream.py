"""The downstream of the effect-safety benchmark: a refund service that counts its own effects.

A Starlette app served by uvicorn on 127.0.0.1 in a process of its own
(``python -m bench.effects_downstream DATABASE_URL``, which prints ``serving <base url>`` and runs
until SIGTERM), with its own database. Effects are counted there, one row per refund applied,
never in the agentlease ledger.

- ``POST /refunds/{target}`` with ``{"amount_cents": n}``: applies one refund (one row in
  ``refunds``) and answers 201. A request with ``Idempotency-Key`` goes through
  :class:`~agentlease.idempotency.IdempotencyMiddleware` (its first response replayed to a repeat,
  a stale ``Fencing-Token`` refused with 409, the fence advanced again inside the write's
  transaction); a request without one is applied every time it comes, as a service that accepts
  keys but does not require them does.
- ``GET /effects?prefix=P``: ``{target: {"count": n, "first_at_ms": t}}`` for every target starting
  with ``P`` that was refunded.
- ``POST /control/lose/{target}``: the response to the next refund of ``target`` is lost: the
  refund is applied (and a keyed one's response stored), then the connection stays silent until
  the client gives up, as when a reply is lost on the way back.
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

import httpx
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlease.demo.serving import serve_app
from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import advance_fence
from agentlease.idempotency import IDEMPOTENCY_KEY_HEADER, IdempotencyMiddleware, IdempotencyStore
from agentlease.idempotency.middleware import stale_fencing_response
from agentlease.ledger.engine import create_async_database_engine

LOST_FOR_S = 30.0
"""How long a lost response keeps its connection silent (far past any client's timeout)."""

metadata = MetaData()
refunds = Table(
    "refunds",
    metadata,
    Column("effect_id", Integer, primary_key=True, autoincrement=True),
    Column("target", String(200), nullable=False, index=True),
    Column("amount_cents", Integer, nullable=False),
    Column("idempotency_key", String(256)),
    Column("generation", BigInteger),
    Column("at_ms", BigInteger, nullable=False),
)
"""One row per refund applied: the effects the benchmark counts."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _app(engine: AsyncEngine, store: IdempotencyStore) -> ASGIApp:
    async def refund(request: Request) -> JSONResponse:
        target = request.path_params["target"]
        body = json.loads(await request.body())
        fencing = getattr(request.state, "fencing", None)
        generation = None if fencing is None else fencing.generation
        try:
            async with engine.begin() as conn:
                if fencing is not None:  # a newer writer may have passed the middleware meanwhile
                    await advance_fence(conn, fencing.resource_key, fencing.generation)
                applied = await conn.execute(
                    refunds.insert().values(
                        target=target,
                        amount_cents=int(body["amount_cents"]),
                        idempotency_key=getattr(request.state, "idempotency_key", None),
                        generation=generation,
                        at_ms=_now_ms(),
                    )
                )
        except StaleFencingTokenError as exc:
            return stale_fencing_response(exc)
        assert applied.inserted_primary_key is not None
        return JSONResponse({"refund_id": applied.inserted_primary_key[0], "target": target}, status_code=201)

    async def effects(request: Request) -> JSONResponse:
        prefix = request.query_params.get("prefix", "")
        query = (
            select(refunds.c.target, func.count(), func.min(refunds.c.at_ms))
            .where(refunds.c.target.startswith(prefix))
            .group_by(refunds.c.target)
        )
        async with engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return JSONResponse({target: {"count": n, "first_at_ms": at} for target, n, at in rows})

    routes = [Route("/refunds/{target}", refund, methods=["POST"])]
    keyed = IdempotencyMiddleware(Starlette(routes=routes), store=store, anonymous=True)
    unkeyed = Starlette(routes=routes)
    losing: set[str] = set()

    async def lose(request: Request) -> JSONResponse:
        losing.add(request.path_params["target"])
        return JSONResponse({"losing": request.path_params["target"]})

    control = Starlette(
        routes=[Route("/effects", effects, methods=["GET"]), Route("/control/lose/{target}", lose, methods=["POST"])]
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/refunds/"):
            await control(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower() for name, _value in scope["headers"]}
        inner = keyed if IDEMPOTENCY_KEY_HEADER.lower() in headers else unkeyed
        target = path.removeprefix("/refunds/")
        if target not in losing:
            await inner(scope, receive, send)
            return
        losing.discard(target)

        async def swallow(message: Message) -> None:
            return None

        await inner(scope, receive, swallow)  # applied (and a keyed response stored); the answer is lost
        await asyncio.sleep(LOST_FOR_S)

    return app


async def serve(database_url: str) -> None:
    """Create the service's tables in ``database_url``; serve on loopback until SIGTERM or SIGINT."""
    engine = create_async_database_engine(database_url)
    store = IdempotencyStore(create_async_database_engine(database_url))
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
        await engine.dispose()


@dataclass(frozen=True)
class Effects:
    """What the refund service applied, per target."""

    count: int
    first_at_ms: int | None


@dataclass(frozen=True)
class RefundService:
    """A running refund service."""

    base_url: str

    async def effects(self, prefix: str) -> dict[str, Effects]:
        """The refunds applied to each target starting with ``prefix``."""
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as http:
            answer = await http.get("effects", params={"prefix": prefix})
        answer.raise_for_status()
        return {target: Effects(**found) for target, found in answer.json().items()}

    async def lose_next_response(self, targets: list[str]) -> None:
        """Lose the response to the next refund of each of ``targets``."""
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as http:
            for target in targets:
                (await http.post(f"control/lose/{target}")).raise_for_status()


@asynccontextmanager
async def running_refund_service(database_url: str, log_path: str) -> AsyncIterator[RefundService]:
    """Start the service in its own process on ``database_url`` (its output in ``log_path``); stop it after."""
    with open(log_path, "ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, database_url, stdout=asyncio.subprocess.PIPE, stderr=log
        )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=60)).decode()
        if not line.startswith("serving "):
            raise RuntimeError(f"the refund service did not start (exit {process.returncode}): {line!r}")
        yield RefundService(base_url=line.split()[1])
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
