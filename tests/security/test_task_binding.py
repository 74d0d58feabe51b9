"""Finding 2: a workflow on the same task queue cannot run its call as another run's step.

The attacker runs a workflow of their own (their own worker, the deployment's task queue) that
schedules the leased ``send_mail`` activity with the victim's task id, run id and key and a 30-day
heartbeat timeout, and the decision activity on the victim's task. Both are refused non-retryably
and recorded on the attacker's own task; nothing of the victim's task, key or receipt changes; the
victim's own call then runs and settles with its own receipt.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from agentlease.decisions.table import LedgerDecision
from agentlease.enums import DecisionKind, EventKind, SideEffectClass, TaskStatus
from agentlease.errors import TaskNotFoundError
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, TaskSpec, ToolCall, idempotency_key_for, task_id_for
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.security import tools
from tests.security.attacker import AttackerDecision, AttackerToolCall
from tests.security.conftest import victim_worker

THIRTY_DAYS_S = timedelta(days=30).total_seconds()


def _refusal(exc: pytest.ExceptionInfo[WorkflowFailureError]) -> ApplicationError:
    cause = exc.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError), cause
    assert cause.cause.non_retryable
    return cause.cause


async def test_an_attacker_workflow_cannot_claim_or_decide_a_victims_task(
    client: Client, attack_settings: AgentLeaseSettings
) -> None:
    ledger = Ledger.from_url(attack_settings.ledger_url)
    await upgrade(ledger.database)
    victim = f"victim-{uuid.uuid4().hex[:8]}"
    attack_queue = attack_settings.task_queue + "-attacker"
    forged = ToolCall(
        task_id=task_id_for(victim, "mail"),
        agent_run_id=victim,
        step_id="mail",
        tool="send_mail",
        arguments={"to": "attacker@example.net"},
        idempotency_key=idempotency_key_for(victim, "mail"),
    )
    decision = LedgerDecision(
        kind=DecisionKind.AWAIT_APPROVAL,
        task=TaskSpec.of(forged, SideEffectClass.IDEMPOTENT, timedelta(days=30)),
        by="attacker",
        reason="pin the victim's task",
    )
    try:
        async with (
            victim_worker(client, ledger, attack_settings),
            Worker(
                client,
                task_queue=attack_queue,
                workflows=[AttackerToolCall, AttackerDecision],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ),
        ):
            attacker = f"attacker-{uuid.uuid4().hex[:8]}"
            with pytest.raises(WorkflowFailureError) as tool_refused:
                await client.execute_workflow(
                    AttackerToolCall.run,
                    args=[attack_settings.task_queue, "send_mail", forged.model_dump(mode="json"), THIRTY_DAYS_S],
                    id=attacker,
                    task_queue=attack_queue,
                )
            refused = _refusal(tool_refused)
            assert refused.type == "DeadLettered" and "not the scheduling workflow" in refused.message, refused
            decider = f"attacker-decision-{uuid.uuid4().hex[:8]}"
            with pytest.raises(WorkflowFailureError) as decision_refused:
                await client.execute_workflow(
                    AttackerDecision.run,
                    args=[attack_settings.task_queue, decision.model_dump(mode="json")],
                    id=decider,
                    task_queue=attack_queue,
                )
            assert _refusal(decision_refused).type == "DecisionRefused"

            # Nothing of the victim's task exists: no row, no receipt for its key, no mail sent.
            with pytest.raises(TaskNotFoundError):
                await ledger.get_task(forged.task_id)
            assert await ledger.receipt(forged.idempotency_key) is None
            assert not [m for m in tools.SENT if m["task_id"] == forged.task_id]

            # Each refusal is recorded on the attacker's own task, where an operator looks.
            for own_run in (attacker, decider):
                own = await ledger.get_task(task_id_for(own_run, "mail"))
                assert own.status is TaskStatus.DEAD_LETTERED, own
                [entry] = [e for e in await ledger.events(own.task_id) if e.kind is EventKind.DEAD_LETTERED]
                assert entry.details is not None and entry.details["named_task_id"] == forged.task_id, entry
                assert entry.trace.workflow_id == own_run

            # The victim's own call runs and settles with its own receipt.
            step = PlanStep(step_id="mail", tool="send_mail", arguments={"to": "cfo@example.com"})
            handle = await client.start_workflow(
                AgentRunWorkflow.run,
                AgentRunPlan(agent_run_id=victim, steps=[step]),
                id=victim,
                task_queue=attack_settings.task_queue,
            )
            result = await asyncio.wait_for(handle.result(), timeout=90)
            history = (await handle.fetch_history()).to_json()
        [view] = result.tasks
        assert view.status == "settled" and view.receipt is not None
        task = await ledger.get_task(forged.task_id)
        assert (task.status, task.lease_ttl, task.trace.workflow_id) == (
            TaskStatus.SETTLED,
            timedelta(minutes=2),
            victim,
        )
        [sent] = [m for m in tools.SENT if m["task_id"] == forged.task_id]
        assert sent["to"] == "cfo@example.com"
        # The lease token the victim's attempt held is nowhere in Temporal's history (heartbeats included)
        # nor in the ledger's listings and trail.
        token = sent["lease_token"]
        assert len(token) >= 40 and token not in history
        shown = [t.as_json() for t in await ledger.list_tasks(victim)] + [
            e.model_dump(mode="json") for e in await ledger.events(agent_run_id=victim)
        ]
        assert token not in str(shown)
    finally:
        await ledger.close()


async def test_an_own_call_with_a_heartbeat_timeout_other_than_the_lease_ttl_is_refused(
    client: Client, attack_settings: AgentLeaseSettings
) -> None:
    """Even a workflow's own task: scheduled with a heartbeat timeout that is not the tool's TTL, refused."""
    ledger = Ledger.from_url(attack_settings.ledger_url)
    await upgrade(ledger.database)
    attack_queue = attack_settings.task_queue + "-attacker"
    own = f"own-{uuid.uuid4().hex[:8]}"
    call = ToolCall(
        task_id=task_id_for(own, "mail"),
        agent_run_id=own,
        step_id="mail",
        tool="send_mail",
        arguments={"to": "a@example.com"},
        idempotency_key=idempotency_key_for(own, "mail"),
    )
    try:
        async with (
            victim_worker(client, ledger, attack_settings),
            Worker(
                client,
                task_queue=attack_queue,
                workflows=[AttackerToolCall],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ),
        ):
            with pytest.raises(WorkflowFailureError) as refused:
                await client.execute_workflow(
                    AttackerToolCall.run,
                    args=[attack_settings.task_queue, "send_mail", call.model_dump(mode="json"), THIRTY_DAYS_S],
                    id=own,
                    task_queue=attack_queue,
                )
        assert "heartbeat timeout" in _refusal(refused).message
        task = await ledger.get_task(call.task_id)
        assert task.status is TaskStatus.DEAD_LETTERED and task.claim_generation == 0
        assert not [m for m in tools.SENT if m["task_id"] == call.task_id]
    finally:
        await ledger.close()
