"""Finding 6: the idempotency middleware and the SQL fence, attacked as a client of a downstream.

Keys are the callers' own (tenant B never gets tenant A's stored response, cookies included); a
fencing token must be signed by the ledger's fencing key for the route's own resource (an invented
``9223372036854775807`` is refused instead of blocking the resource; a client cannot name another
resource); a missing token is refused when the service says so; a huge body is 413.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from agentlease.demo.downstream import serve_app
from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import MAX_GENERATION, advance_fence, create_fence_table, read_fence
from agentlease.idempotency import IdempotencyMiddleware, IdempotencyStore, request_path
from agentlease.ledger.engine import create_async_database_engine

KEY = b"a fencing key of the deployment"
_tables = MetaData()
writes = Table(
    "writes",
    _tables,
    Column("write_id", Integer, primary_key=True, autoincrement=True),
    Column("article", String(64), nullable=False),
    Column("generation", BigInteger),
)


@asynccontextmanager
async def service(url: str, **options: Any) -> AsyncIterator[tuple[httpx.AsyncClient, AsyncEngine]]:
    store = IdempotencyStore.from_url(url)
    try:
        await store.create_tables()
        async with store.engine.begin() as conn:
            await conn.run_sync(_tables.create_all)

        async def write(request: Request) -> JSONResponse:
            fencing = request.state.fencing
            async with store.engine.begin() as conn:
                if fencing is not None:
                    await advance_fence(conn, fencing.resource_key, fencing.generation)
                written = (
                    await conn.execute(
                        insert(writes)
                        .values(article=request.path_params["article"], generation=getattr(fencing, "generation", None))
                        .returning(writes.c.write_id)
                    )
                ).scalar_one()
            answer = JSONResponse({"write_id": written, "by": request.headers.get("authorization")}, status_code=201)
            answer.set_cookie("session", f"secret-of-{request.headers.get('authorization')}")
            return answer

        app = Starlette(
            routes=[Route("/articles/{article}", write, methods=["POST"])],
            middleware=[Middleware(IdempotencyMiddleware, store=store, **{"anonymous": True, **options})],
        )
        async with serve_app(app) as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            yield client, store.engine
    finally:
        await store.close()


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(writes))).scalar_one()


async def test_keys_are_per_caller_and_replays_carry_no_cookies(ledger_url: str) -> None:
    async with service(ledger_url) as (client, engine):
        a = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "k", "Authorization": "Bearer A"})
        b = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "k", "Authorization": "Bearer B"})
        again = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "k", "Authorization": "Bearer A"})
        count = await _count(engine)
    assert a.status_code == b.status_code == 201
    assert b.json()["by"] == "Bearer B" and "secret-of-Bearer A" not in b.headers.get("set-cookie", "")
    assert count == 2  # B's request ran for B
    assert again.headers.get("idempotent-replayed") == "true" and again.json() == a.json()
    assert "set-cookie" not in again.headers  # a replay never sets the first answer's cookies


async def test_an_invented_token_is_refused_and_does_not_block_the_resource(ledger_url: str) -> None:
    from agentlease.fencing import sign_fencing_token

    async with service(ledger_url, fencing_key=KEY, require_fencing_token=True, resource_for=request_path) as (
        client,
        engine,
    ):
        invented = await client.post(
            "/articles/1", json={}, headers={"Idempotency-Key": "x", "Fencing-Token": str(MAX_GENERATION)}
        )
        forged = await client.post(
            "/articles/1", json={}, headers={"Idempotency-Key": "y", "Fencing-Token": f"{MAX_GENERATION}.AAAA"}
        )
        missing = await client.post("/articles/1", json={}, headers={"Idempotency-Key": "z"})
        # A token signed for another resource, sent with a Fencing-Resource header naming that one.
        other = sign_fencing_token(KEY, "/articles/2", 7)
        moved = await client.post(
            "/articles/1",
            json={},
            headers={"Idempotency-Key": "w", "Fencing-Token": other, "Fencing-Resource": "/articles/2"},
        )
        legit = await client.post(
            "/articles/1",
            json={},
            headers={"Idempotency-Key": "v", "Fencing-Token": sign_fencing_token(KEY, "/articles/1", 1)},
        )
        count = await _count(engine)
    for refused in (invented, forged, moved):
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_fencing_token", refused.json()
    assert missing.status_code == 400 and missing.json()["error"] == "missing_fencing_token"
    assert legit.status_code == 201, legit.json()  # generation 1 still writes: nothing blocked it
    assert count == 1


async def test_by_default_a_token_verifies_only_for_its_own_action(ledger_url: str) -> None:
    from agentlease.fencing import sign_fencing_token

    async with service(ledger_url, fencing_key=KEY, require_fencing_token=True) as (client, engine):
        borrowed = await client.post(  # another action's token, for this action's key
            "/articles/1",
            json={},
            headers={"Idempotency-Key": "mine", "Fencing-Token": sign_fencing_token(KEY, "x", 9)},
        )
        own = await client.post(
            "/articles/1",
            json={},
            headers={"Idempotency-Key": "mine", "Fencing-Token": sign_fencing_token(KEY, "mine", 1)},
        )
        named = await client.post(  # a resource the client names, with a token made for it
            "/articles/1",
            json={},
            headers={
                "Idempotency-Key": "k2",
                "Fencing-Resource": "r2",
                "Fencing-Token": sign_fencing_token(KEY, "r2", 1),
            },
        )
        count = await _count(engine)
    assert (borrowed.status_code, borrowed.json()["error"]) == (400, "invalid_fencing_token")
    assert own.status_code == named.status_code == 201
    assert count == 2


async def test_a_huge_body_is_413_and_nothing_is_stored(ledger_url: str) -> None:
    async with service(ledger_url, max_body_bytes=1024) as (client, engine):
        huge = await client.post("/articles/1", content=b"x" * 5000, headers={"Idempotency-Key": "big"})
        count = await _count(engine)
    assert huge.status_code == 413 and huge.json()["error"] == "request_too_large"
    assert count == 0


@pytest.mark.parametrize("length", [b"\xb2", b"abc", b"-1"], ids=["superscript-two", "letters", "negative"])
async def test_a_malformed_content_length_is_bounded_like_any_other_never_a_500(sqlite_url: str, length: bytes) -> None:
    """``"²"`` is a digit to ``str.isdigit``, not to ``int``: a ``Content-Length`` of it is malformed as ``abc`` is.
    The middleware ignores such a length and reads the body under its bound. Driven as ASGI: uvicorn refuses
    such a header itself, another server may pass it on."""
    store = IdempotencyStore.from_url(sqlite_url)
    try:
        await store.create_tables()

        async def echo(request: Request) -> JSONResponse:
            return JSONResponse({"bytes": len(await request.body())}, status_code=201)

        routes = [Route("/echo", echo, methods=["POST"])]
        app = IdempotencyMiddleware(Starlette(routes=routes), store=store, anonymous=True, max_body_bytes=16)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as http:
            small = await http.post(
                "/echo", content=b"{}", headers={b"Idempotency-Key": b"s", b"Content-Length": length}
            )
            large = await http.post(
                "/echo", content=b"x" * 17, headers={b"Idempotency-Key": b"l", b"Content-Length": length}
            )
    finally:
        await store.close()
    assert (small.status_code, small.json()) == (201, {"bytes": 2})
    assert (large.status_code, large.json()["error"]) == (413, "request_too_large")


async def test_a_file_answer_is_stored_whole_where_the_server_could_send_files_itself(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A server that offers ``http.response.pathsend`` (an app hands it a file's path, not its bytes): the guarded
    handler does not see the extension, so its ``FileResponse`` sends its bytes, which are stored with the key,
    and the retry gets them."""
    receipt = tmp_path / "receipt.txt"
    receipt.write_text("receipt 42\n")
    runs: list[int] = []

    async def export(request: Request) -> FileResponse:
        runs.append(1)
        return FileResponse(receipt)

    store = IdempotencyStore.from_url(sqlite_url)
    try:
        await store.create_tables()
        guarded = IdempotencyMiddleware(
            Starlette(routes=[Route("/export", export, methods=["POST"])]), store=store, anonymous=True
        )

        async def server(scope: Scope, receive: Receive, send: Send) -> None:
            """The server's side of the extension: it offers it, and sends a path's bytes for the app."""

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.pathsend":
                    message = {"type": "http.response.body", "body": Path(message["path"]).read_bytes()}
                await send(message)

            await guarded({**scope, "extensions": {"http.response.pathsend": {}}}, receive, sending)

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://svc") as http:
            first = await http.post("/export", json={}, headers={"Idempotency-Key": "k-file"})
            again = await http.post("/export", json={}, headers={"Idempotency-Key": "k-file"})
    finally:
        await store.close()
    assert (first.status_code, first.text) == (200, "receipt 42\n")
    assert (again.status_code, again.text, again.headers.get("idempotent-replayed")) == (200, "receipt 42\n", "true")
    assert runs == [1]


