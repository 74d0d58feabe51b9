"""A probe's answer is taken only when it is this call's and comes within the lease
(``docs/action-keys-and-probes.md``, "Probes"), on the real dev server."""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from agentlease.enums import EventKind, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import _worker as serving
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(120)

REGISTRY = load_registry(["tests.integration.probe_tools"])


def _worker(client: Client, ledger: Ledger, settings: AgentLeaseSettings) -> AbstractAsyncContextManager[Worker]:
    return serving(client, ledger, settings, "probe-worker", registry=REGISTRY)


async def _parked(client: Client, ledger: Ledger, settings: AgentLeaseSettings, tool: str) -> str:
    """Run a one-step plan of ``tool`` until its step waits for a person; its task id."""
    run_id = f"probe-{uuid.uuid4().hex[:8]}"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="send", tool=tool, arguments={})])
    handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

    async def parked() -> None:
        records = await ledger.list_tasks(run_id)
        seen = [(record.status, record.attempts) for record in records]
        assert [status for status, _ in seen] == [TaskStatus.NEEDS_RECONCILIATION], seen
        assert not (await handle.describe()).raw_description.pending_activities

    try:
        await assert_eventually(parked, timeout=40, message=f"{tool}'s step waits for a person")
    finally:
        await handle.terminate("test over")
    return f"{run_id}/send"


async def test_a_receipt_naming_another_key_does_not_settle(client: Client, settings: AgentLeaseSettings) -> None:
    """A probe answering "happened" with a receipt whose ``idempotency_key`` is another action's is not taken: the
    ambiguous call waits for a person, as when the probe cannot tell, and no receipt is stored for its key."""
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings):
        task_id = await _parked(client, ledger, settings, "misread_send")
        record = await ledger.get_task(task_id)
        trail = await ledger.events(task_id)
    assert record.receipt is None
    assert EventKind.SETTLED not in [event.kind for event in trail]
    assert record.last_error is not None and "names the idempotency key" in record.last_error, record.last_error


async def test_a_probe_that_swallows_cancellation_is_bounded_by_the_lease(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """A probe that goes on past its share of the lease (swallowing the cancellation) counts as "cannot tell" at
    its deadline: the call waits for a person within its attempts, instead of claim after claim whose lease the
    probe outlives."""
    spec = REGISTRY.get("stubborn_send")
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings):
        task_id = await _parked(client, ledger, settings, "stubborn_send")
        record = await ledger.get_task(task_id)
    assert record.attempts <= spec.max_attempts
    assert record.last_error is not None and "did not answer within" in record.last_error, record.last_error


async def test_retries_whose_probe_overruns_end_within_their_attempts(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """Before each retry of an ``idempotent`` call that crossed ``external_call`` its probe is asked; one that goes on
    past its deadline counts as "cannot tell", the retry goes ahead in the same attempt, and the call waits for a
    person when its attempts are spent (its write may have landed: never dead-lettered as not done, G11)."""
    spec = REGISTRY.get("stubborn_retry")
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings):
        task_id = await _parked(client, ledger, settings, "stubborn_retry")
        record = await ledger.get_task(task_id)
        trail = await ledger.events(task_id)
    assert record.attempts == spec.max_attempts
    overran = [e for e in trail if e.reason and "did not answer within" in e.reason]
    # asked before each of the two retries, and once more when the last attempt failed
    assert len(overran) == spec.max_attempts, [e.reason for e in trail]
    assert record.last_error is not None and "did not answer within" in record.last_error, record.last_error
