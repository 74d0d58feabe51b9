"""Determinism: ``AgentRunWorkflow`` replays recorded histories without a non-determinism error, down to
the replay floor (``agentlease/workflow/_versions.py``), and refuses older ones in one line.

Three histories are recorded on the real dev server (a settled run, a run with decisions: an
approval and a reconciliation, and a cancelled run) and kept in ``tests/histories/``. A change to
the workflow code that would break a run already in flight on a deployed worker fails
``test_recorded_histories_replay``. The same three runs, recorded again now, must replay too.

To record them anew after a deliberate change of the workflow (behind a patch listed in ``_versions.py``,
or with a new replay floor), run ``AGENTLEASE_RECORD_HISTORIES=1 pytest tests/integration/test_replay.py``.
They were recorded by 0.4, the floor. ``tests/histories/before_0_4/settled.json`` was recorded by 0.3:
its replay fails with the line that names the floor.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from agentlease.decisions.table import CancelRequest, DecisionRequest, ReconcileRequest
from agentlease.plugin import _pass_through
from agentlease.records import RunStatus
from agentlease.runtime.names import DESCRIBE_RUN, STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._interceptor import LeasedCallsInterceptor
from agentlease.workflow._plan import AgentRunWorkflow
from agentlease.workflow._versions import BELOW_FLOOR, FLOOR_MARKER
from tests.eventually import assert_eventually
from tests.integration import tools
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

pytestmark = pytest.mark.timeout(180)

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
BEFORE_THE_FLOOR = HISTORIES / "before_0_4" / "settled.json"
"""A settled run recorded by agentlease 0.3, below the replay floor."""
RECORD = os.environ.get("AGENTLEASE_RECORD_HISTORIES") == "1"


def patches(history: WorkflowHistory) -> set[str]:
    """The patch ids the run recorded."""
    return {
        json.loads(payload.data)["id"]
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and event.marker_recorded_event_attributes.marker_name == "core_patch"
        for payload in event.marker_recorded_event_attributes.details["patch-data"].payloads
    }


def local_activities(history: WorkflowHistory) -> list[str]:
    """The activity types of the run's local activities, in the order recorded."""
    return [
        json.loads(event.marker_recorded_event_attributes.details["data"].payloads[0].data)["activity_type"]
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and event.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]


def replayer() -> Replayer:
    """A replayer as a worker with ``AgentLeasePlugin`` replays: ``agentlease`` passed through the
    sandbox (one copy of its records, as the recording worker had) and the plugin's interceptor."""
    return Replayer(
        workflows=[AgentRunWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=_pass_through(None),
        interceptors=[LeasedCallsInterceptor()],
    )


async def step_is(handle: WorkflowHandle, step_id: str, status: str) -> None:
    async def check() -> None:
        current = await handle.query(STATUS_QUERY, result_type=RunStatus)
        assert {t.step_id: t.status.value for t in current.tasks}[step_id] == status, current

    await assert_eventually(check, timeout=40, message=f"{step_id} is {status}")


async def settled(handle: WorkflowHandle) -> None:
    await handle.result()


async def with_decisions(handle: WorkflowHandle) -> None:
    await step_is(handle, "mail", "awaiting_approval")
    await handle.execute_update("approve", DecisionRequest(step_id="mail", by="alice", reason="ticket OPS-12"))
    await step_is(handle, "mail", "needs_reconciliation")
    retry = ReconcileRequest(step_id="mail", by="alice", reason="not in the MTA log", action="retry")
    await handle.execute_update("reconcile", retry)
    await handle.result()


async def cancelled(handle: WorkflowHandle) -> None:
    await step_is(handle, "export", "running")
    await handle.execute_update("cancel", CancelRequest(by="carol", reason="customer withdrew"))
    await handle.result()


SCENARIOS: dict[str, tuple[list[tuple[str, str, dict]], Callable[[WorkflowHandle], Awaitable[None]]]] = {
    "settled": ([("first", "quick", {}), ("second", "quick", {})], settled),
    "decisions": ([("check", "quick", {}), ("mail", "send_once", {"hold_first_attempt": True})], with_decisions),
    "cancelled": ([("export", "long_call", {}), ("after", "quick", {})], cancelled),
}


async def record(client: Client, settings: AgentLeaseSettings, name: str) -> WorkflowHistory:
    steps, drive = SCENARIOS[name]
    run_id = f"replay-{name}-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, f"worker-replay-{name}"):
        handle = await client.start_workflow(
            AgentRunWorkflow.run, _plan(run_id, *steps), id=run_id, task_queue=settings.task_queue
        )
        await asyncio.wait_for(drive(handle), timeout=120)
    tools.PROBES.clear()
    return await handle.fetch_history()


FRAMEWORK_HISTORIES = ("pydantic_ai_", "openai_")
"""Prefixes of the agent frameworks' histories, replayed by their own tests."""


def test_recorded_histories_exist() -> None:
    recorded = [path.stem for path in HISTORIES.glob("*.json") if not path.stem.startswith(FRAMEWORK_HISTORIES)]
    assert sorted(recorded) == sorted(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_recorded_histories_replay(name: str) -> None:
    history = WorkflowHistory.from_json(f"recorded-{name}", (HISTORIES / f"{name}.json").read_text())
    assert patches(history) == {FLOOR_MARKER}  # recorded at the floor
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_a_history_recorded_below_the_floor_fails_replay_in_one_line() -> None:
    history = WorkflowHistory.from_json("recorded-by-0.3", BEFORE_THE_FLOOR.read_text())
    assert FLOOR_MARKER not in patches(history)
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    # Its first workflow task fails with the floor's line.
    failure = str(result.replay_failure)
    assert f'message: "{BELOW_FLOOR}"' in failure and 'type: "ReplayFloorError"' in failure, failure
    assert "\n" not in BELOW_FLOOR and "agentlease < 0.4" in BELOW_FLOOR and "drain runs" in BELOW_FLOOR


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_fresh_histories_replay(client: Client, settings: AgentLeaseSettings, name: str) -> None:
    history = await record(client, settings, name)
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    # A new run records one patch marker, the floor's.
    assert patches(history) == {FLOOR_MARKER}
    # The run's catalog and its progress secret come from one local activity.
    assert local_activities(history) == [DESCRIBE_RUN]
    if RECORD:
        HISTORIES.mkdir(exist_ok=True)
        (HISTORIES / f"{name}.json").write_text(history.to_json())
