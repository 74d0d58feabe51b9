"""Two defects of issue 18, on the dev server with worker processes as a user runs them.

- ``temporal workflow cancel`` of an OpenAI Agents run while a leased ``unsafe`` call sends: the call is
  stopped before the run reports cancelled (every send the downstream accepted came before
  ``WorkflowExecutionCanceled``; the history shows the activity's cancel asked and ended), the ledger
  records the cancel with the stage it reached (``cancelled_effect_unknown``: it may have sent), and
  ``agentlease waiting`` lists it, as after ``agentlease cancel``. Workers:
  ``python -m agentlease.demo.agents.openai_agent`` serving :mod:`tests.acceptance.reconciling_agents`.
- ``temporal activity update-options --heartbeat-timeout`` under a running leased call (``agentlease
  worker`` processes, :func:`tests.acceptance.reconciling_tools.slow_renewer`, lease TTL 10 s, renewing
  every second): shortened to 3 s, the running attempt is never cut off (one claim, one attempt in
  Temporal's history, each of its records written once); the change is recorded with both values and the
  lease follows the shorter timeout until the call settles. Lengthened to 40 s, the renewal right after
  the command records it (ledger and worker log) before the worker is killed.

The ledger is a SQLite file or PostgreSQL; the downstream that counts sends is the matrix's
(:mod:`tests.acceptance.matrix_downstream`).
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
from agentlease.demo.agents import scripted_prompt
from agentlease.demo.agents.openai_agent import AgentRequest
from agentlease.enums import EventKind, Stage, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep, RunStatus
from agentlease.runtime.devserver import temporal_binary
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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path, pg_module_database: Callable[[str], str]) -> str:
    """The workers' ledger: a SQLite file, or a PostgreSQL database of the module's server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
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


def plan(run_id: str, seconds: int, **arguments: str) -> AgentRunPlan:
    step = PlanStep(step_id="work", tool="slow_renewer", arguments={"seconds": seconds, **arguments})
    return AgentRunPlan(agent_run_id=run_id, steps=[step])


async def activity_id(handle: WorkflowHandle[AgentRunWorkflow, RunStatus]) -> str:
    [pending] = (await handle.describe()).raw_description.pending_activities
    return str(pending.activity_id)


def renewals(events: list[LeaseEvent], generation: int = 1) -> list[LeaseEvent]:
    return [e for e in events if e.kind is EventKind.RENEWED and e.claim_generation == generation]


async def renewing(s: Stack, task_id: str, seconds: int = 1) -> None:
    """Generation 1 has renewed in ``external_call`` ``seconds`` times."""
    events = await s.events(task_id)
    assert f"working, second {seconds}" in [e.reason for e in renewals(events)], trail(events)


async def attempts_started(handle: WorkflowHandle[AgentRunWorkflow, RunStatus], tool: str) -> list[int]:
    """Temporal's attempt number of each start of ``tool``'s activity in the run's history (a retry replaces
    the started event of the attempt before it, so a cut-off attempt shows as attempt 2)."""
    events = (await handle.fetch_history()).events
    scheduled = {
        e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == tool
    }
    return [
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]


async def test_a_shortened_heartbeat_timeout_is_recorded_and_followed_never_cutting_the_call_off(
    stack: Stack, downstream: MatrixDownstream
) -> None:
    s = stack
    await s.worker("first")
    await s.worker("second")
    task_id, key, records = f"{s.run_id}/work", f"{s.run_id}:work", 12
    run = plan(s.run_id, records, base_url=downstream.base_url, target=s.run_id)
    handle = await s.client.start_workflow(AgentRunWorkflow.run, run, id=s.run_id, task_queue=s.queue)
    await assert_eventually(lambda: renewing(s, task_id, 3), timeout=WORKER_START_TIMEOUT_S, message="renewing")
    aid = await activity_id(handle)
    await s.temporal(
        "activity", "update-options", "--workflow-id", s.run_id, "--activity-id", aid, "--heartbeat-timeout", "3s"
    )
    done = await asyncio.wait_for(handle.result(), 150)
    record = await s.ledger.get_task(task_id)
    events = await s.events(task_id)

    assert (done.status, record.status) == ("completed", TaskStatus.SETTLED), trail(events)
    # Never cut off: one claim, generation 1 settles, one attempt in Temporal's history, each record written once.
    assert [e.claim_generation for e in events if e.kind is EventKind.CLAIMED] == [1], trail(events)
    assert not [e for e in events if e.kind in (EventKind.RELEASED, EventKind.DEAD_LETTERED)], trail(events)
    assert (record.claim_generation, record.attempts) == (1, 1), record
    assert await attempts_started(handle, "slow_renewer") == [1]
    assert len(await downstream.effects(key)) == records
    # Recorded with both values by a renewal; from then on the lease followed the shorter timeout.
    noted = [e for e in events if (e.details or {}).get("heartbeat_timeout_ms") == 3000]
    assert [(e.kind, (e.details or {})["lease_ttl_ms"]) for e in noted] == [(EventKind.RENEWED, 10_000)], trail(events)
    since = [e for e in renewals(events) if e.at >= noted[0].at]
    extensions = {(e.details or {})["lease_expires_at_ms"] - to_ms(e.at) for e in since}
    assert extensions == {3000}, trail(events)


async def test_a_lengthened_heartbeat_timeout_is_recorded_by_the_next_renewal_before_a_crash(
    stack: Stack, tmp_path: Path
) -> None:
    s = stack
    first = await s.worker("first")
    task_id, gates = f"{s.run_id}/work", tmp_path / "gates"
    gates.mkdir()
    for n in (1, 2, 3):
        (gates / str(n)).touch()
    run = plan(s.run_id, 60, gate_dir=str(gates))
    handle = await s.client.start_workflow(AgentRunWorkflow.run, run, id=s.run_id, task_queue=s.queue)
    await assert_eventually(lambda: renewing(s, task_id, 3), timeout=WORKER_START_TIMEOUT_S, message="renewing")
    aid = await activity_id(handle)
    await s.temporal(
        "activity", "update-options", "--workflow-id", s.run_id, "--activity-id", aid, "--heartbeat-timeout", "40s"
    )
    (gates / "4").touch()  # the next renewal goes only now, after the command returned

    async def renewed_next() -> LeaseEvent:
        events = await s.events(task_id)
        found = [e for e in renewals(events) if (e.reason or "").startswith("working, second 4")]
        assert len(found) == 1, trail(events)
        return found[0]

    noted = await assert_eventually(renewed_next, timeout=30, interval=0.2, message="the next renewal")
    first.signal(signal.SIGKILL)
    events = await s.events(task_id)
    assert noted.details is not None and "heartbeat_timeout_ms" in noted.details, trail(events)
    assert (noted.details["heartbeat_timeout_ms"], noted.details["lease_ttl_ms"]) == (40_000, 10_000)
    assert "heartbeat timeout is now 40s, not the lease TTL 10s" in (noted.reason or "")
    assert "the lease keeps its TTL (10s)" in (noted.reason or "")
    # The lease did not follow the longer timeout: the renewal extended it by the lease's own TTL.
    assert noted.details["lease_expires_at_ms"] - to_ms(noted.at) == 10_000
    # The worker's log said so too, before it was killed.
    await asyncio.to_thread(first.command.wait_for_line, "heartbeat timeout is now 40s", timeout=10)
    await handle.terminate("the test is done")
