"""Finding 3 of issue 21: the ledger, not the activity's input, says which tool a task is and whether
it may run.

An attacker's workflow (its own worker, the deployment's task queue, the real dev server) schedules
the approval-gated ``gated_mail`` activity with ``"tool": "fetch_page"`` in its input: before, the
mail went out with no approval and the ledger recorded a ``fetch_page`` task. Now the call is refused
before the ledger is touched and recorded, as any binding mismatch, on the attacker's own task under
the tool that ran. The same workflow naming the right tool but holding no approval does not send
either. And a receipt can no longer be stored under another tool's name: a ``stamp`` call dressed as
``record_row`` with a shared key stores nothing, so the victim's ``record_row`` with that key writes
its row instead of settling from a forged receipt. Both ledgers.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from agentlease.enums import EventKind, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import (
    AgentRunPlan,
    PlanStep,
    ToolCall,
    idempotency_key_for,
    scoped_idempotency_key,
    task_id_for,
)
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.security import round2_tools
from tests.security.attacker import AttackerToolCall
from tests.security.conftest import victim_worker

pytestmark = pytest.mark.timeout(180)

TTL_S = timedelta(seconds=30).total_seconds()
"""The lease TTL of every round-2 tool: the heartbeat timeout an attacker must schedule with to pass G9."""


@pytest.fixture
def round2(attack_settings: AgentLeaseSettings) -> AgentLeaseSettings:
    return attack_settings.model_copy(update={"tool_modules": ["tests.security.round2_tools"]})


def _call(run: str, step: str, tool: str, arguments: dict[str, object], *, key: str | None = None) -> ToolCall:
    return ToolCall(
        task_id=task_id_for(run, step),
        agent_run_id=run,
        step_id=step,
        tool=tool,
        arguments=arguments,
        idempotency_key=key or idempotency_key_for(run, step),
        share_idempotency_key=key is not None,
    )


async def _attack(
    client: Client, settings: AgentLeaseSettings, run: str, activity: str, call: ToolCall
) -> ApplicationError:
    """Run the attacker's workflow ``run``; it must fail on a non-retryable refusal, which is returned."""
    with pytest.raises(WorkflowFailureError) as failed:
        await client.execute_workflow(
            AttackerToolCall.run,
            args=[settings.task_queue, activity, call.model_dump(mode="json"), TTL_S],
            id=run,
            task_queue=settings.task_queue + "-attacker",
        )
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError), cause
    assert cause.cause.non_retryable, cause.cause
    return cause.cause


def _attacker_worker(client: Client, settings: AgentLeaseSettings) -> Worker:
    return Worker(
        client,
        task_queue=settings.task_queue + "-attacker",
        workflows=[AttackerToolCall],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


async def test_an_input_naming_another_tool_is_refused_and_recorded_under_the_tool_that_ran(
    client: Client, round2: AgentLeaseSettings
) -> None:
    ledger = Ledger.from_url(round2.ledger_url)
    await upgrade(ledger.database)
    run = f"attacker-{uuid.uuid4().hex[:8]}"
    call = _call(run, "mail", "fetch_page", {"to": "everyone@example.com"})
    try:
        async with victim_worker(client, ledger, round2), _attacker_worker(client, round2):
            refused = await _attack(client, round2, run, "gated_mail", call)
        assert refused.type == "DeadLettered", refused
        assert "its input names tool 'fetch_page', but the activity that runs is 'gated_mail'" in refused.message
        assert not [m for m in round2_tools.MAILED if m["task_id"] == call.task_id]  # no mail went out
        task = await ledger.get_task(call.task_id)
        assert (task.status, task.tool, task.claim_generation) == (TaskStatus.DEAD_LETTERED, "gated_mail", 0), task
        [entry] = [e for e in await ledger.events(call.task_id) if e.kind is EventKind.DEAD_LETTERED]
        assert entry.details is not None and entry.details["refused"] is True, entry
        assert await ledger.receipt(call.idempotency_key) is None
    finally:
        await ledger.close()


async def test_an_approval_gated_tool_without_an_approval_in_the_ledger_does_not_run(
    client: Client, round2: AgentLeaseSettings
) -> None:
    ledger = Ledger.from_url(round2.ledger_url)
    await upgrade(ledger.database)
    run = f"attacker-{uuid.uuid4().hex[:8]}"
    call = _call(run, "mail", "gated_mail", {"to": "everyone@example.com"})
    try:
        async with victim_worker(client, ledger, round2), _attacker_worker(client, round2):
            await _attack(client, round2, run, "gated_mail", call)
        assert not [m for m in round2_tools.MAILED if m["task_id"] == call.task_id]  # no mail went out
        task = await ledger.get_task(call.task_id)
        assert task.status is not TaskStatus.SETTLED and task.receipt is None, task
        assert await ledger.receipt(call.idempotency_key) is None
    finally:
        await ledger.close()


@pytest.mark.parametrize("recipients", [1000, "1000"])
async def test_a_call_its_approval_rule_asks_for_does_not_run_without_an_approval(
    client: Client, round2: AgentLeaseSettings, recipients: object
) -> None:
    """The activity asks the tool's approval rule again at the claim: a workflow that schedules a call above
    the bound itself (or with the number as text, which validation would accept) sends nothing."""
    ledger = Ledger.from_url(round2.ledger_url)
    await upgrade(ledger.database)
    run = f"attacker-{uuid.uuid4().hex[:8]}"
    call = _call(run, "mail", "bulk_mail", {"to": "everyone@example.com", "recipients": recipients})
    try:
        async with victim_worker(client, ledger, round2), _attacker_worker(client, round2):
            await _attack(client, round2, run, "bulk_mail", call)
        assert not [m for m in round2_tools.MAILED if m["task_id"] == call.task_id]  # no mail went out
        task = await ledger.get_task(call.task_id)
        assert task.status is not TaskStatus.SETTLED and task.receipt is None, task
    finally:
        await ledger.close()


async def test_a_receipt_is_never_stored_under_another_tools_name(client: Client, round2: AgentLeaseSettings) -> None:
    ledger = Ledger.from_url(round2.ledger_url)
    await upgrade(ledger.database)
    shared = f"inv-{uuid.uuid4().hex[:8]}"
    key = scoped_idempotency_key("unused", shared, shared=True)
    attacker = f"attacker-{uuid.uuid4().hex[:8]}"
    forged = _call(attacker, "rows", "record_row", {}, key=key)
    victim = f"victim-{uuid.uuid4().hex[:8]}"
    try:
        async with victim_worker(client, ledger, round2), _attacker_worker(client, round2):
            refused = await _attack(client, round2, attacker, "stamp", forged)
            assert "its input names tool 'record_row'" in refused.message
            assert await ledger.receipt(key) is None  # nothing stands for the shared key

            step = PlanStep(step_id="rows", tool="record_row", idempotency_key=shared, share_idempotency_key=True)
            handle = await client.start_workflow(
                AgentRunWorkflow.run,
                AgentRunPlan(agent_run_id=victim, steps=[step]),
                id=victim,
                task_queue=round2.task_queue,
            )
            result = await asyncio.wait_for(handle.result(), timeout=90)
        [view] = result.tasks
        assert view.status == "settled", view
        assert key in round2_tools.STAMPED  # the victim's row was written, not settled from a forgery
        stored = await ledger.receipt(key)
        assert stored is not None and stored.task_id == task_id_for(victim, "rows"), stored
    finally:
        await ledger.close()
