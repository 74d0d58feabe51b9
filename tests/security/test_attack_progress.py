"""ATTACK (held): lease progress signals proven for one run do not prove progress in another, and a proven
signal's fields cannot be changed under its proof.

Two runs with the same step id (``write``) on the real dev server, no codec (the worst case for the run: its
history is readable). The attacker copies a proven ``agentlease.lease_progress`` signal of run A from A's
history and sends it to run B, and sends it to A again with generation 999 and another owner: B counts it
refused (another run's secret), A counts the altered ones refused (one of them claiming 1,000 refused
writes, for ``AgentLeaseRefusedWrites``), and neither view shows them.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.records import AgentRunPlan, PlanStep
from agentlease.runtime.names import LEASE_PROGRESS_SIGNAL, STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import opened_ledger
from tests.integration.tools import gate

pytestmark = pytest.mark.timeout(120)


async def _proven_signals(handle: WorkflowHandle) -> list[dict[str, Any]]:
    found = []
    async for event in handle.fetch_history_events():
        attributes = event.workflow_execution_signaled_event_attributes
        if event.HasField("workflow_execution_signaled_event_attributes") and attributes.signal_name == (
            LEASE_PROGRESS_SIGNAL
        ):
            [payload] = pydantic_data_converter.payload_converter.from_payloads(attributes.input.payloads)
            found.append(payload)
    return [p for p in found if p.get("proof")]


async def test_a_proven_signal_of_one_run_proves_nothing_in_another_nor_altered(
    client: Client, settings: AgentLeaseSettings, temporal_address: str
) -> None:
    settings = settings.model_copy(update={"worker_identity": "worker-p"})
    registry = load_registry(["tests.security.progress_tools"])
    attacker = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
    runs = [f"prog-{uuid.uuid4().hex[:8]}" for _ in "ab"]
    plan = [AgentRunPlan(agent_run_id=r, steps=[PlanStep(step_id="write", tool="two_gates")]) for r in runs]
    async with opened_ledger(settings) as ledger, build_worker(client, ledger, registry, settings, identity="worker-p"):
        handles = [
            await client.start_workflow(AgentRunWorkflow.run, p, id=r, task_queue=settings.task_queue)
            for r, p in zip(runs, plan, strict=True)
        ]
        try:

            async def both_in_preflight() -> None:
                for handle in handles:
                    [view] = (await handle.query(STATUS_QUERY))["tasks"]
                    assert view["stage"] == "preflight", view
                assert await _proven_signals(handles[0])

            await assert_eventually(both_in_preflight, timeout=40, message="both runs show a proven signal")
            [copied, *_] = await _proven_signals(handles[0])
            a, b = (attacker.get_workflow_handle(r) for r in runs)
            await b.signal(LEASE_PROGRESS_SIGNAL, {**copied, "stage": "verify", "reason": "copied from run a"})
            await b.signal(LEASE_PROGRESS_SIGNAL, copied)  # as it stands in a's history
            await a.signal(LEASE_PROGRESS_SIGNAL, {**copied, "claim_generation": 999, "lease_owner": "mallory"})
            await a.signal(LEASE_PROGRESS_SIGNAL, {**copied, "refused_writes": 1000})  # AgentLeaseRefusedWrites
            status_a, status_b = [await h.query(STATUS_QUERY) for h in handles]
            assert status_b.get("refused_progress") == 2, status_b
            assert status_a.get("refused_progress") == 2, status_a
            for status in (status_a, status_b):
                [view] = status["tasks"]
                assert (view["claim_generation"], view["lease_owner"]) == (1, "worker-p"), view
                assert "copied" not in str(view.get("progress")), view
                assert not view.get("refused_writes"), view
        finally:
            for run in runs:
                gate(f"{run}/write#1").set()
                gate(f"{run}/write#2").set()
        for handle in handles:
            result = await handle.result()
            assert [t.status.value for t in result.tasks] == ["settled"]
            assert not any(t.refused_writes for t in result.tasks)
