"""The idempotency middleware in a real Starlette app served by uvicorn on 127.0.0.1.

The service keeps its keys, fences and its own ``publications`` table in one database, a SQLite
file or a PostgreSQL database. Executions are counted in that table (one row per write) and, for
handlers that write nothing, in the handler's own counter. ``/articles/...`` commits its write with its
key (``effect_transaction``); ``/streamed/...`` too, then streams its answer; ``/plain/...`` writes in a
transaction of its own, as a service that does not use the helper does. Time is injected through the
middleware's ``clock``; nothing sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentlease.demo.downstream import serve_app
from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import MAX_RESOURCE_KEY_LENGTH, advance_fence, fenced_write, read_fence
from agentlease.idempotency import IdempotencyMiddleware, IdempotencyStore, effect_transaction, request_path
from agentlease.idempotency.convention import scoped_key
from tests.eventually import assert_eventually

_tables = MetaData()
publications = Table(
    "publications",
    _tables,
    Column("publication_id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(255), nullable=False),
    Column("article_id", String(64), nullable=False),
    Column("title", String(200), nullable=False),
    Column("generation", BigInteger),
)

RETENTION = timedelta(milliseconds=50)
LOCK_TIMEOUT = timedelta(seconds=5)


class FakeClock:
    """The middleware's clock: frozen until a test moves it."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta) -> None:
        self.now += by


class CutShort(Response):
    """A response that starts its body and returns without ending it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"progress: ", "more_body": True})


class Publisher:
    """The service's handlers. A write checks the fence again inside its own transaction."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.entered = 0
        self.streaming = 0
        self.ticking = 0  # a stream that lasts until its client leaves: started, and ended
        self.ticked_out = 0
        self.failures = 0
        self.acted = 0  # effects made outside the service's database
        self.hold_next = False
        self.gate = asyncio.Event()

    async def _held(self) -> None:
        self.entered += 1
        if self.hold_next:
            self.hold_next = False
            await self.gate.wait()

    async def _insert(self, conn: AsyncConnection, request: Request) -> JSONResponse:
        payload = await request.json()
        fencing = request.state.fencing
        publication_id = (
            await conn.execute(
                insert(publications)
                .values(
                    idempotency_key=request.state.idempotency_key,
                    article_id=request.path_params["article_id"],
                    title=payload["title"],
                    generation=None if fencing is None else fencing.generation,
                )
                .returning(publications.c.publication_id)
            )
        ).scalar_one()
        return JSONResponse(
            {"publication_id": publication_id, "title": payload["title"]},
            status_code=201,
            headers={"Location": f"/articles/{request.path_params['article_id']}/{publication_id}"},
        )

    async def publish(self, request: Request) -> JSONResponse:
        """The write and its key commit together; the fence is checked inside that transaction."""
        await self._held()
        async with effect_transaction(self.engine) as effect:
            answer = await self._insert(effect.conn, request)
            effect.done(answer)
        return answer

    async def publish_streamed(self, request: Request) -> StreamingResponse:
        """Commits as ``publish`` does, then streams the same answer, held at the gate before its body."""
        async with effect_transaction(self.engine) as effect:
            answer = await self._insert(effect.conn, request)
            effect.done(answer)

        async def body() -> AsyncIterator[bytes]:
            self.streaming += 1
            await self.gate.wait()
            yield bytes(answer.body)

        return StreamingResponse(body(), status_code=201, media_type="application/json")

    async def tick(self, request: Request) -> StreamingResponse:
        """Streams until its client leaves (as server-sent events do), with no effect."""

        async def body() -> AsyncIterator[bytes]:
            self.ticking += 1
            try:
                yield b"tick\n"
                await asyncio.Event().wait()  # no end of its own
            finally:
                self.ticked_out += 1

        return StreamingResponse(body(), media_type="text/plain")

    async def publish_cut_short(self, request: Request) -> Response:
        """Commits as ``publish`` does, then answers with a response whose body never ends."""
        async with effect_transaction(self.engine) as effect:
            effect.done(await self._insert(effect.conn, request))
        return CutShort()

    async def publish_plain(self, request: Request) -> JSONResponse:
        """The write in a transaction of its own, with its own fence check (no helper)."""
        await self._held()
        fencing = request.state.fencing
        async with self.engine.begin() as conn:
            if fencing is not None:
                await advance_fence(conn, fencing.resource_key, fencing.generation)
            return await self._insert(conn, request)

    async def acted_then_fenced(self, request: Request) -> JSONResponse:
        """An effect elsewhere first (``acted``), then its own fence checked: a refusal caught and answered 500."""
        self.acted += 1
        await self._held()
        fencing = request.state.fencing
        try:
            async with fenced_write(self.engine, fencing.resource_key, fencing.generation):
                pass
        except StaleFencingTokenError:
            return JSONResponse({"error": "superseded after acting"}, status_code=500)
        return JSONResponse({"acted": self.acted}, status_code=201)

    async def fenced_elsewhere(self, request: Request) -> JSONResponse:
        """Its write committed in a plain transaction, then another resource's fence refuses it, raised."""
        async with self.engine.begin() as conn:
            await self._insert(conn, request)
        async with fenced_write(self.engine, "another/resource", 1):
            pass
        return JSONResponse({"error": "not reached"}, status_code=500)

    async def unavailable(self, request: Request) -> JSONResponse:
        self.failures += 1
        return JSONResponse({"error": "try later"}, status_code=503)

    async def refused(self, request: Request) -> JSONResponse:
        """A 503 before any effect, and the handler says so: the key is given back."""
        self.failures += 1
        request.state.idempotency.not_applied()
        return JSONResponse({"error": "try later"}, status_code=503)

    async def crash(self, request: Request) -> JSONResponse:
        self.failures += 1
        raise RuntimeError("handler crashed")

    async def count(self, request: Request) -> JSONResponse:
        return JSONResponse({"publications": await self.executions()})

    async def executions(self, key: str | None = None) -> int:
        query = select(func.count()).select_from(publications)
        if key is not None:
            query = query.where(publications.c.idempotency_key == key)
        async with self.engine.connect() as conn:
            return (await conn.execute(query)).scalar_one()


