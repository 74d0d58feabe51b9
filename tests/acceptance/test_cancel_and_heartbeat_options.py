"""Two defects of issue 18, on the dev server with worker processes as a user runs them.

- ``temporal workflow cancel`` of an OpenAI Agents run while a leased ``unsafe`` call sends: the call is
  stopped before the run reports cancelled (every send the downstream accepted came before
  ``WorkflowExecutionCanceled``; the history shows the activity's cancel asked and ended), the ledger
  records the cancel with the stage it reached (``cancelled_effect_unknown``: it may have sent), and
  ``agentlease waiting`` lists it, as after ``agentlease cancel``. Workers:
  ``python -m agentlease.demo.agents.openai_agent`` serving :mod:`tests.acceptance.reconciling_agents`.
- ``temporal activity update-options --heartbeat-timeout`` under a running leased call (``agentlease
  worker`` processes, :func:`tests.acceptance.reconciling_tools.slow_renewer`, lease TTL 10 s, renewing
  every second): shortened to 3 s, the call is not dead-lettered as a repeated failure; the change is
  recorded with both values and the lease follows the shorter timeout until the call settles.
  Lengthened to 40 s, the running attempt records it at a renewal before its worker is killed.

The ledger is PostgreSQL; the downstream that counts sends is the matrix's (:mod:`tests.acceptance.matrix_downstream`).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("temporalio.openai_agents", reason="needs the openai-agents extra")

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import CancelledError

from agentlease.clock import to_ms
from agentlease.demo.agents.openai_agent import AgentRequest, scripted_prompt
from agentlease.devserver import temporal_binary
from agentlease.enums import ErrorClass, EventKind, Stage, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep, RunStatus
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.fleet import Fleet, Worker, wait_polling
from tests.acceptance.matrix_downstream import MatrixDownstream, running_matrix_downstream
from tests.acceptance.runner import Cli
from tests.acceptance.test_pause_kill_matrix import WORKER_START_TIMEOUT_S, trail
from tests.eventually import assert_eventually

pytestmark = pytest.mark.timeout(300)

TOOLS = "tests.acceptance.reconciling_tools"
AGENT_WORKER = ("-m", "agentlease.demo.agents.openai_agent")
AGENT_ENV = {"AGENTLEASE_TOOL_MODULES": TOOLS, "AGENTLEASE_WORKFLOW_MODULES": "tests.acceptance.reconciling_agents"}


@pytest.fixture(scope="module")
def ledger_url(pg_module_database: Callable[[str], str]) -> str:
    return pg_module_database("ledger")


@pytest.fixture(scope="module")
def downstream_url(pg_module_database: Callable[[str], str]) -> str:
    return pg_module_database("downstream")


@dataclass
class Stack:
    client: Client
    ledger: Ledger
    fleet: Fleet
    cli: Cli
    temporal_address: str
    ledger_url: str
    run_id: str

    @property
    def queue(self) -> str:
        return f"q-{self.run_id}"

    async def worker(self, role: str, **kwargs: object) -> Worker:
        started = self.fleet.start(self.queue, f"{self.run_id}-{role}", **kwargs)  # type: ignore[arg-type]
        await wait_polling(self.client, self.queue, started, timeout=WORKER_START_TIMEOUT_S)
        return started

    async def events(self, task_id: str) -> list[LeaseEvent]:
        return await self.ledger.events(task_id)

    async def temporal(self, *args: str) -> None:
        """The ``temporal`` CLI, as an operator types it."""
        argv = [temporal_binary(), *args, "--address", self.temporal_address]
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"


@pytest.fixture
async def stack(temporal_address: str, ledger_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    (tmp_path / "data").mkdir()
    ledger = Ledger.from_url(ledger_url)
    cli = Cli(cwd=tmp_path, data_dir=tmp_path / "data")
    fleet = Fleet(temporal_address, ledger_url, cli, tool_modules=TOOLS)
    try:
        await upgrade(ledger.database)
        client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
        yield Stack(client, ledger, fleet, cli, temporal_address, ledger_url, f"i18-{uuid.uuid4().hex[:10]}")
    finally:
        await fleet.stop_all()
        await ledger.close()


@pytest.fixture
async def downstream(downstream_url: str) -> AsyncIterator[MatrixDownstream]:
    async with running_matrix_downstream(downstream_url) as running:
        yield running


# -- cancelling an OpenAI Agents run mid-call ------------------------------------------------------------


async def test_cancelling_an_openai_agents_run_stops_its_call_first_and_records_the_cancel(
    stack: Stack, downstream: MatrixDownstream
) -> None:
    s = stack
    await s.worker("agent", env=AGENT_ENV, program=Path(sys.executable), args=AGENT_WORKER)
    step = "chatty_send-call_0_0"
    task_id, key = f"{s.run_id}/{step}", f"{s.run_id}:{step}"
    call = {"tool": "chatty_send", "arguments": {"base_url": downstream.base_url, "target": s.run_id}}
    request = AgentRequest(prompt=scripted_prompt("send until stopped", [call]))
    handle: WorkflowHandle[object, str] = s.client.get_workflow_handle(s.run_id, result_type=str)
    await s.client.start_workflow("ChattyAgent", request, id=s.run_id, task_queue=s.queue)

    async def sending() -> None:
        assert len(await downstream.effects(key)) >= 3

    await assert_eventually(sending, timeout=WORKER_START_TIMEOUT_S, message="the call sends")
    await s.temporal("workflow", "cancel", "--workflow-id", s.run_id)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 60)
    assert isinstance(failed.value.cause, CancelledError)

    history = await handle.fetch_history()
    kinds = [e.event_type for e in history.events]
    [cancelled_at] = [
        to_ms(e.event_time.ToDatetime().astimezone())
        for e in history.events
        if e.event_type == (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED)
    ]
    requested = kinds.index(EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED)
    ended = [
        i
        for i, kind in enumerate(kinds)
        if kind
        in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
        )
    ]
    assert ended and requested < ended[-1] < kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED), kinds

    sends = await downstream.effects(key)
    assert sends and all(e.at_ms <= cancelled_at for e in sends), (cancelled_at, [e.at_ms for e in sends])
    await asyncio.sleep(0)  # nothing more arrives: checked again below, after the ledger reads
    record = await s.ledger.get_task(task_id)
    events = await s.events(task_id)
    assert (record.status, record.stage, record.lease_owner) == (
        TaskStatus.CANCELLED_EFFECT_UNKNOWN,
        Stage.EXTERNAL_CALL,
        None,
    ), trail(events)
    [cancel] = [e for e in events if e.kind is EventKind.CANCELLED]
    assert cancel.stage is Stage.EXTERNAL_CALL and cancel.details is not None, trail(events)
    assert (cancel.details["by"], cancel.details["effect"]) == ("agentlease", "unknown"), trail(events)
    assert not [e for e in events if e.kind is EventKind.RELEASED], trail(events)  # never given back for a retry

    env = {"AGENTLEASE_LEDGER_URL": s.ledger_url, "AGENTLEASE_TEMPORAL_ADDRESS": s.temporal_address, "COLUMNS": "300"}
    listed = await asyncio.to_thread(s.cli, "waiting", env=env)
    assert listed.returncode == 0, listed
    assert f"{s.run_id} {step}: cancelled_effect_unknown" in listed.stdout, listed
    assert len(await downstream.effects(key)) == len(sends)


# -- temporal activity update-options --heartbeat-timeout ----------------------------------------------


def plan(run_id: str, work_s: float) -> AgentRunPlan:
    return AgentRunPlan(
        agent_run_id=run_id, steps=[PlanStep(step_id="work", tool="slow_renewer", arguments={"work_s": work_s})]
    )


async def activity_id(handle: WorkflowHandle[AgentRunWorkflow, RunStatus]) -> str:
    [pending] = (await handle.describe()).raw_description.pending_activities
    return str(pending.activity_id)


async def renewing(s: Stack, task_id: str, generation: int = 1) -> None:
    events = await s.events(task_id)
    renewed = [e for e in events if e.kind is EventKind.RENEWED and e.claim_generation == generation]
    assert len(renewed) >= 3, trail(events)


async def test_a_shortened_heartbeat_timeout_is_recorded_and_followed_never_dead_lettered(stack: Stack) -> None:
    s = stack
    await s.worker("first")
    await s.worker("second")
    task_id = f"{s.run_id}/work"
    handle = await s.client.start_workflow(AgentRunWorkflow.run, plan(s.run_id, 15), id=s.run_id, task_queue=s.queue)
    await assert_eventually(lambda: renewing(s, task_id), timeout=WORKER_START_TIMEOUT_S, message="renewing")
    aid = await activity_id(handle)
    await s.temporal(
        "activity", "update-options", "--workflow-id", s.run_id, "--activity-id", aid, "--heartbeat-timeout", "3s"
    )
    done = await asyncio.wait_for(handle.result(), 150)
    record = await s.ledger.get_task(task_id)
    events = await s.events(task_id)

    assert (done.status, record.status) == ("completed", TaskStatus.SETTLED), trail(events)
    assert not [e for e in events if e.kind is EventKind.DEAD_LETTERED], trail(events)
    # Recorded with both values: by a renewal, a claim, or the release of an attempt Temporal cut off.
    noted = [e for e in events if (e.details or {}).get("heartbeat_timeout_ms") == 3000]
    assert noted and all(e.details and e.details["lease_ttl_ms"] == 10_000 for e in noted), trail(events)
    # An attempt Temporal cut off on the changed timeout is given back, not counted as a real failure.
    releases = [e for e in events if e.kind is EventKind.RELEASED]
    assert all((e.reason or "").startswith(ErrorClass.HEARTBEAT_TIMEOUT_CHANGED.value) for e in releases), trail(events)
    assert record.attempts == 1, record
    # The settling attempt's lease followed the shorter timeout: each renewal extended it by 3 s.
    renewals = [e for e in events if e.kind is EventKind.RENEWED and e.claim_generation == record.claim_generation]
    extensions = {(e.details or {})["lease_expires_at_ms"] - to_ms(e.at) for e in renewals[2:]}
    assert extensions == {3000}, trail(events)


async def test_a_lengthened_heartbeat_timeout_is_recorded_by_the_next_renewal_before_a_crash(stack: Stack) -> None:
    s = stack
    first = await s.worker("first")
    task_id = f"{s.run_id}/work"
    handle = await s.client.start_workflow(AgentRunWorkflow.run, plan(s.run_id, 60), id=s.run_id, task_queue=s.queue)
    await assert_eventually(lambda: renewing(s, task_id), timeout=WORKER_START_TIMEOUT_S, message="renewing")
    aid = await activity_id(handle)
    await s.temporal(
        "activity", "update-options", "--workflow-id", s.run_id, "--activity-id", aid, "--heartbeat-timeout", "40s"
    )

    async def recorded() -> LeaseEvent:
        events = await s.events(task_id)
        noted = [
            e
            for e in events
            if e.kind is EventKind.RENEWED and e.claim_generation == 1 and (e.details or {}).get("heartbeat_timeout_ms")
        ]
        assert noted, trail(events)
        return noted[0]

    noted = await assert_eventually(recorded, timeout=30, interval=0.2, message="the renewal recorded the change")
    first.signal(signal.SIGKILL)
    assert noted.details is not None
    assert (noted.details["heartbeat_timeout_ms"], noted.details["lease_ttl_ms"]) == (40_000, 10_000)
    assert "heartbeat timeout is now 40s, not the lease TTL 10s" in (noted.reason or "")
    assert "the lease keeps its TTL (10s)" in (noted.reason or "")
    # The lease did not follow the longer timeout: the renewal extended it by the lease's own TTL.
    assert noted.details["lease_expires_at_ms"] - to_ms(noted.at) == 10_000
    await handle.terminate("the test is done")
