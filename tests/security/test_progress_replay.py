"""A run whose attempt signalled its progress, with a spoofed progress signal between its signals, replays:
the run's own signals are proven, the spoofed one is dropped and counted, with no command of its own.

``tests/histories/progress/spoofed.json`` is such a run, recorded on the dev server at the replay floor
(``agentlease/workflow/_versions.py``). To record it again, run
``AGENTLEASE_RECORD_HISTORIES=1 pytest tests/security/test_progress_replay.py``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.records import AgentRunPlan, PlanStep
from agentlease.runtime.names import LEASE_PROGRESS_SIGNAL, STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from agentlease.workflow._versions import FLOOR_MARKER
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import opened_ledger
from tests.integration.test_replay import patches, replayer
from tests.integration.tools import gate

pytestmark = pytest.mark.timeout(120)

RECORDED = Path(__file__).resolve().parents[1] / "histories" / "progress" / "spoofed.json"
RECORD = os.environ.get("AGENTLEASE_RECORD_HISTORIES") == "1"
SPOOF = {"step_id": "write", "claim_generation": 999, "lease_owner": "mallory", "stage": "verify", "reason": "x"}


def _signals(history: WorkflowHistory) -> list[str]:
    return [
        event.workflow_execution_signaled_event_attributes.signal_name
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]


async def test_a_recorded_run_with_a_spoofed_progress_signal_replays() -> None:
    history = WorkflowHistory.from_json("spoofed-progress", RECORDED.read_text())
    # What the history holds: the attempt's own progress and a spoofed one.
    assert _signals(history).count(LEASE_PROGRESS_SIGNAL) >= 3, _signals(history)
    assert patches(history) == {FLOOR_MARKER}
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_a_run_with_its_own_and_a_spoofed_progress_signal_replays(
    client: Client, settings: AgentLeaseSettings, temporal_address: str
) -> None:
    """The run replays, and shows none of the spoofed signal; with ``AGENTLEASE_RECORD_HISTORIES=1`` its
    history is written to ``RECORDED``."""
    registry = load_registry(["tests.security.progress_tools"])
    attacker = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
    run_id = f"spoofed-progress-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/write"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="write", tool="two_gates")])
    async with opened_ledger(settings) as ledger, build_worker(client, ledger, registry, settings, identity="worker-p"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        try:

            async def live() -> None:
                status = await handle.query(STATUS_QUERY)
                assert status["tasks"][0]["stage"] == "preflight", status

            await assert_eventually(live, timeout=40, message="the attempt's progress is shown")
            await attacker.get_workflow_handle(run_id).signal(LEASE_PROGRESS_SIGNAL, SPOOF)
            gate(f"{task_id}#1").set()

            async def next_stage_signalled() -> None:
                assert _signals(await handle.fetch_history()).count(LEASE_PROGRESS_SIGNAL) >= 3

            await assert_eventually(next_stage_signalled, timeout=40, message="the attempt signals its next stage")
        finally:
            gate(f"{task_id}#1").set()
            gate(f"{task_id}#2").set()
        final = await handle.result()
    assert final.refused_progress == 1 and final.tasks[0].lease_owner != SPOOF["lease_owner"], final
    history = await handle.fetch_history()
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    if RECORD:
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        RECORDED.write_text(history.to_json())
