"""``IdempotencyMiddleware`` driven through ASGI with what a server that checks less than uvicorn may hand it: a
``Content-Length`` of thousands of digits, a path holding a lone surrogate. Each gets an answer, never a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import fenced_write, read_fence
from agentlease.idempotency import IdempotencyMiddleware, IdempotencyStore, effect_transaction
from agentlease.idempotency.convention import scoped_key


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[IdempotencyStore]:
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'keys.db'}")
    await store.create_tables()
    yield store
    await store.close()


async def post(app: Any, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b"{}") -> tuple[int, Any]:
    """One POST through the ASGI app: its status and its body's JSON."""
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogatepass"),
        "query_string": b"",
        "headers": [(b"idempotency-key", b"k-1"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    bodies = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return bodies.pop(0) if bodies else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(message["status"] for message in sent if message["type"] == "http.response.start")
    text = b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body")
    return status, json.loads(text)


def service(store: IdempotencyStore, calls: list[str]) -> Any:
    async def write(request: Request) -> JSONResponse:
        calls.append(request.url.path)
        return JSONResponse({"written": True}, status_code=201)

    return IdempotencyMiddleware(
        Starlette(routes=[Route("/{name:path}", write, methods=["POST"])]), store=store, anonymous=True
    )


async def test_a_content_length_of_thousands_of_digits_is_too_large_not_a_crash(store: IdempotencyStore) -> None:
    calls: list[str] = []
    status, answer = await post(service(store, calls), "/charges", [(b"content-length", b"9" * 5000)])
    assert (status, answer["error"]) == (413, "request_too_large")
    zeros = await post(service(store, calls), "/charges", [(b"content-length", b"0" * 5000 + b"2")])
    assert zeros[0] == 201 and calls == ["/charges"]


async def test_a_path_holding_a_lone_surrogate_is_keyed_as_any_other(store: IdempotencyStore) -> None:
    calls: list[str] = []
    app = service(store, calls)
    first = await post(app, "/charges/\ud800", [])
    again = await post(app, "/charges/\ud800", [])
    other = await post(app, "/charges/\ud801", [])
    assert first == again == (201, {"written": True})
    assert (other[0], other[1]["error"]) == (422, "idempotency_key_reused")
    assert len(calls) == 1


async def test_a_task_its_handler_left_running_commits_fenced_after_the_call_ended(store: IdempotencyStore) -> None:
    """A handler answers 202 and leaves a task that commits later in ``effect_transaction``: the call's key was
    settled by then, so the task's commit is fenced and stores nothing, never refused as a key taken over; a newer
    generation that arrived meanwhile refuses it."""
    later: list[Any] = []

    async def accept(request: Request) -> JSONResponse:
        async def job() -> None:
            await gate.wait()
            async with effect_transaction(store.engine) as effect:
                await effect.conn.execute(sa.text("SELECT 1"))

        later.append(asyncio.get_running_loop().create_task(job()))
        return JSONResponse({"accepted": True}, status_code=202)

    gate = asyncio.Event()
    routes = [Route("/jobs", accept, methods=["POST"])]
    app = IdempotencyMiddleware(Starlette(routes=routes), store=store, anonymous=True)
    assert await post(app, "/jobs", [(b"fencing-token", b"3")]) == (202, {"accepted": True})
    resource = scoped_key("", "k-1")  # the anonymous caller's copy of the resource (the key)
    async with fenced_write(store.engine, resource, 4):
        pass
    gate.set()
    with pytest.raises(StaleFencingTokenError):  # KeyTakenOverError before: the settled key taken for lost
        await later[0]
    async with store.engine.connect() as conn:
        assert await read_fence(conn, resource) == 4
