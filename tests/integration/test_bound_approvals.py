"""Approvals bound to one execution, through a run on the real dev server (issue 18).

The ledger checks the approval when the attempt claims (``tests/integration/test_ledger_approvals.py`` has
the rules, on both ledgers); here the same through ``AgentRunWorkflow`` and an in-process worker: an
approval consumed by an attempt that Temporal then timed out authorises no second execution (the next
attempt follows the recovery policy: reconcile, G7); an expired approval is refused at the claim with one
line in the trail, and the run waits for a person again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError

from agentlease.decisions.table import DecisionRequest
from agentlease.enums import EventKind, RunState, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, RunStatus, arguments_fingerprint
from agentlease.runtime.names import STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration import approval_tools
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(120)

MESSAGE = {"to": "ops@example.com", "body": "refund A-1"}


async def waiting_on(handle: WorkflowHandle[AgentRunWorkflow, RunStatus], status: TaskStatus) -> RunStatus:
    async def check() -> RunStatus:
        run = await handle.query(STATUS_QUERY, result_type=RunStatus)
        assert (run.status, run.tasks[0].status) == (RunState.WAITING, status), run
        return run

    return await assert_eventually(check, timeout=60, message=f"the run waits: {status.value}")


async def approve(handle: WorkflowHandle[AgentRunWorkflow, RunStatus]) -> None:
    await waiting_on(handle, TaskStatus.AWAITING_APPROVAL)
    request = DecisionRequest(step_id="send", by="alice", reason="send it")
    await handle.execute_update("approve", request, result_type=RunStatus)


def settings_for(settings: AgentLeaseSettings) -> AgentLeaseSettings:
    return settings.model_copy(update={"tool_modules": ["tests.integration.approval_tools"]})


@asynccontextmanager
async def _worker(client: Client, ledger: Ledger, settings: AgentLeaseSettings, identity: str) -> AsyncIterator[None]:
    """A worker serving the approval tools (and the built-ins) in this process."""
    async with build_worker(client, ledger, load_registry(settings.tool_modules), settings, identity=identity):
        yield


async def start(client: Client, settings: AgentLeaseSettings, tool: str) -> WorkflowHandle[AgentRunWorkflow, RunStatus]:
    run_id = f"approval-{uuid.uuid4().hex[:8]}"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="send", tool=tool, arguments=MESSAGE)])
    return await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)


async def test_an_approval_consumed_by_an_attempt_that_timed_out_authorises_no_second_execution(
    client: Client, settings: AgentLeaseSettings
) -> None:
    settings = settings_for(settings)
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-approvals"):
        handle = await start(client, settings, "approved_send")
        task_id = f"{handle.id}/send"
        await approve(handle)
        await waiting_on(handle, TaskStatus.NEEDS_RECONCILIATION)  # attempt 1 timed out past external_call
        events = await ledger.events(task_id)
        approval_tools.GATES[task_id].set()
        await handle.cancel()

    assert approval_tools.SENT[task_id] == 1  # one approved execution
    claims = [e for e in events if e.kind is EventKind.CLAIMED]
    assert [c.claim_generation for c in claims] == [1, 2], events
    assert claims[0].details is not None and "arguments_sha256" in claims[0].details["approval"]
    assert claims[1].details is not None and claims[1].details["approval"] == {"consumed_by_generation": 1}
    assert [e.kind for e in events].count(EventKind.APPROVED) == 1
    [parked] = [e for e in events if e.kind is EventKind.NEEDS_RECONCILIATION]
    assert parked.claim_generation == 2 and "pause for reconciliation" in (parked.reason or ""), parked


async def test_an_expired_approval_is_refused_at_the_claim_and_the_run_asks_again(
    client: Client, settings: AgentLeaseSettings
) -> None:
    settings = settings_for(settings)
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-approvals"):
        handle = await start(client, settings, "hasty_send")
        task_id = f"{handle.id}/send"
        await approve(handle)

        async def refused() -> None:
            assert [e.kind for e in await ledger.events(task_id)].count(EventKind.APPROVAL_REFUSED) == 1

        await assert_eventually(refused, timeout=60, message="the claim refused the expired approval")
        run = await waiting_on(handle, TaskStatus.AWAITING_APPROVAL)  # a person is asked again
        request = DecisionRequest(step_id="send", by="alice", reason="too late now")
        await handle.execute_update("reject", request, result_type=RunStatus)
        done = await asyncio.wait_for(handle.result(), 60)
        events = await ledger.events(task_id)
        record = await ledger.get_task(task_id)

    assert approval_tools.SENT.get(task_id, 0) == 0  # nothing ran on the expired approval
    assert (done.status, record.status, record.claim_generation) == ("completed", TaskStatus.REJECTED, 0)
    [line] = [e for e in events if e.kind is EventKind.APPROVAL_REFUSED]
    assert (line.reason or "").startswith("approval refused at the claim: the approval given at "), line
    assert "(approval TTL 0.001s, ledger clock); approve it again" in (line.reason or ""), line
    assert [e.kind for e in events] == [
        EventKind.AWAITING_APPROVAL,
        EventKind.APPROVED,
        EventKind.APPROVAL_REFUSED,
        EventKind.REJECTED,
    ], events
    assert run.tasks[0].claim_generation in (None, 0)


async def test_an_approval_names_the_arguments_the_person_saw(client: Client, settings: AgentLeaseSettings) -> None:
    """An ``approve`` that says which arguments the person saw is refused for any others; then the one it
    names runs once, and its claim records the fingerprint it consumed."""
    settings = settings_for(settings)
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-approvals"):
        handle = await start(client, settings, "quick_send")
        task_id = f"{handle.id}/send"
        await waiting_on(handle, TaskStatus.AWAITING_APPROVAL)
        other = arguments_fingerprint({**MESSAGE, "body": "refund A-1, 100000 EUR"})
        wrong = DecisionRequest(step_id="send", by="alice", reason="send it", arguments_sha256=other)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("approve", wrong, result_type=RunStatus)
        assert "its arguments are not the ones you saw" in str(refused.value.cause)
        seen = DecisionRequest(
            step_id="send", by="alice", reason="send it", arguments_sha256=arguments_fingerprint(MESSAGE)
        )
        await handle.execute_update("approve", seen, result_type=RunStatus)
        done = await asyncio.wait_for(handle.result(), 60)
        events = await ledger.events(task_id)

    assert (done.status, done.tasks[0].status) == ("completed", TaskStatus.SETTLED)
    assert approval_tools.SENT[task_id] == 1
    [claimed] = [e for e in events if e.kind is EventKind.CLAIMED]
    assert claimed.details is not None
    assert claimed.details["approval"]["arguments_sha256"] == arguments_fingerprint(MESSAGE)