class ClientWatch:
    """Outermost layer of the service: counts the requests whose client the server reported gone before their
    answer was sent. Once a request's body is in, it reads the server's ``receive`` itself, and hands the app
    an ``http.disconnect`` when that came, as the server would."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.gone = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = anyio.Event()
        body_in = answered = False

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.gone += 0 if answered else 1
            disconnected.set()

        async def sending(message: Message) -> None:
            nonlocal answered
            answered = answered or (message["type"] == "http.response.body" and not message.get("more_body"))
            await send(message)

        async def relayed() -> Message:
            nonlocal body_in
            if body_in:
                await disconnected.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_in = True
                tasks.start_soon(watch)
            return message

        async with anyio.create_task_group() as tasks:
            await self.app(scope, relayed, sending)
            tasks.cancel_scope.cancel()


@dataclass
class Service:
    client: httpx.AsyncClient
    publisher: Publisher
    store: IdempotencyStore
    clock: FakeClock
    watch: ClientWatch

    async def post(
        self, path: str, key: str | None, body: dict[str, Any], *, token: int | None = None, **headers: str
    ) -> httpx.Response:
        sent = {name.replace("_", "-"): value for name, value in headers.items()}
        if key is not None:
            sent["Idempotency-Key"] = key
        if token is not None:
            sent["Fencing-Token"] = str(token)
        return await self.client.post(path, json=body, headers=sent)


@asynccontextmanager
async def running_service(url: str, **options: Any) -> AsyncIterator[Service]:
    """Create the service's tables at startup, as a downstream does, and serve it on a loopback port."""
    store = IdempotencyStore.from_url(url, retention=RETENTION, lock_timeout=LOCK_TIMEOUT)
    clock = FakeClock()
    try:
        await store.create_tables()
        async with store.engine.begin() as conn:
            await conn.run_sync(_tables.create_all)
        publisher = Publisher(store.engine)
        app = Starlette(
            routes=[
                Route("/articles/{article_id}", publisher.publish, methods=["POST", "PUT"]),
                Route("/streamed/{article_id}", publisher.publish_streamed, methods=["POST"]),
                Route("/cut/{article_id}", publisher.publish_cut_short, methods=["POST"]),
                Route("/ticking", publisher.tick, methods=["POST"]),
                Route("/plain/{article_id}", publisher.publish_plain, methods=["POST"]),
                Route("/articles", publisher.count, methods=["GET"]),
                Route("/acted-then-fenced", publisher.acted_then_fenced, methods=["POST"]),
                Route("/fenced-elsewhere/{article_id}", publisher.fenced_elsewhere, methods=["POST"]),
                Route("/unavailable", publisher.unavailable, methods=["POST"]),
                Route("/refused", publisher.refused, methods=["POST"]),
                Route("/crash", publisher.crash, methods=["POST"]),
            ],
            middleware=[Middleware(IdempotencyMiddleware, store=store, clock=clock, **{"anonymous": True, **options})],
        )
        watch = ClientWatch(app)
        async with serve_app(watch) as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            yield Service(client, publisher, store, clock, watch)
    finally:
        await store.close()


