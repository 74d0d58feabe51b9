"""A leased tool's ``FencedClient`` fences its writes with no header line in the tool (``docs/edge.md``, "Stamped by
the client"). Real dev server, two in-process workers, and a service guarded by ``IdempotencyMiddleware`` (its key,
fence and table in a SQLite file) that verifies signed tokens.

Worker A holds generation 1 of ``publish`` (its only slot busy, as a paused process) before it sends; worker B
takes over and publishes with generation 2. A's late request, stamped with generation 1, is refused 409 by the
service's fence. The run's next call goes to a host the client does not fence, which gets no header (400 from the
guard); the same function called outside a lease sends none either, and nothing raises. A sync tool's
``httpx.Client`` built with a ``FencingTransport`` is stamped too. The same again with plain httpx clients, the
tools declaring the service with ``fenced=``.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select
from temporalio.client import Client

from agentlease import FencedClient, lease, leased
from agentlease.enums import EventKind
from agentlease.fencing import read_fence
from agentlease.settings import AgentLeaseSettings
from agentlease.tools import FencingTransport, ToolRegistry
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_idempotency_middleware import anonymous, publications, running_service
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

pytestmark = pytest.mark.timeout(180)

FENCING_KEY = "a fencing key both the workers and the service know"
SENT: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
"""``(generation, status, body)`` of each request, by target (in-process workers only)."""
PAUSED: dict[str, asyncio.Event] = {}
"""Opened by the test to let a paused first attempt send its request, by target."""


async def publish(
    service_url: str, target: str, title: str, pause_first_attempt: bool = False, declared: bool = False
) -> dict[str, Any]:
    """Publish an article through the service: the team's code, with no fencing header of its own (``declared``:
    a plain ``httpx.AsyncClient``, the tool declaring ``fenced=``; else a ``FencedClient``)."""
    if pause_first_attempt and lease.context().claim.attempts == 1:  # a paused process notices nothing
        while True:
            try:
                await PAUSED.setdefault(target, asyncio.Event()).wait()
                break
            except asyncio.CancelledError:
                continue
    client_class = httpx.AsyncClient if declared else FencedClient
    async with client_class(base_url=service_url, timeout=30) as http:
        response = await http.post(target, json={"title": title})
    generation = lease.fencing_token() if lease.in_lease() else 0
    SENT.setdefault(target, []).append((generation, response.status_code, response.json()))
    return {"status": response.status_code}


def publish_sync(service_url: str, target: str, title: str, declared: bool = False) -> dict[str, Any]:
    """The same with a sync client (``declared``: plain; else built with a ``FencingTransport``), run in a thread
    that keeps the lease."""
    transport = None if declared else FencingTransport(fenced=[service_url])
    with httpx.Client(base_url=service_url, transport=transport, timeout=30) as http:
        response = http.post(target, json={"title": title})
    SENT.setdefault(target, []).append((lease.fencing_token(), response.status_code, response.json()))
    return {"status": response.status_code}


@pytest.mark.parametrize("declared", [False, True], ids=["fenced-client", "declared-fenced"])
async def test_a_leased_clients_writes_are_fenced_with_no_header_line(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, declared: bool
) -> None:
    run_id = f"ft-{uuid.uuid4().hex[:8]}"
    article = f"/articles/a-{uuid.uuid4().hex[:6]}"
    settings = settings.model_copy(update={"fencing_key": SecretStr(FENCING_KEY)})
    async with AsyncExitStack() as stack:
        service = await stack.enter_async_context(
            running_service(f"sqlite:///{tmp_path}/service.db", fencing_key=FENCING_KEY)
        )
        fenced = str(service.client.base_url)  # http://127.0.0.1:<port>/
        # The same service under a host name the client does not fence.
        elsewhere = fenced.replace("127.0.0.1", "localhost") + f"articles/b-{uuid.uuid4().hex[:6]}"
        declaring = fenced if declared else None
        tool = leased(
            publish,
            side_effect="fenced",
            lease_ttl=timedelta(seconds=2),
            start_to_close=timedelta(minutes=2),
            fenced=declaring,
        )
        sync_tool = leased(publish_sync, side_effect="fenced", lease_ttl=timedelta(seconds=10), fenced=declaring)
        registry = ToolRegistry([tool, sync_tool])
        synced = f"/articles/s-{uuid.uuid4().hex[:6]}"
        how = {"declared": declared}
        plan = _plan(
            run_id,
            (
                "publish",
                "publish",
                {"service_url": fenced, "target": article, "title": "T", "pause_first_attempt": True, **how},
            ),
            ("elsewhere", "publish", {"service_url": fenced, "target": elsewhere, "title": "T", **how}),
            ("sync", "publish_sync", {"service_url": fenced, "target": synced, "title": "T", **how}),
        )
        ledger, ledger_a, ledger_b = [await stack.enter_async_context(opened_ledger(settings)) for _ in "oab"]
        await stack.enter_async_context(_worker(client, ledger_a, settings, "worker-A", slots=1, registry=registry))
        stack.callback(PAUSED.setdefault(article, asyncio.Event()).set)
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

        async def held_by_a() -> None:
            records = await ledger.list_tasks(run_id)
            assert [(r.lease_owner, r.claim_generation) for r in records] == [("worker-A", 1)], records

        await assert_eventually(held_by_a, timeout=30, message="worker A holds generation 1")
        await stack.enter_async_context(_worker(client, ledger_b, settings, "worker-B", registry=registry))

        async def published_by_b() -> None:
            assert [(g, s) for g, s, _ in SENT.get(article, [])] == [(2, 201)], SENT.get(article)

        await assert_eventually(published_by_b, timeout=60, message="worker B publishes with generation 2")

        # A wakes up and sends its request late, stamped with generation 1: the service's fence refuses it.
        PAUSED[article].set()

        async def refused_late() -> None:
            assert len(SENT[article]) == 2, SENT[article]
            generation, status, body = SENT[article][1]
            assert (generation, status, body["error"]) == (1, 409, "stale_fencing_token"), body

        await assert_eventually(refused_late, timeout=60, message="A's late request is refused by the fence")
        result = await asyncio.wait_for(handle.result(), timeout=60)
        assert [t.status.value for t in result.tasks] == ["settled", "settled", "settled"]
        events = await ledger.events(f"{run_id}/publish")
        assert (EventKind.LATE_UNAPPLIED, 1) in [(e.kind, e.claim_generation) for e in events]

        # One publication per fenced call, each with its task's key and generation; the action's fence stands at 2.
        key = f"{run_id}:publish"
        async with service.store.engine.connect() as conn:
            rows = (await conn.execute(select(publications.c.idempotency_key, publications.c.generation))).all()
            fence = await read_fence(conn, anonymous(key))
        assert sorted(tuple(row) for row in rows) == [(key, 2), (f"{run_id}:sync", 1)]
        assert fence == 2
        assert [(g, s) for g, s, _ in SENT[synced]] == [(1, 201)]

        # A host the client does not fence gets no header: the guard asks for the key it did not get.
        [(_, status, body)] = SENT[elsewhere]
        assert (status, body["error"]) == (400, "missing_idempotency_key"), body

        # Outside a lease the same function sends nothing either, and nothing raises.
        outside = f"/articles/c-{uuid.uuid4().hex[:6]}"
        assert await tool(service_url=fenced, target=outside, title="T", declared=declared) == {"status": 400}
        assert SENT[outside][0][2]["error"] == "missing_idempotency_key"


SEEN: dict[str, list[dict[str, str]]] = {}
"""The convention's headers each route of the redirecting service received, by route."""


