"""The built-in tools through a real worker on the real Temporal dev server, against the real
downstream systems of ``examples/`` on 127.0.0.1: effects are counted at the downstream."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from temporalio.client import Client, WorkflowHandle

from agentlease.demo.downstream import TARGET_TABLES, Downstream, running_downstream
from agentlease.demo.mail import received_messages
from agentlease.demo.publishing import count_publications
from agentlease.enums import ErrorClass, EventKind, RecoveryAction, Stage, TaskStatus
from agentlease.ledger.engine import create_async_database_engine, sqlite_path
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, RunStatus, TaskSpec, task_id_for
from agentlease.recovery._policy import decide
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, ToolSpec
from agentlease.tools._resources import ToolResources
from agentlease.tools.builtin.http_publish import fenced_resource
from agentlease.tools.builtin.smtp_send import message_id_for
from agentlease.tools.builtin.sql_upsert import payload_digest, records_table
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import REGISTRY, _worker, opened_ledger

pytestmark = pytest.mark.timeout(60)

RUN_TIMEOUT_S = 30.0

POST = {"slug": "rotation-runbook", "title": "Rotating credentials", "body": "Announce, create, roll, revoke."}
MAIL = {"to": ["ops@example.com", "oncall@example.com"], "subject": "Runbook published", "body": "See the post."}


@pytest.fixture
async def downstream(tmp_path: Path) -> AsyncIterator[Downstream]:
    async with running_downstream(tmp_path / "downstream") as running:
        yield running


@pytest.fixture
def tool_settings(settings: AgentLeaseSettings, downstream: Downstream) -> AgentLeaseSettings:
    """The test's settings, pointed at the running downstream systems."""
    return settings.model_copy(
        update={
            "http_base_url": downstream.http_base_url,
            "sql_target_url": downstream.sql_target_url,
            "sql_allowed_tables": list(TARGET_TABLES),
            "publish_base_url": downstream.publish_base_url,
            "smtp_host": downstream.smtp_host,
            "smtp_port": downstream.smtp_port,
        }
    )


@asynccontextmanager
async def serving(client: Client, settings: AgentLeaseSettings, identity: str) -> AsyncIterator[Ledger]:
    """One in-process worker on ``settings``' queue and ledger; yields the ledger."""
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, identity):
        yield ledger


async def start_plan(client: Client, settings: AgentLeaseSettings, *steps: PlanStep) -> WorkflowHandle[Any, RunStatus]:
    """Start a run of ``steps`` and approve each step whose tool waits for an operator's approval."""
    run_id = f"tools-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow(
        AgentRunWorkflow.run,
        AgentRunPlan(agent_run_id=run_id, steps=list(steps)),
        id=run_id,
        task_queue=settings.task_queue,
    )
    for step in steps:
        if REGISTRY.get(step.tool).requires_approval:
            await _approve(handle, step.step_id)
    return handle


async def _approve(handle: WorkflowHandle[Any, RunStatus], step_id: str) -> None:
    async def waiting() -> bool:
        status = await handle.query("status", result_type=RunStatus)
        return any(task.step_id == step_id and task.status == "awaiting_approval" for task in status.tasks)

    await assert_eventually(waiting, timeout=RUN_TIMEOUT_S, message=f"{step_id} awaits approval")
    await handle.execute_update("approve", {"step_id": step_id, "by": "test", "reason": "the test's own plan"})


async def run_plan(client: Client, settings: AgentLeaseSettings, *steps: PlanStep) -> RunStatus:
    handle = await start_plan(client, settings, *steps)
    return await asyncio.wait_for(handle.result(), timeout=RUN_TIMEOUT_S)