def is_replay(response: httpx.Response) -> bool:
    return response.headers.get("idempotent-replayed") == "true"


async def test_fifty_concurrent_requests_with_one_key_execute_once(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        body = {"title": "race"}
        responses = await asyncio.gather(*(svc.post("/articles/1", "k-race", body, token=1) for _ in range(50)))

        assert await svc.publisher.executions("k-race") == 1
        first = [r for r in responses if r.status_code == 201 and not is_replay(r)]
        replays = [r for r in responses if is_replay(r)]
        busy = [r for r in responses if r.status_code == 409]
        assert len(first) == 1, [r.status_code for r in responses]
        assert len(first) + len(replays) + len(busy) == 50, [r.status_code for r in responses]
        for replay in replays:
            assert (replay.status_code, replay.content) == (201, first[0].content)
            assert replay.headers["location"] == first[0].headers["location"]
        for refused in busy:
            assert refused.json()["error"] == "idempotency_key_in_flight"

        after = await svc.post("/articles/1", "k-race", body, token=1)
        assert is_replay(after) and (after.status_code, after.content) == (201, first[0].content)
        assert await svc.publisher.executions() == 1


async def test_a_key_in_flight_gets_409_and_then_the_replay(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        svc.publisher.hold_next = True
        first = asyncio.create_task(svc.post("/articles/2", "k-held", {"title": "held"}))
        await assert_eventually(lambda: svc.publisher.entered == 1, message="the first request reached the handler")

        busy = await svc.post("/articles/2", "k-held", {"title": "held"})
        assert busy.status_code == 409 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"] == "idempotency_key_in_flight"
        other = await svc.post("/articles/2", "k-held", {"title": "other"})
        assert (other.status_code, other.json()["error"]) == (422, "idempotency_key_reused")

        svc.publisher.gate.set()
        done = await first
        assert done.status_code == 201 and not is_replay(done)
        again = await svc.post("/articles/2", "k-held", {"title": "held"})
        assert is_replay(again) and again.json() == done.json()
        assert (svc.publisher.entered, await svc.publisher.executions()) == (1, 1)


async def test_the_same_key_with_other_arguments_gets_422(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        assert (await svc.post("/articles/3", "k-args", {"title": "one"})).status_code == 201
        other_arguments = [
            ("/articles/3", {"title": "two"}),
            ("/articles/4", {"title": "one"}),
            ("/articles/3?x=1", {"title": "one"}),
        ]
        for path, body in other_arguments:
            reused = await svc.post(path, "k-args", body)
            assert reused.status_code == 422, path
            assert reused.json()["error"] == "idempotency_key_reused"
        put = await svc.client.put("/articles/3", json={"title": "one"}, headers={"Idempotency-Key": "k-args"})
        assert put.status_code == 422
        assert await svc.publisher.executions() == 1


async def test_stale_fencing_tokens_get_409_and_newer_ones_pass(ledger_url: str) -> None:
    async with running_service(ledger_url, resource_for=request_path) as svc:  # this service fences its routes
        assert (await svc.post("/articles/7", "k-a", {"title": "v5"}, token=5)).status_code == 201

        stale = await svc.post("/articles/7", "k-b", {"title": "v3"}, token=3)
        assert stale.status_code == 409
        assert {k: v for k, v in stale.json().items() if k != "detail"} == {
            "error": "stale_fencing_token",
            "resource": "/articles/7",
            "generation": 3,
            "current_generation": 5,
        }
        assert await svc.publisher.executions("k-b") == 0

        # The refusal stored nothing: the action's next attempt (same key, newer token) runs.
        newer = await svc.post("/articles/7", "k-b", {"title": "v3"}, token=6)
        assert newer.status_code == 201 and not is_replay(newer)
        assert (await svc.post("/articles/7", "k-c", {"title": "v6"}, token=6)).status_code == 201  # equal passes
        # Another path is another resource; a client's Fencing-Resource header does not name another
        # one where the service names its resources (docs/edge.md).
        assert (await svc.post("/articles/8", "k-d", {"title": "x"}, token=1)).status_code == 201
        named = await svc.post("/articles/9", "k-e", {"title": "x"}, token=2, Fencing_Resource="/articles/7")
        assert named.status_code == 201
        # An older token is refused before a completed key is looked at: a superseded holder learns it lost.
        older = await svc.post("/articles/7", "k-a", {"title": "v5"}, token=1)
        assert (older.status_code, older.json()["error"]) == (409, "stale_fencing_token")

        async with svc.store.engine.connect() as conn:
            rows = (await conn.execute(select(publications.c.idempotency_key, publications.c.generation))).all()
        assert sorted(rows) == [("k-a", 5), ("k-b", 6), ("k-c", 6), ("k-d", 1), ("k-e", 2)]


def anonymous(resource: str) -> str:
    """The stored name of ``resource`` fenced by a caller with no credentials (``anonymous=True``)."""
    return scoped_key("", resource, limit=MAX_RESOURCE_KEY_LENGTH)


async def test_the_default_fence_is_the_action_not_the_route(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        # Two bookings posted to one collection route, by two actions: each its own fence.
        assert (await svc.post("/articles/1", "booking-a", {"title": "a"}, token=2)).status_code == 201
        assert (await svc.post("/articles/1", "booking-b", {"title": "b"}, token=1)).status_code == 201
        # Within one action, an older generation after a newer one is refused.
        assert (await svc.post("/articles/1", "booking-c", {"title": "c"}, token=3, Fencing_Resource="r-c")).is_success
        stale = await svc.post("/articles/1", "booking-c", {"title": "c"}, token=2, Fencing_Resource="r-c")
        assert (stale.status_code, stale.json()["resource"]) == (409, "r-c")
        async with svc.store.engine.connect() as conn:
            named = ("booking-a", "booking-b", "r-c", "/articles/1")
            fences = {key: await read_fence(conn, anonymous(key)) for key in named}
        assert fences == {"booking-a": 2, "booking-b": 1, "r-c": 3, "/articles/1": None}
        assert await svc.publisher.executions() == 3


async def test_a_handler_that_acted_before_its_own_fence_was_refused_leaves_its_key_in_doubt(ledger_url: str) -> None:
    """The handler's effect came before its fence check, so the refusal proves nothing of it: the 500 it answers
    holds the key in doubt, and the newer generation's retry is refused ``idempotency_key_in_doubt``, not run a
    second time (G11)."""
    async with running_service(ledger_url) as svc:
        svc.publisher.hold_next = True
        older = asyncio.create_task(svc.post("/acted-then-fenced", "k-acted", {}, token=1))
        await assert_eventually(lambda: svc.publisher.entered == 1, message="generation 1 acted")
        busy = await svc.post("/acted-then-fenced", "k-acted", {}, token=2)  # moves the fence
        assert (busy.status_code, busy.json()["error"]) == (409, "idempotency_key_in_flight")
        svc.publisher.gate.set()
        assert (await older).status_code == 500
        retry = await svc.post("/acted-then-fenced", "k-acted", {}, token=2)
        assert (retry.status_code, retry.json()["error"]) == (409, "idempotency_key_in_doubt")
        assert svc.publisher.acted == 1


async def test_another_resources_refused_fence_after_the_write_leaves_the_key_in_doubt(ledger_url: str) -> None:
    """A refusal of another resource's fence, raised after the handler's write committed, says nothing of this
    call: a 500 (not this call's ``stale_fencing_token``), the key in doubt, the write never made again (G11)."""
    async with running_service(ledger_url) as svc:
        async with fenced_write(svc.store.engine, "another/resource", 100):
            pass
        failed = await svc.post("/fenced-elsewhere/7", "k-elsewhere", {"title": "t"}, token=1)
        assert failed.status_code == 500, failed.text
        retry = await svc.post("/fenced-elsewhere/7", "k-elsewhere", {"title": "t"}, token=1)
        assert (retry.status_code, retry.json()["error"]) == (409, "idempotency_key_in_doubt")
        assert await svc.publisher.executions("k-elsewhere") == 1


async def test_a_newer_generation_moves_the_fence_while_an_older_request_is_inside(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        svc.publisher.hold_next = True  # generation 1 is inside the service, before its commit
        first = asyncio.create_task(svc.post("/articles/5", "k-gen", {"title": "t"}, token=1))
        await assert_eventually(lambda: svc.publisher.entered == 1, message="generation 1 reached the handler")
        for newer in (2, 3):
            busy = await svc.post("/articles/5", "k-gen", {"title": "t"}, token=newer)
            assert (busy.status_code, busy.json()["error"]) == (409, "idempotency_key_in_flight")
        async with svc.store.engine.connect() as conn:
            # moved while generation 1 was inside (the anonymous caller's copy of the resource)
            assert await read_fence(conn, anonymous("k-gen")) == 3

        svc.publisher.gate.set()
        late = await first
        assert (late.status_code, late.json()["error"], late.json()["current_generation"]) == (
            409,
            "stale_fencing_token",
            3,
        )
        assert late.json()["resource"] == "k-gen"  # as the client named it, not the caller's copy
        assert "'k-gen'" in late.json()["detail"], late.json()
        assert await svc.publisher.executions("k-gen") == 0  # its commit was refused inside its transaction

        third = await svc.post("/articles/5", "k-gen", {"title": "t"}, token=3)  # the key was given back
        assert third.status_code == 201 and not is_replay(third)
        assert await svc.publisher.executions("k-gen") == 1


async def test_expired_keys_can_be_reused(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        first = await svc.post("/articles/5", "k-old", {"title": "first"})
        assert first.status_code == 201
        svc.clock.advance(RETENTION - timedelta(milliseconds=1))
        assert is_replay(await svc.post("/articles/5", "k-old", {"title": "first"}))
        assert (await svc.post("/articles/5", "k-old", {"title": "second"})).status_code == 422

        svc.clock.advance(timedelta(milliseconds=1))  # the retention has passed
        reused = await svc.post("/articles/5", "k-old", {"title": "second"})
        assert reused.status_code == 201 and not is_replay(reused)
        assert reused.json()["publication_id"] != first.json()["publication_id"]
        assert await svc.publisher.executions("k-old") == 2

        svc.clock.advance(RETENTION)
        assert await svc.store.purge_expired(now=svc.clock()) == 1
        assert await svc.store.purge_expired(now=svc.clock()) == 0


async def test_a_holder_past_its_lock_leaves_its_key_in_doubt_never_run_twice(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        svc.publisher.hold_next = True  # a handler whose write does not commit with its key, and hangs
        stuck = asyncio.create_task(svc.post("/plain/6", "k-stuck", {"title": "t"}))
        await assert_eventually(lambda: svc.publisher.entered == 1, message="the first request reached the handler")
        assert (await svc.post("/plain/6", "k-stuck", {"title": "t"})).status_code == 409

        svc.clock.advance(LOCK_TIMEOUT)
        doubt = await svc.post("/plain/6", "k-stuck", {"title": "t"})
        assert (doubt.status_code, doubt.json()["error"]) == (409, "idempotency_key_in_doubt")
        assert svc.publisher.entered == 1  # not run again: it may have acted

        svc.publisher.gate.set()
        late = await stuck
        assert late.status_code == 201  # its late answer settles the doubt: the key is done with it
        replay = await svc.post("/plain/6", "k-stuck", {"title": "t"})
        assert is_replay(replay) and replay.json() == late.json()
        assert await svc.publisher.executions("k-stuck") == 1


async def test_a_holder_that_commits_with_its_key_is_taken_over_and_its_late_commit_refused(ledger_url: str) -> None:
    async with running_service(ledger_url, commits_with_key=True) as svc:
        svc.publisher.hold_next = True  # stands for a handler whose process hangs before its commit
        stuck = asyncio.create_task(svc.post("/articles/6", "k-stuck", {"title": "t"}))
        await assert_eventually(lambda: svc.publisher.entered == 1, message="the first request reached the handler")
        assert (await svc.post("/articles/6", "k-stuck", {"title": "t"})).status_code == 409

        svc.clock.advance(LOCK_TIMEOUT)
        takeover = await svc.post("/articles/6", "k-stuck", {"title": "t"})
        assert takeover.status_code == 201 and not is_replay(takeover)

        svc.publisher.gate.set()
        late = await stuck
        assert late.status_code == 500  # its commit found the key taken over and rolled back
        replay = await svc.post("/articles/6", "k-stuck", {"title": "t"})
        assert is_replay(replay) and replay.json() == takeover.json()
        assert await svc.publisher.executions("k-stuck") == 1


async def test_a_failure_holds_the_key_in_doubt_unless_the_handler_says_it_had_no_effect(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        for path, key in (("/unavailable", "k-503"), ("/crash", "k-500")):
            first = await svc.post(path, key, {"title": "t"})
            assert first.status_code in (500, 503) and not is_replay(first)
            again = await svc.post(path, key, {"title": "t"})
            assert (again.status_code, again.json()["error"]) == (409, "idempotency_key_in_doubt"), path
        assert svc.publisher.failures == 2  # neither ran twice
        for expected in (3, 4):  # a handler that says it had no effect gives its key back
            refused = await svc.post("/refused", "k-refused", {"title": "t"})
            assert refused.status_code == 503 and svc.publisher.failures == expected

        # The service's owner settles a doubt: it did not happen, so the key runs again.
        assert await svc.store.resolve(scoped_key("", "k-503"), applied=False)
        assert (await svc.post("/unavailable", "k-503", {"title": "t"})).status_code == 503
        assert svc.publisher.failures == 5


async def test_an_answer_is_stored_although_its_client_went_away(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        svc.publisher.hold_next = True
        gone = asyncio.create_task(svc.post("/articles/11", "k-gone", {"title": "t"}))
        await assert_eventually(lambda: svc.publisher.entered == 1, message="the request reached the handler")
        gone.cancel()  # the client drops its connection while the handler runs
        with pytest.raises(asyncio.CancelledError):
            await gone
        svc.publisher.gate.set()

        async def answered() -> None:
            again = await svc.post("/articles/11", "k-gone", {"title": "t"})
            assert is_replay(again), again.json()

        await assert_eventually(answered, timeout=10, message="the handler's answer was stored")
        assert await svc.publisher.executions("k-gone") == 1


async def test_a_streamed_answer_whose_client_went_away_after_the_commit_leaves_the_committed_one(
    ledger_url: str,
) -> None:
    """G11: a key committed with its effect is done with an answer, whatever happens after; the handler's own
    answer, streamed after the commit and cut short when its client goes, never replaces it: a retry gets the
    answer committed with the effect, whole."""
    async with running_service(ledger_url) as svc:
        gone = asyncio.create_task(svc.post("/streamed/12", "k-stream", {"title": "t"}))
        await assert_eventually(lambda: svc.publisher.streaming == 1, message="the handler committed and streams")
        gone.cancel()  # the client drops its connection while the answer streams
        with pytest.raises(asyncio.CancelledError):
            await gone
        await assert_eventually(lambda: svc.watch.gone == 1, message="the server reported the client gone")
        svc.publisher.gate.set()

        async def replayed() -> httpx.Response:
            again = await svc.post("/streamed/12", "k-stream", {"title": "t"})
            assert is_replay(again), again.text
            return again

        replay = await assert_eventually(replayed, timeout=10, message="the handler's answer was stored")
        assert (replay.status_code, replay.headers["content-type"]) == (201, "application/json")
        assert replay.content, "the stored answer was replaced by one cut short"
        assert replay.json() == {"publication_id": 1, "title": "t"}
        assert await svc.publisher.executions("k-stream") == 1


async def test_a_handler_that_streams_until_its_client_leaves_ends_when_it_leaves(ledger_url: str) -> None:
    """The handler hears of its client's disconnect once the body is read: a stream with no end of its own stops
    then, instead of running, and buffering, for ever."""
    async with running_service(ledger_url) as svc:
        gone = asyncio.create_task(svc.post("/ticking", "k-tick", {"title": "t"}))
        await assert_eventually(lambda: svc.publisher.ticking == 1, message="the handler streams")
        gone.cancel()  # the client leaves
        with pytest.raises(asyncio.CancelledError):
            await gone
        await assert_eventually(lambda: svc.publisher.ticked_out == 1, message="the handler ended as its client left")


async def test_an_answer_cut_short_never_replaces_the_one_committed_with_the_effect(ledger_url: str) -> None:
    """G11: only a whole response replaces the answer stored in the effect's commit."""
    async with running_service(ledger_url) as svc:
        with pytest.raises(httpx.RemoteProtocolError):  # the answer's body never ended
            await svc.post("/cut/13", "k-cut", {"title": "t"})
        replay = await svc.post("/cut/13", "k-cut", {"title": "t"})
        assert is_replay(replay) and replay.status_code == 201, replay.content
        assert replay.json() == {"publication_id": 1, "title": "t"}
        assert await svc.publisher.executions("k-cut") == 1


async def test_reads_pass_and_malformed_writes_get_400(ledger_url: str) -> None:
    async with running_service(ledger_url) as svc:
        read = await svc.client.get("/articles")
        assert (read.status_code, read.json()) == (200, {"publications": 0})
        assert "idempotent-replayed" not in read.headers

        cases = [
            ({}, "missing_idempotency_key"),
            ({"Idempotency-Key": ""}, "invalid_idempotency_key"),
            ({"Idempotency-Key": "k", "Fencing-Token": "-1"}, "invalid_fencing_token"),
            ({"Idempotency-Key": "k", "Fencing-Token": "seven"}, "invalid_fencing_token"),
            ({"Idempotency-Key": "k", "Fencing-Token": "1", "Fencing-Resource": "x" * 401}, "invalid_fencing_resource"),
        ]
        for headers, code in cases:
            refused = await svc.client.post("/articles/1", json={"title": "t"}, headers=headers)
            assert (refused.status_code, refused.json()["error"]) == (400, code), headers
        repeated = await svc.client.post(
            "/articles/1", json={"title": "t"}, headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
        )
        assert (repeated.status_code, repeated.json()["error"]) == (400, "repeated_idempotency_key")
        quoted = await svc.client.post("/articles/1", json={"title": "t"}, headers={"Idempotency-Key": '"k-q"'})
        assert quoted.status_code == 201
        assert is_replay(await svc.post("/articles/1", "k-q", {"title": "t"}))  # the same key, bare
        assert await svc.publisher.executions() == 1


async def test_a_service_can_require_the_fencing_token(sqlite_url: str) -> None:
    async with running_service(sqlite_url, require_fencing_token=True) as svc:
        refused = await svc.post("/articles/1", "k-t", {"title": "t"})
        assert (refused.status_code, refused.json()["error"]) == (400, "missing_fencing_token")
        assert (await svc.post("/articles/1", "k-t", {"title": "t"}, token=1)).status_code == 201


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-1)])
def test_store_durations_must_be_positive(sqlite_url: str, bad: timedelta) -> None:
    with pytest.raises(ValueError, match="retention"):
        IdempotencyStore.from_url(sqlite_url, retention=bad)
    with pytest.raises(ValueError, match="lock_timeout"):
        IdempotencyStore.from_url(sqlite_url, lock_timeout=bad)
