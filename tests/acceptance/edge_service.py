"""The HTTP downstream of the edge matrix: a charge service behind ``IdempotencyMiddleware``, as a process.

``python -m tests.acceptance.edge_service DATABASE_URL PORT`` serves on ``127.0.0.1:PORT`` (printing
``serving <url>``) until it is terminated or killed; ``EDGE_CONTROL_DIR`` names the crash-point directory
(:mod:`tests.acceptance.edge_holds`) and ``EDGE_LOCK_TIMEOUT_S`` the key store's lock timeout.

- ``POST /charges/{target}``: one charge, its row and its idempotency key committed together
  (``effect_transaction``, the fence checked inside it; ``commits_with_key``). Crash points: ``inside``
  (the request holds the key, before its transaction), ``committed`` (after the commit, before the handler
  answers), ``answered`` (the answer stored under the key, then withheld from the client).
- ``GET /charges/{target}``: the charges of ``target`` (the tool's readback).

Every answer to a ``POST`` is logged (``http_answer``: status, error code, the request's fencing token).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from datetime import timedelta

import uvicorn
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert, select
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlease.idempotency import IdempotencyMiddleware, IdempotencyStore, effect_transaction
from tests.acceptance import edge_holds

metadata = MetaData()
charges = Table(
    "charges",
    metadata,
    Column("charge_id", Integer, primary_key=True, autoincrement=True),
    Column("target", String(200), nullable=False, index=True),
    Column("idempotency_key", String(255)),
    Column("generation", BigInteger),
)
"""One row per charge the service made: the effects the matrix counts."""


def _app(store: IdempotencyStore) -> ASGIApp:
    async def charge(request: Request) -> JSONResponse:
        call = request.state.idempotency
        await edge_holds.at("inside", request.path_params["target"])
        async with effect_transaction(store.engine) as effect:
            made = await effect.conn.execute(
                insert(charges)
                .values(
                    target=request.path_params["target"],
                    idempotency_key=call.idempotency_key,
                    generation=None if call.fencing is None else call.fencing.generation,
                )
                .returning(charges.c.charge_id)
            )
            answer = JSONResponse({"charge_id": made.scalar_one()}, status_code=201)
            effect.done(answer)
        await edge_holds.at("committed", request.path_params["target"])
        return answer

    async def read(request: Request) -> JSONResponse:
        async with store.engine.connect() as conn:
            rows = (await conn.execute(select(charges).where(charges.c.target == request.path_params["target"]))).all()
        return JSONResponse({"charges": [dict(row._mapping) for row in rows]})

    app = Starlette(
        routes=[
            Route("/charges/{target}", charge, methods=["POST"]),
            Route("/charges/{target}", read, methods=["GET"]),
        ],
        middleware=[Middleware(IdempotencyMiddleware, store=store, commits_with_key=True, anonymous=True)],
    )
    return _Answers(app)


class _Answers:
    """Outermost layer: logs each ``POST``'s answer, and withholds it where ``answered`` is planned."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        target = scope["path"].rsplit("/", 1)[-1]
        messages: list[Message] = []

        async def capture(message: Message) -> None:
            messages.append(message)

        await self.app(scope, receive, capture)
        status = next((m["status"] for m in messages if m["type"] == "http.response.start"), 0)
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
        error = json.loads(body).get("error") if status >= 400 and body.startswith(b"{") else None
        edge_holds.log("http_answer", target, status=status, error=error, token=headers.get("fencing-token"))
        await edge_holds.at("answered", target)
        for message in messages:
            await send(message)


async def serve(database_url: str, port: int) -> None:
    lock = timedelta(seconds=float(os.environ.get("EDGE_LOCK_TIMEOUT_S", "60")))
    store = IdempotencyStore.from_url(database_url, lock_timeout=lock)
    await store.create_tables()
    async with store.engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    server = uvicorn.Server(uvicorn.Config(_app(store), log_level="warning", lifespan="off"))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # connections wait in the backlog until the server accepts them
    print(f"serving http://127.0.0.1:{port}/", flush=True)
    await server.serve(sockets=[sock])
    await store.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