async def test_http_publish_writes_once_per_key_and_its_receipt_matches_the_readback(
    client: Client, tool_settings: AgentLeaseSettings, downstream: Downstream, tmp_path: Path
) -> None:
    # Shared across runs on purpose (a caller's key is otherwise scoped to its run, docs/security-review.md).
    given = f"publish-{uuid.uuid4().hex[:8]}"
    key = f"shared:{given}"
    step = PlanStep(
        step_id="publish", tool="http_publish", arguments=POST, idempotency_key=given, share_idempotency_key=True
    )
    async with serving(client, tool_settings, "worker-publish"):
        first = await run_plan(client, tool_settings, step)
        [view] = first.tasks
        assert (view.status, view.claim_generation) == ("settled", 1), view
        receipt = view.receipt
        assert receipt is not None and (receipt.external_system, receipt.status) == ("publish", "published")

        async with httpx.AsyncClient(base_url=downstream.publish_base_url) as http:
            post = (await http.get(f"posts/{receipt.external_id}")).json()
            by_key = (await http.get("posts", params={"idempotency_key": key})).json()["posts"]
        [publication] = post["publications"]
        assert by_key == [post]
        assert {k: post[k] for k in POST} == POST
        assert (post["idempotency_key"], post["generation"]) == (key, 1)
        assert receipt.details["url"] == f"{downstream.publish_base_url}posts/{post['id']}"
        assert {k: receipt.details[k] for k in ("slug", "publication_id", "idempotency_key", "generation")} == {
            "slug": POST["slug"],
            "publication_id": publication["id"],
            "idempotency_key": key,
            "generation": 1,
        }
        assert await count_publications(downstream.publish_database_url) == 1

        # Another run with the same key: the ledger holds the key's receipt, nothing is sent.
        second = await run_plan(client, tool_settings, step)
        assert second.tasks[0].status == "settled" and second.tasks[0].receipt == receipt
        assert await count_publications(downstream.publish_database_url) == 1

    # A deployment whose ledger never saw the key: the tool's readback by key finds the post
    # and settles from it without entering external_call.
    elsewhere = tool_settings.model_copy(
        update={"task_queue": f"{tool_settings.task_queue}-b", "ledger_url": f"sqlite:///{tmp_path / 'b.db'}"}
    )
    async with serving(client, elsewhere, "worker-elsewhere") as other_ledger:
        third = await run_plan(client, elsewhere, step)
        [view] = third.tasks
        assert view.status == "settled" and view.receipt is not None
        assert (view.receipt.external_id, view.receipt.details) == (receipt.external_id, receipt.details)
        stages = [event.stage for event in await other_ledger.events(view.task_id)]
        assert Stage.VERIFY in stages and Stage.EXTERNAL_CALL not in stages, stages
    assert await count_publications(downstream.publish_database_url) == 1


async def test_smtp_send_delivers_exactly_one_message(
    client: Client, tool_settings: AgentLeaseSettings, downstream: Downstream
) -> None:
    async with serving(client, tool_settings, "worker-mail"):
        result = await run_plan(client, tool_settings, PlanStep(step_id="notify", tool="smtp_send", arguments=MAIL))

    [view] = result.tasks
    assert (view.status, view.attempts) == ("settled", 1), view
    [message] = await received_messages(downstream.mail_database_url)
    assert view.receipt is not None and (view.receipt.external_system, view.receipt.status) == ("smtp", "accepted")
    assert message.message_id == view.receipt.external_id == message_id_for(view.idempotency_key)
    assert message.idempotency_key == view.idempotency_key
    assert (message.rcpt_to, message.subject, message.mail_from) == (
        MAIL["to"],
        MAIL["subject"],
        "agentlease@localhost",
    )
    assert view.receipt.details["reply"] == f"250 OK: queued as {message.id}"


async def test_smtp_send_is_not_retried_once_the_server_may_have_taken_the_message(
    client: Client, tool_settings: AgentLeaseSettings, downstream: Downstream
) -> None:
    """G7: the server fails after DATA (its table is gone), so the message may or may not exist."""
    mail_db = sqlite_path(downstream.mail_database_url)
    assert mail_db is not None
    with sqlite3.connect(mail_db) as conn:
        conn.execute("DROP TABLE messages")
    step = PlanStep(step_id="notify", tool="smtp_send", arguments=MAIL)
    async with serving(client, tool_settings, "worker-mail") as ledger:
        handle = await start_plan(client, tool_settings, step)
        task_id = task_id_for(handle.id, step.step_id)

        async def parked() -> None:
            record = await ledger.get_task(task_id)
            assert record.status is TaskStatus.NEEDS_RECONCILIATION, record

        await assert_eventually(parked, timeout=RUN_TIMEOUT_S, message="the task waits for a decision")
        record = await ledger.get_task(task_id)
        kinds = [event.kind for event in await ledger.events(task_id)]
        await handle.terminate("the test is over")

    assert (record.stage, record.attempts, record.error_class) == (Stage.EXTERNAL_CALL, 1, ErrorClass.AMBIGUOUS)
    assert kinds.count(EventKind.CLAIMED) == 1 and EventKind.NEEDS_RECONCILIATION in kinds, kinds


async def _row(url: str, table: str, record_key: str) -> Any:
    engine = create_async_database_engine(url, pool_size=1)
    target = records_table(table)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(select(target).where(target.c.record_key == record_key))).one()
    finally:
        await engine.dispose()


async def test_sql_upsert_receipt_and_row_name_the_current_writer(
    client: Client, tool_settings: AgentLeaseSettings, downstream: Downstream
) -> None:
    record_key = f"reservation:{uuid.uuid4().hex[:8]}"
    rows = [{"sku": "A-1002", "reserved": 25}, {"sku": "A-1002", "reserved": 30}]
    async with serving(client, tool_settings, "worker-sql"):
        views = []
        for row in rows:
            arguments = {"table": "inventory", "record_key": record_key, "row": row}
            step = PlanStep(step_id="reserve", tool="sql_upsert", arguments=arguments)
            result = await run_plan(client, tool_settings, step)
            views.extend(result.tasks)

    first, second = views
    assert first.idempotency_key != second.idempotency_key
    assert second.status == "settled" and second.receipt is not None
    assert second.receipt.external_id == record_key
    assert second.receipt.details == {
        "payload_sha256": payload_digest(rows[1]),
        "claim_generation": second.claim_generation,
        "idempotency_key": second.idempotency_key,
    }
    stored = await _row(downstream.sql_target_url, "inventory", record_key)
    assert (stored.idempotency_key, stored.payload) == (second.idempotency_key, rows[1])


