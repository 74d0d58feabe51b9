"""The run counts the late writes the ledger refused on its tasks: ``AgentLeaseRefusedWrites``
(``docs/operator-views.md``). Real dev server, two in-process workers.

Worker A holds generation 1 of ``write`` in ``external_call`` and goes quiet (its only slot is held,
like a paused process). A write by a claim without its lease token is refused meanwhile (the ledger's
``lease_lost``). Worker B takes over with generation 2 and settles: its outcome carries the ledger's
count (1). While the run's next step runs, A wakes up: its renewal and its settle are refused
(``lease_lost``, ``late_unapplied``), and A tells the run (a proven progress signal): 3. An operator
finds the run with ``AgentLeaseRefusedWrites > 0``.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from agentlease.enums import EventKind, SideEffectClass, Stage
from agentlease.errors import LeaseLostError
from agentlease.ledger.refused_writes import refused_writes
from agentlease.ledger.store import Ledger
from agentlease.observability import search_attributes as sa
from agentlease.records import Claim, RunStatus, SettlementReceipt, TaskSpec
from agentlease.runtime.names import STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration import tools
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger
from tests.integration.test_replay import replayer

pytestmark = pytest.mark.timeout(180)


def rebuilt_without_token(claim: Claim) -> Claim:
    """The claim as the listings show it: everything but its lease token."""
    return Claim.model_validate({**claim.model_dump(exclude={"lease_token"}), "lease_token": ""})


async def test_the_ledger_counts_a_tasks_refused_late_writes(ledger: Ledger) -> None:
    spec = TaskSpec(
        task_id="rw-ledger/write",
        agent_run_id="rw-ledger",
        step_id="write",
        tool="held_write",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key="rw-ledger:write",
        lease_ttl=timedelta(seconds=30),
    )
    other = spec.model_copy(update={"task_id": "rw-ledger/other", "step_id": "other", "idempotency_key": "k2"})
    assert await refused_writes(ledger, spec.task_id) == 0  # no such task yet
    real = await ledger.claim(spec, "worker-a")
    await ledger.claim(other, "worker-a")
    forged = rebuilt_without_token(real)
    receipt = SettlementReceipt(external_system="x", external_id="1", status="ok", verified_at=datetime.now(UTC))
    with pytest.raises(LeaseLostError):
        await ledger.renew(forged, reason="forged")
    with pytest.raises(LeaseLostError):
        await ledger.settle(forged, receipt)
    await ledger.renew(real, reason="still mine")  # neither a claim nor a renewal counts
    assert await refused_writes(ledger, spec.task_id) == 2
    assert await refused_writes(ledger, other.task_id) == 0


async def refused_attribute(handle: WorkflowHandle) -> int | None:
    return (await handle.describe()).typed_search_attributes.get(sa.REFUSED_WRITES)


async def current_details(handle: WorkflowHandle) -> str:
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def test_refused_late_writes_are_counted_in_a_search_attribute(
    client: Client, settings: AgentLeaseSettings
) -> None:
    run_id = f"rw-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/write"
    plan = _plan(run_id, ("write", "held_write", {}), ("after", "gated", {}))
    async with AsyncExitStack() as stack:
        ledger, ledger_a, ledger_b = [await stack.enter_async_context(opened_ledger(settings)) for _ in "oab"]
        await stack.enter_async_context(_worker(client, ledger_a, settings, "worker-A", slots=1))
        stack.callback(tools.gate(task_id).set)
        stack.callback(tools.gate(f"{run_id}/after").set)
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

        async def held_by_a() -> None:
            records = await ledger.list_tasks(run_id)
            assert len(records) == 1, records
            [record] = records
            assert (record.lease_owner, record.claim_generation, record.stage) == ("worker-A", 1, Stage.EXTERNAL_CALL)

        await assert_eventually(held_by_a, timeout=30, message="worker A holds generation 1")
        assert await refused_attribute(handle) is None  # unset until a write is refused

        # A write by a claim rebuilt without its lease token (what the listings show): refused, recorded.
        record = await ledger.get_task(task_id)
        assert record.lease_owner is not None and record.lease_acquired_at and record.lease_expires_at
        rebuilt = Claim(
            task_id=task_id,
            tool=record.tool,
            generation=record.claim_generation,
            owner=record.lease_owner,
            acquired_at=record.lease_acquired_at,
            expires_at=record.lease_expires_at,
            lease_ttl=record.lease_ttl,
            attempts=record.attempts,
            previous_stage=None,
            previous_error_class=None,
            idempotency_key=record.idempotency_key,
        )
        with pytest.raises(LeaseLostError):
            await ledger.renew(rebuilt, reason="a write without the lease token")
        assert await refused_writes(ledger, task_id) == 1

        # B takes over (A's only slot is busy) and settles generation 2: its outcome carries the ledger's count.
        await stack.enter_async_context(_worker(client, ledger_b, settings, "worker-B"))

        async def settled_by_b_with_the_ledgers_count() -> None:
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            write, after = status.tasks
            assert (write.status.value, write.claim_generation, write.refused_writes) == ("settled", 2, 1), write
            assert after.status.value == "running", after
            assert await refused_attribute(handle) == 1

        await assert_eventually(settled_by_b_with_the_ledgers_count, timeout=60, message="B settles; 1 refused")

        # A wakes up while the run goes on: its renewal and its settle are refused, and it tells the run.
        tools.gate(task_id).set()

        async def a_reported() -> None:
            kinds = [(e.kind, e.claim_generation) for e in await ledger.events(task_id)]
            assert (EventKind.LEASE_LOST, 1) in kinds and (EventKind.LATE_UNAPPLIED, 1) in kinds, kinds
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            assert status.tasks[0].refused_writes == 3, status.tasks[0]
            assert await refused_attribute(handle) == 3
            assert "write: 3 late writes refused" in await current_details(handle)

        await assert_eventually(a_reported, timeout=60, message="A's refused writes reach the run")
        assert await refused_writes(ledger, task_id) == 3
        # The view of the settled call still names its winner.
        status = await handle.query(STATUS_QUERY, result_type=RunStatus)
        assert (status.tasks[0].lease_owner, status.tasks[0].claim_generation) == ("worker-B", 2)

        tools.gate(f"{run_id}/after").set()
        result = await asyncio.wait_for(handle.result(), timeout=60)

    assert [t.status.value for t in result.tasks] == ["settled", "settled"]
    assert [t.refused_writes for t in result.tasks] == [3, 0]
    assert result.refused_progress == 0

    async def found_by_the_documented_query() -> None:
        query = f'WorkflowId = "{run_id}" AND AgentLeaseRefusedWrites > 0'
        assert [w.id async for w in client.list_workflows(query)] == [run_id]

    await assert_eventually(found_by_the_documented_query, timeout=20, message="the run is found by its count")
    replayed = await replayer().replay_workflow(await handle.fetch_history(), raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure
