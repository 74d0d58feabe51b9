"""Approval rules through a run on the real dev server: a refund tool declared with
``requires_approval=ApprovalRule(field="amount_cents", above=100)`` refunds 50 without a person and waits for
one to refund 500; the trail names the rule that asked."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client

from agentlease.decisions.table import DecisionRequest
from agentlease.enums import EventKind, TaskStatus
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.integration import approval_tools
from tests.integration.test_bound_approvals import _worker, settings_for, waiting_on
from tests.integration.test_lease_on_temporal import opened_ledger
from tests.integration.test_operator_views import current_details

pytestmark = pytest.mark.timeout(120)


async def test_a_refund_above_the_rule_waits_for_a_person_and_one_below_runs(
    client: Client, settings: AgentLeaseSettings
) -> None:
    settings = settings_for(settings)
    run_id = f"rule-{uuid.uuid4().hex[:8]}"
    tool = "refund_above_100_approved"
    plan = AgentRunPlan(
        agent_run_id=run_id,
        steps=[
            PlanStep(step_id="small", tool=tool, arguments={"order_id": "A-1", "amount_cents": 50}),
            PlanStep(step_id="large", tool=tool, arguments={"order_id": "A-2", "amount_cents": 500}),
        ],
    )
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-rules"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        run = await waiting_on(handle, TaskStatus.SETTLED)  # the first, 50, ran without a person
        assert run.tasks[1].status is TaskStatus.AWAITING_APPROVAL, run
        assert f"{run_id}/large" not in approval_tools.REFUNDED
        # The Temporal UI's current details show what the person is asked to approve.
        details = await current_details(handle)
        assert f"large: awaiting_approval, waiting for a person to approve {tool} order_id: A-2, amount_cents: 500" in (
            details
        ), details
        request = DecisionRequest(step_id="large", by="alice", reason="a large refund, checked")
        await handle.execute_update("approve", request, result_type=RunStatus)
        done = await asyncio.wait_for(handle.result(), 60)
        small, large = await ledger.events(f"{run_id}/small"), await ledger.events(f"{run_id}/large")

    assert done.status == "completed" and [t.status for t in done.tasks] == [TaskStatus.SETTLED] * 2, done
    assert approval_tools.REFUNDED[f"{run_id}/small"] == 50 and approval_tools.REFUNDED[f"{run_id}/large"] == 500
    assert EventKind.AWAITING_APPROVAL not in [e.kind for e in small], small
    [asked] = [e for e in large if e.kind is EventKind.AWAITING_APPROVAL]
    assert asked.reason == f"{tool} requires approval: amount_cents 500 is above 100 (rule: amount_cents above 100)"
    assert asked.details is not None and asked.details["rule"] == {"field": "amount_cents", "above": 100}, asked
    assert [e.kind for e in large][:2] == [EventKind.AWAITING_APPROVAL, EventKind.APPROVED], large
