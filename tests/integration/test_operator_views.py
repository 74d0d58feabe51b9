"""What an operator sees of a running call on the real dev server (``docs/operator-views.md``).

While an attempt holds its lease, the run's ``status`` query, its search attributes and its
current details show the stage, claim generation and owner the ledger recorded (the attempt
signals them to its run), not only a throttled heartbeat. The last decision is on the run itself.
Decisions sent as the ``decide`` signal are made like the updates; a refused one is written to
the evidence trail and shown by ``status``.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from agentlease.enums import EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.observability import search_attributes as sa
from agentlease.records import RunStatus, TaskSpec
from agentlease.runtime.names import DECIDE_SIGNAL, STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration import tools
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

pytestmark = pytest.mark.timeout(120)


async def attributes(handle: WorkflowHandle) -> dict[str, Any]:
    shown = (await handle.describe()).typed_search_attributes
    return {key.name: shown.get(key) for key in sa.ALL}


async def current_details(handle: WorkflowHandle) -> str:
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def test_a_running_call_shows_its_live_stage_generation_and_owner(
    client: Client, settings: AgentLeaseSettings
) -> None:
    run_id = f"ov-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-live"):
        handle = await client.start_workflow(
            AgentRunWorkflow.run, _plan(run_id, ("hold", "gated", {})), id=run_id, task_queue=settings.task_queue
        )

        async def live() -> None:
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            [view] = status.tasks
            assert (view.status.value, view.stage, view.claim_generation, view.lease_owner) == (
                "running",
                "preflight",
                1,
                "worker-live",
            ), view
            assert view.progress in ("waiting for the gate", "gate still closed"), view
            shown = await attributes(handle)
            assert shown[sa.CURRENT_STAGE.name] == "preflight", shown
            assert shown[sa.CURRENT_GENERATION.name] == 1, shown
            assert shown[sa.CURRENT_OWNER.name] == "worker-live", shown
            details = await current_details(handle)
            assert details.startswith("hold: preflight, generation 1, renewing: "), details
            assert details.endswith("(worker-live)"), details

        # The tool renews for as long as its gate is closed: the run shows it while it runs.
        await assert_eventually(live, timeout=40, message="the run shows the live lease")
        [record] = await ledger.list_tasks(run_id)
        assert (record.stage, record.claim_generation, record.lease_owner) == ("preflight", 1, "worker-live")
        tools.gate(f"{run_id}/hold").set()
        result = await handle.result()
    assert [t.status.value for t in result.tasks] == ["settled"]
    shown = await attributes(handle)
    assert (shown[sa.CURRENT_STAGE.name], shown[sa.CURRENT_GENERATION.name]) == ("settled", 1)


async def test_decisions_by_signal_and_a_refused_one_in_the_evidence_trail(
    client: Client, settings: AgentLeaseSettings
) -> None:
    run_id = f"ov-{uuid.uuid4().hex[:8]}"
    plan = _plan(run_id, ("send", "send_once", {"hold_first_attempt": False}))
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-sig"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

        async def awaiting() -> None:
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            assert status.tasks[0].status.value == "awaiting_approval", status

        await assert_eventually(awaiting, timeout=40, message="the call waits for approval")
        # A decision the table does not allow for this step: refused, recorded, the run unchanged.
        await handle.signal(DECIDE_SIGNAL, {"decision": "redrive", "step_id": "send", "by": "mallory", "reason": "x"})
        await handle.signal(DECIDE_SIGNAL, {"decision": "launch", "step_id": "send", "by": "mallory", "reason": "x"})

        async def refusals_recorded() -> RunStatus:
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            assert [(r.decision, r.by) for r in status.refused] == [("redrive", "mallory"), ("launch", "mallory")]
            assert status.refused_count == 2
            # The first refusal is written at once; the next, within the minute, waits to be summarised.
            trail = [e for e in await ledger.events(f"{run_id}/send") if e.kind is EventKind.DECISION_REFUSED]
            assert [(e.details or {}).get("decision") for e in trail] == ["redrive"], trail
            return status

        status = await assert_eventually(refusals_recorded, timeout=40, message="refused signals are evidence")
        assert "cannot redrive step 'send': it is awaiting_approval" in status.refused[0].refusal
        assert "unknown decision 'launch'" in status.refused[1].refusal
        assert status.tasks[0].status.value == "awaiting_approval"
        assert "refused launch signal by mallory" in await current_details(handle)

        await handle.signal(
            DECIDE_SIGNAL, {"decision": "approve", "step_id": "send", "by": "alice", "reason": "ticket OPS-12"}
        )
        result = await handle.result()
        # Search attributes and the run's view carry no free text: who and why are in the trail.
        assert "last decision: send: approved" in await current_details(handle)
        # The pending refusal went to the trail with the run's next decision.
        trail = [e for e in await ledger.events(f"{run_id}/send") if e.kind is EventKind.DECISION_REFUSED]
        assert [(e.details or {}).get("decision") for e in trail] == ["redrive", "launch"], trail
    assert [t.status.value for t in result.tasks] == ["settled"]
    assert result.last_decision == "send: approved"
    assert (await attributes(handle))[sa.LAST_DECISION.name] == "send: approved"
    approved = [e for e in await ledger.events(f"{run_id}/send") if e.kind is EventKind.APPROVED]
    assert [((e.details or {}).get("by"), e.reason) for e in approved] == [("alice", "ticket OPS-12")]


async def test_the_ledger_records_a_refused_decision_without_changing_the_task(ledger: Ledger) -> None:
    spec = TaskSpec(
        task_id="ov-ledger/send",
        agent_run_id="ov-ledger",
        step_id="send",
        tool="send_once",
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key="ov-ledger:send",
        lease_ttl=timedelta(seconds=30),
    )
    await ledger.record_refused_decision(spec, decision="redrive", by="mallory", refusal="cannot redrive step 'send'")
    claim = await ledger.claim(spec, "worker-a")
    await ledger.record_refused_decision(spec, decision="launch", by=None, refusal="unknown decision 'launch'")
    task = await ledger.get_task(spec.task_id)
    assert (task.status, task.claim_generation, task.lease_owner) == (TaskStatus.RUNNING, 1, "worker-a")
    await ledger.renew(claim, reason="still mine", stage=Stage.PREFLIGHT)  # the refusals left the lease alone
    trail = [e for e in await ledger.events(spec.task_id) if e.kind is EventKind.DECISION_REFUSED]
    assert [(e.claim_generation, e.reason, e.details) for e in trail] == [
        (0, "cannot redrive step 'send'", {"by": "mallory", "decision": "redrive", "via": "signal"}),
        (1, "unknown decision 'launch'", {"by": None, "decision": "launch", "via": "signal"}),
    ]


def lost_renewals(tool: str) -> dict[str, float]:
    """``agentlease_lease_renewals_total{outcome="lost"}`` of ``tool``, by stage."""
    found: dict[str, float] = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            labels = sample.labels
            named = sample.name == "agentlease_lease_renewals_total" and labels.get("tool") == tool
            if named and labels.get("outcome") == "lost":
                found[labels["stage"]] = found.get(labels["stage"], 0) + sample.value
    return found


async def test_after_a_takeover_the_run_names_the_winner_and_is_found_by_its_highest_generation(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """Worker A holds generation 1 in external_call and goes quiet; B takes over and settles; A wakes up.

    Before: the run's ``status``, current details and ``AgentLeaseOwner`` named worker-A beside
    generation 2, the next step inherited the owner, ``AgentLeaseGeneration`` ended at the last step's 1
    (so ``AgentLeaseGeneration > 1`` missed the run), and A's refused renewal counted ``stage="none"``.
    """
    run_id = f"ov-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/write"
    lost_before = lost_renewals("held_write")
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
            shown = await attributes(handle)
            assert shown[sa.CURRENT_OWNER.name] == "worker-A", shown

        await assert_eventually(held_by_a, timeout=30, message="worker A holds generation 1")
        await stack.enter_async_context(_worker(client, ledger_b, settings, "worker-B"))

        async def settled_by_b() -> RunStatus:
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            assert status.tasks[0].status.value == "settled", status
            return status

        status = await assert_eventually(settled_by_b, timeout=60, message="worker B settles generation 2")
        write = status.tasks[0]
        record = await ledger.get_task(task_id)
        assert (write.claim_generation, write.lease_owner) == (2, "worker-B"), write
        assert write.claimed_at == record.lease_acquired_at, (write, record)
        details = await current_details(handle)
        assert "write: settled by generation 2 (worker-B)" in details, details
        assert "worker-A" not in details, details

        async def next_step_has_its_own_owner() -> None:
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            after = status.tasks[1]
            assert (after.status.value, after.claim_generation, after.lease_owner) == ("running", 1, "worker-B"), after
            shown = await attributes(handle)
            assert shown[sa.CURRENT_GENERATION.name] == 2, shown  # the run's highest, not this step's 1
            assert shown[sa.CURRENT_OWNER.name] == "worker-B", shown

        await assert_eventually(next_step_has_its_own_owner, timeout=30, message="the next step runs")
        tools.gate(f"{run_id}/after").set()
        result = await asyncio.wait_for(handle.result(), timeout=60)
        tools.gate(task_id).set()  # A resumes: its renewal is refused in external_call

        async def a_refused() -> None:
            kinds = [(e.kind, e.claim_generation) for e in await ledger.events(task_id)]
            assert (EventKind.LEASE_LOST, 1) in kinds

        await assert_eventually(a_refused, timeout=30, message="A's late renewal refused")

    assert [t.status.value for t in result.tasks] == ["settled", "settled"]
    assert (result.tasks[0].lease_owner, result.tasks[0].claim_generation) == ("worker-B", 2)
    shown = await attributes(handle)
    assert shown[sa.CURRENT_GENERATION.name] == 2, shown
    lost = lost_renewals("held_write")
    assert lost.get("external_call", 0) > lost_before.get("external_call", 0), lost
    assert lost.get("none", 0) == lost_before.get("none", 0), lost

    async def found_by_the_documented_query() -> None:
        query = f'WorkflowId = "{run_id}" AND AgentLeaseGeneration > 1'
        found = [w.id async for w in client.list_workflows(query)]
        assert found == [run_id], found

    await assert_eventually(found_by_the_documented_query, timeout=20, message="a finished taken-over run is found")