async def post_redirected(service_url: str, declared: bool) -> dict[str, Any]:
    """A write whose answer is a redirect elsewhere, followed by the client (``follow_redirects=True``)."""
    client_class = httpx.AsyncClient if declared else FencedClient
    async with client_class(base_url=service_url, timeout=30, follow_redirects=True) as http:
        response = await http.post("go", json={})
    return {"status": response.status_code}


@pytest.mark.parametrize("declared", [False, True], ids=["fenced-client", "declared-fenced"])
async def test_a_redirect_elsewhere_does_not_carry_the_stamped_headers(
    client: Client, settings: AgentLeaseSettings, declared: bool
) -> None:
    """A fenced downstream that answers 307 to another host, which answers 307 back to the fenced one: httpx
    copies the request's headers onto each redirected request. The stamp went to the other host too; then, taken
    off there, it was missing from the write the chain ended with at the fenced downstream."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, RedirectResponse, Response
    from starlette.routing import Route

    from agentlease.demo.serving import serve_app
    from agentlease.idempotency.convention import FENCING_TOKEN_HEADER, IDEMPOTENCY_KEY_HEADER

    def seen(route: str, request: Request) -> None:
        names = (IDEMPOTENCY_KEY_HEADER, FENCING_TOKEN_HEADER)
        SEEN.setdefault(route, []).append({n: request.headers[n] for n in names if n in request.headers})

    async def go(request: Request) -> Response:  # fenced: 127.0.0.1
        seen("go", request)
        return RedirectResponse(f"http://localhost:{request.url.port}/hop", status_code=307)  # another host name

    async def hop(request: Request) -> Response:  # the other host
        seen("hop", request)
        return RedirectResponse(f"http://127.0.0.1:{request.url.port}/charge", status_code=307)

    async def charge(request: Request) -> Response:  # fenced again: the write
        seen("charge", request)
        return JSONResponse({"ok": True})

    SEEN.clear()
    routes = [Route(f"/{f.__name__}", f, methods=["POST"]) for f in (go, hop, charge)]
    run_id = f"redirect-{uuid.uuid4().hex[:8]}"
    async with serve_app(Starlette(routes=routes)) as base_url, opened_ledger(settings) as ledger:
        declaring = base_url if declared else None
        tool = leased(post_redirected, side_effect="fenced", lease_ttl=timedelta(seconds=10), fenced=declaring)
        async with _worker(client, ledger, settings, "w", registry=ToolRegistry([tool])):
            plan = _plan(run_id, ("post", "post_redirected", {"service_url": base_url, "declared": declared}))
            result = await client.execute_workflow(
                AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue
            )
    assert [t.status.value for t in result.tasks] == ["settled"]
    stamp = {IDEMPOTENCY_KEY_HEADER: f"{run_id}:post", FENCING_TOKEN_HEADER: "1"}
    assert dict(SEEN) == {"go": [stamp], "hop": [{}], "charge": [stamp]}  # the other host got no header of the lease
