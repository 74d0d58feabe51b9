"""What a downstream's answer means to the attempt that got it, through the documented
``response.raise_for_status()`` (``docs/edge.md``). "Still executing" (409 ``idempotency_key_in_flight``) is waited
for inside the attempt: no real attempt is spent, no new claim generation taken, never a dead letter. A refusal of
the caller (401) blocks the call after that one attempt: nothing ran, so nothing is held in doubt.

The downstream is a real HTTP service on 127.0.0.1; the tool is ``busy_downstream_charge`` (``max_attempts=2``).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio.client import Client

from agentlease.demo.downstream import serve_app
from agentlease.enums import ErrorClass, EventKind, TaskStatus
from agentlease.idempotency import IdempotencyMiddleware, IdempotencyStore
from agentlease.records import TaskRecord
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

BUSY_ANSWERS = 6
"""How many times the downstream says "still executing" before it charges: three times ``max_attempts``."""


async def test_a_busy_downstream_is_waited_for_without_spending_attempts(
    client: Client, settings: AgentLeaseSettings
) -> None:
    seen: list[str | None] = []

    async def charge(request: Request) -> JSONResponse:
        seen.append(request.headers.get("fencing-token"))
        if len(seen) <= BUSY_ANSWERS:
            busy = {"error": "idempotency_key_in_flight", "detail": "a request with this key is still executing"}
            return JSONResponse(busy, status_code=409, headers={"Retry-After": "0.05"})
        return JSONResponse({"charge_id": 7}, status_code=201)

    run_id = f"busy-{uuid.uuid4().hex[:8]}"
    app = Starlette(routes=[Route("/charges", charge, methods=["POST"])])
    async with serve_app(app) as base_url, opened_ledger(settings) as ledger, _worker(client, ledger, settings, "w"):
        plan = _plan(run_id, ("charge", "busy_downstream_charge", {"url": f"{base_url}charges"}))
        run = await client.execute_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        task = await ledger.get_task(f"{run_id}/charge")
        events = await ledger.events(task.task_id)

    assert len(seen) == BUSY_ANSWERS + 1 and set(seen) == {"1"}  # one generation asked every time
    assert (task.status, task.claim_generation, task.attempts) == (TaskStatus.SETTLED, 1, 1)
    waits = [e for e in events if e.kind is EventKind.RENEWED and "still executing" in (e.reason or "")]
    assert len(waits) == BUSY_ANSWERS
    assert [e.kind for e in events if e.kind in (EventKind.CLAIMED, EventKind.RELEASED)] == [EventKind.CLAIMED]
    assert [t.status for t in run.tasks] == ["settled"]


async def _parked_charge(client: Client, settings: AgentLeaseSettings, app: Starlette, run_id: str) -> TaskRecord:
    """Run ``busy_downstream_charge`` against ``app`` (its ``/charges``) until the call waits for a person; the
    task as the ledger then holds it (the run is terminated)."""
    async with serve_app(app) as base_url, opened_ledger(settings) as ledger:
        async with _worker(client, ledger, settings, "w"):
            plan = _plan(run_id, ("charge", "busy_downstream_charge", {"url": f"{base_url}charges"}))
            run = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

            async def parked() -> bool:
                tasks = await ledger.list_tasks(run_id)
                return bool(tasks) and tasks[0].status.waits_for_person

            await assert_eventually(parked, timeout=60, message="the call waits for a person")
            await run.terminate("the test saw what it waited for")
        return await ledger.get_task(f"{run_id}/charge")


async def test_a_downstream_refusing_the_caller_blocks_the_call_after_one_attempt(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """The middleware refuses a write that names no caller (401 ``missing_credentials``) before its handler runs.
    Through httpx's ``raise_for_status()`` that answer was any exception: retried until the attempts ran out, then
    parked for reconciliation as an effect that may be in place."""
    handled: list[str | None] = []

    async def charge(request: Request) -> JSONResponse:
        handled.append(request.headers.get("idempotency-key"))
        return JSONResponse({"charge_id": 7}, status_code=201)

    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'service.db'}")
    run_id = f"refused-{uuid.uuid4().hex[:8]}"
    app = Starlette(
        routes=[Route("/charges", charge, methods=["POST"])],
        middleware=[Middleware(IdempotencyMiddleware, store=store)],  # anonymous=False: credentials required
    )
    try:
        await store.create_tables()
        task = await _parked_charge(client, settings, app, run_id)
    finally:
        await store.close()

    assert handled == []  # refused before the handler: no effect
    assert (task.status, task.attempts, task.claim_generation) == (TaskStatus.BLOCKED, 1, 1)
    assert task.error_class == ErrorClass.CREDENTIAL.value and "401" in (task.last_error or "")


@pytest.mark.parametrize("answer", [404, 422])
async def test_a_4xx_answering_the_retry_of_a_write_that_landed_is_no_dead_letter(
    client: Client, settings: AgentLeaseSettings, answer: int
) -> None:
    """The charge lands and the gateway answers 504; the retry, with the same key, is answered a 4xx (the
    downstream's "already charged", an ingress's default backend). The call may have had its effect: it is parked
    for a person, never dead-lettered (a dead letter says "not done")."""
    charged: list[str | None] = []

    async def charge(request: Request) -> JSONResponse:
        if not charged:
            charged.append(request.headers.get("idempotency-key"))  # the effect lands, its answer is lost
            return JSONResponse({"error": "gateway timeout"}, status_code=504)
        return JSONResponse({"error": "already charged"}, status_code=answer)

    app = Starlette(routes=[Route("/charges", charge, methods=["POST"])])
    task = await _parked_charge(client, settings, app, f"landed-{uuid.uuid4().hex[:8]}")

    assert len(charged) == 1
    assert (task.status, task.attempts) == (TaskStatus.NEEDS_RECONCILIATION, 2)