async def test_the_sql_fence_with_a_key_takes_only_signed_tokens(ledger_url: str) -> None:
    from agentlease.errors import InvalidFencingTokenError
    from agentlease.fencing import sign_fencing_token

    engine = create_async_database_engine(ledger_url)
    try:
        await create_fence_table(engine)
        for invented in (MAX_GENERATION, f"{MAX_GENERATION}.AAAA", sign_fencing_token(KEY, "docs/other", 9)):
            with pytest.raises(InvalidFencingTokenError):
                async with engine.begin() as conn:
                    await advance_fence(conn, "docs/1", invented, fencing_key=KEY)
        async with engine.begin() as conn:
            await advance_fence(conn, "docs/1", sign_fencing_token(KEY, "docs/1", 3), fencing_key=KEY)
            assert await read_fence(conn, "docs/1") == 3
        with pytest.raises(StaleFencingTokenError):
            async with engine.begin() as conn:
                await advance_fence(conn, "docs/1", sign_fencing_token(KEY, "docs/1", 2), fencing_key=KEY)
    finally:
        await engine.dispose()


async def test_http_publish_signs_its_token_for_a_downstream_with_the_fencing_key(
    client: Any, attack_settings: Any, tmp_path: Path
) -> None:
    """End to end: a worker with the fencing key publishes through a downstream that requires signed
    tokens; a client without the key cannot write there, whatever generation it invents."""
    from agentlease.demo.downstream import running_downstream
    from agentlease.ledger.migrate import upgrade
    from agentlease.ledger.store import Ledger
    from agentlease.records import AgentRunPlan, PlanStep
    from agentlease.workflow._plan import AgentRunWorkflow
    from tests.security.conftest import victim_worker

    async with running_downstream(tmp_path / "downstream", fencing_key=KEY) as downstream:
        signing = attack_settings.model_copy(
            update={"publish_base_url": downstream.publish_base_url, "fencing_key": SecretStr(KEY.decode())}
        )
        ledger = Ledger.from_url(signing.ledger_url)
        await upgrade(ledger.database)
        run_id = f"publish-{uuid.uuid4().hex[:8]}"
        post = {"slug": "signed", "title": "Signed", "body": "A fenced write with a signed token."}
        try:
            async with victim_worker(client, ledger, signing):
                result = await client.execute_workflow(
                    AgentRunWorkflow.run,
                    AgentRunPlan(
                        agent_run_id=run_id, steps=[PlanStep(step_id="p", tool="http_publish", arguments=post)]
                    ),
                    id=run_id,
                    task_queue=signing.task_queue,
                )
        finally:
            await ledger.close()
        async with httpx.AsyncClient(base_url=downstream.publish_base_url) as http:
            forged = await http.post(
                "posts",
                json={**post, "slug": "forged"},
                headers={
                    "Idempotency-Key": "forged",
                    "Fencing-Token": str(MAX_GENERATION),
                    "Fencing-Resource": "posts/forged/forged",
                },
            )
    [view] = result.tasks
    assert view.status == "settled" and view.receipt is not None, view
    assert forged.status_code == 400 and forged.json()["error"] == "invalid_fencing_token", forged.json()