async def _direct_attempt(
    ledger: Ledger, spec: ToolSpec, settings: AgentLeaseSettings, arguments: dict, resources: ToolResources
) -> tuple:
    """One attempt of ``spec`` outside Temporal: claim, decide as the worker does, run the tool."""
    task = TaskSpec(
        task_id=task_id_for("direct", spec.name),
        agent_run_id="direct",
        step_id=spec.name,
        tool=spec.name,
        side_effect_class=spec.side_effect_class,
        idempotency_key=f"direct:{spec.name}",
        lease_ttl=spec.lease_ttl,
    )
    claim = await ledger.claim(task, "direct-worker")
    decision = decide(
        spec.side_effect_class,
        claim.previous_stage,
        receipt_present=False,
        error_class=ErrorClass.parse(claim.previous_error_class),
        real_attempts=claim.attempts - 1,
        max_attempts=spec.max_attempts,
    )
    context = LeaseContext(
        ledger=ledger,
        claim=claim,
        side_effect_class=spec.side_effect_class,
        previous_receipt=None,
        settings=settings,
        recovery=decision,
        resources=resources,
    )
    result: ToolResult = await spec.fn(context, spec.args_model.model_validate(arguments))
    return claim, decision, result


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("http_publish", POST),
        ("sql_upsert", {"table": "inventory", "record_key": "direct-retry", "row": {"sku": "C-3300", "reserved": 10}}),
    ],
)
async def test_a_retry_after_the_write_reads_back_and_does_not_write_again(
    tool: str, arguments: dict, tool_settings: AgentLeaseSettings, downstream: Downstream
) -> None:
    """G6: attempt 1 wrote and read back, then lost its settle; attempt 2 settles from the readback."""
    spec = REGISTRY.get(tool)
    resources = ToolResources()
    async with opened_ledger(tool_settings) as ledger:
        try:
            claim, _, first = await _direct_attempt(ledger, spec, tool_settings, arguments, resources)
            assert first.output["written"] is True
            await ledger.release(claim, error_class=ErrorClass.RETRYABLE, error="settle did not reach the ledger")

            claim, decision, second = await _direct_attempt(ledger, spec, tool_settings, arguments, resources)
        finally:
            await resources.close()

    assert (claim.generation, claim.previous_stage, decision.action) == (2, Stage.VERIFY, RecoveryAction.RETRY_READBACK)
    assert second.output["written"] is False
    assert second.receipt.model_dump(exclude={"verified_at"}) == first.receipt.model_dump(exclude={"verified_at"})
    if tool == "http_publish":
        assert await count_publications(downstream.publish_database_url) == 1
    else:
        stored = await _row(downstream.sql_target_url, "inventory", arguments["record_key"])
        assert stored.claim_generation == 1


async def test_the_publishing_service_fences_each_action_and_keeps_every_revision(downstream: Downstream) -> None:
    def headers(key: str, generation: int, resource: str | None = None) -> dict[str, str]:
        return {
            "Idempotency-Key": key,
            "Fencing-Token": str(generation),
            "Fencing-Resource": resource or fenced_resource(POST["slug"], key),
        }

    async with httpx.AsyncClient(base_url=downstream.publish_base_url) as http:
        unfenced = await http.post("posts", json=POST, headers={"Idempotency-Key": "a"})
        assert (unfenced.status_code, unfenced.json()["error"]) == (400, "missing_fencing_token")
        elsewhere = await http.post("posts", json=POST, headers=headers("a", 1, resource="posts/other/a"))
        assert (elsewhere.status_code, elsewhere.json()["error"]) == (422, "wrong_fencing_resource")

        first = await http.post("posts", json=POST, headers=headers("b", 3))
        # Another action (its own key, its own generations from 1) writes a new revision of the slug.
        revised = await http.post("posts", json={**POST, "title": "Revised"}, headers=headers("c", 1))
        assert (first.status_code, revised.status_code) == (201, 201)
        assert revised.json()["id"] == first.json()["id"]
        assert [(p["idempotency_key"], p["generation"]) for p in revised.json()["publications"]] == [("b", 3), ("c", 1)]
        assert (revised.json()["title"], revised.json()["idempotency_key"]) == ("Revised", "c")

        # Action b's late attempt with an older token: refused before the stored answer is looked at (a
        # superseded holder learns that it lost), nothing is written; the current token still gets the replay.
        late = await http.post("posts", json=POST, headers=headers("b", 2))
        assert (late.status_code, late.json()["error"], late.json()["current_generation"]) == (
            409,
            "stale_fencing_token",
            3,
        )
        again = await http.post("posts", json=POST, headers=headers("b", 3))
        assert (again.status_code, again.headers["idempotent-replayed"], again.content) == (201, "true", first.content)
    assert await count_publications(downstream.publish_database_url) == 2
