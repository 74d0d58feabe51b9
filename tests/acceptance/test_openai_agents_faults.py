"""Faults inside an agent run on the OpenAI Agents SDK, with worker processes as a user runs them.

Workers are ``python -m agentlease.demo.agents.openai_agent`` processes (the example's worker: the
OpenAI plugin with its scripted model, ``AgentLeasePlugin``), configured by ``AGENTLEASE_*``, serving
the agent of :mod:`tests.acceptance.agent_workflows`, whose tools are the pause/kill matrix's with a
6 s lease (:mod:`tests.acceptance.agent_tools`); the downstream is the matrix's HTTP server, which
counts its own accepted writes (:mod:`tests.acceptance.matrix_downstream`); the ledger is
PostgreSQL. The agent's model calls one tool; its generation-1 attempt holds at a stage (renewing)
until the test kills or pauses its worker, and a second worker takes over.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio.openai_agents", reason="needs the openai-agents extra")

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.demo.agents import scripted_prompt
from agentlease.demo.agents.openai_agent import AgentRequest
from agentlease.enums import EventKind, Stage, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import LeaseEvent, TaskRecord
from tests.acceptance.agent_workflows import FaultsAgent
from tests.acceptance.fleet import Fleet, Worker, wait_polling
from tests.acceptance.matrix_downstream import MatrixDownstream, running_matrix_downstream
from tests.acceptance.matrix_tools import HOLDING
from tests.acceptance.runner import Cli
from tests.acceptance.test_pause_kill_matrix import WORKER_START_TIMEOUT_S, event, fate, trail, writer_of
from tests.eventually import assert_eventually
from tests.lease_trail import assert_one_valid_lease_at_a_time

pytestmark = pytest.mark.timeout(300)

AGENT_WORKER = ("-m", "agentlease.demo.agents.openai_agent")
"""The example's worker, run by this interpreter as its module docstring says."""

AGENT_ENV = {
    "AGENTLEASE_TOOL_MODULES": "tests.acceptance.agent_tools",
    "AGENTLEASE_WORKFLOW_MODULES": "tests.acceptance.agent_workflows",
}


@pytest.fixture(scope="module")
def faults_ledger_url(pg_module_database: Callable[[str], str]) -> str:
    return pg_module_database("ledger")


@pytest.fixture(scope="module")
def faults_downstream_url(pg_module_database: Callable[[str], str]) -> str:
    return pg_module_database("downstream")


@dataclass
class Faults:
    """One test's agent run: the queue its workers poll, the ledger, the counting downstream."""

    client: Client
    ledger: Ledger
    downstream: MatrixDownstream
    fleet: Fleet
    work_dir: Path
    run_id: str
    tool: str

    @property
    def queue(self) -> str:
        return f"agent-{self.run_id}"

    @property
    def step_id(self) -> str:
        return f"{self.tool}-call_0_0"  # the scripted model's first call id

    @property
    def task_id(self) -> str:
        return f"{self.run_id}/{self.step_id}"

    @property
    def key(self) -> str:
        return f"{self.run_id}:{self.step_id}"

    @property
    def resume_file(self) -> Path:
        return self.work_dir / f"{self.run_id}.resume"

    async def worker(self, role: str) -> Worker:
        started = self.fleet.start(
            self.queue, f"{self.run_id}-{role}", env=AGENT_ENV, program=Path(sys.executable), args=AGENT_WORKER
        )
        await wait_polling(self.client, self.queue, started, timeout=WORKER_START_TIMEOUT_S)
        return started

    async def start_agent(self, hold_at: Stage) -> WorkflowHandle[FaultsAgent, str]:
        arguments = {
            "base_url": self.downstream.base_url,
            "target": self.run_id,
            "hold_at": hold_at.value,
            "resume_file": str(self.resume_file),
        }
        prompt = scripted_prompt(f"write {self.run_id}", [{"tool": self.tool, "arguments": arguments}])
        return await self.client.start_workflow(
            FaultsAgent.run, AgentRequest(prompt=prompt), id=self.run_id, task_queue=self.queue
        )

    async def holding(self, stage: Stage, owner: str) -> None:
        """Generation 1 renews at ``stage`` while it waits to be killed or paused."""
        events = await self.ledger.events(self.task_id)
        held = [
            e
            for e in events
            if e.kind is EventKind.RENEWED and e.claim_generation == 1 and (e.reason or "").startswith(HOLDING)
        ]
        assert held and (held[-1].stage, held[-1].lease_owner) == (stage, owner), trail(events)

    async def record(self) -> TaskRecord:
        return await self.ledger.get_task(self.task_id)

    async def events(self) -> list[LeaseEvent]:
        return await self.ledger.events(self.task_id)

    def output(self, answer: str) -> dict[str, Any]:
        """What the tool returned, as the agent's final answer quotes it."""
        lines = answer.splitlines()
        assert lines[0] == f"scripted model, task: write {self.run_id}", answer
        output: dict[str, Any] = json.loads(lines[1].removeprefix(f"- {self.tool}: "))
        return output


def faults_fixture(name: str, tool: str) -> Any:
    """A fixture ``name``: a :class:`Faults` whose agent calls ``tool``; every worker process is stopped after."""

    @pytest.fixture(name=name)
    async def faults(
        temporal_address: str, faults_ledger_url: str, faults_downstream_url: str, tmp_path: Path
    ) -> AsyncIterator[Faults]:
        (tmp_path / "data").mkdir()
        ledger = Ledger.from_url(faults_ledger_url)
        fleet = Fleet(temporal_address, faults_ledger_url, Cli(cwd=tmp_path, data_dir=tmp_path / "data"))
        try:
            await upgrade(ledger.database)
            async with running_matrix_downstream(faults_downstream_url) as downstream:
                client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
                run_id = f"oa-{tool}-{uuid.uuid4().hex[:8]}"
                yield Faults(client, ledger, downstream, fleet, tmp_path, run_id, tool)
        finally:
            await fleet.stop_all()
            await ledger.close()

    return faults


idempotent_faults = faults_fixture("idempotent", "agent_idempotent")
fenced_faults = faults_fixture("fenced", "agent_fenced")


async def test_killed_after_its_write_the_retry_reads_back_and_the_agent_answers(idempotent: Faults) -> None:
    """G6 inside an agent run: the first attempt of an idempotent tool writes, reaches commit and its
    worker is SIGKILLed; the retry on the second worker reads back instead of writing. The downstream
    holds one effect, the receipt is stored, and the agent's final answer carries the retry's output."""
    f = idempotent
    first = await f.worker("first")
    handle = await f.start_agent(hold_at=Stage.COMMIT)
    await assert_eventually(
        lambda: f.holding(Stage.COMMIT, first.identity), timeout=WORKER_START_TIMEOUT_S, message="held at commit"
    )
    second = await f.worker("second")
    first.signal(signal.SIGKILL)
    answer = await asyncio.wait_for(handle.result(), timeout=120)

    effects = await f.downstream.effects(f.key)
    assert [writer_of(e.writer) for e in effects] == [first.identity], effects  # one effect: the first write
    events = await f.events()
    claims = [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED]
    assert claims == [(1, first.identity), (2, second.identity)], trail(events)
    assert event(events, EventKind.EXPIRED, 1).stage is Stage.COMMIT
    assert_one_valid_lease_at_a_time(events)

    record = await f.record()
    assert (record.status, record.claim_generation, record.lease_owner) == (TaskStatus.SETTLED, 2, second.identity)
    assert record.receipt is not None and record.receipt.details["recovery"] == "read_back_first", record
    output = f.output(answer)
    assert (output["generation"], output["owner"], output["recovery"], output["wrote"]) == (
        2,
        second.identity,
        "read_back_first",
        False,
    ), answer
    assert output["found"]["action"] == f.key and writer_of(output["found"]["writer"]) == first.identity, answer


async def test_paused_holder_cannot_renew_settle_or_write_through_the_fence(fenced: Faults) -> None:
    """The seeds' operational test inside an agent run: generation 1 of a fenced tool is SIGSTOPped in
    external_call past its lease; the second worker takes over with generation 2, writes and settles;
    resumed, the first cannot renew (lease_lost), write (the fence answers 409) or settle (late_unapplied).
    The downstream accepted one write, generation 2's, and the agent's answer carries generation 2's output."""
    f = fenced
    first = await f.worker("first")
    handle = await f.start_agent(hold_at=Stage.EXTERNAL_CALL)
    await assert_eventually(
        lambda: f.holding(Stage.EXTERNAL_CALL, first.identity),
        timeout=WORKER_START_TIMEOUT_S,
        message="held in external_call",
    )
    first.signal(signal.SIGSTOP)
    second = await f.worker("second")

    async def taken_over() -> None:
        record = await f.record()
        assert (record.status, record.claim_generation) == (TaskStatus.SETTLED, 2), record

    await assert_eventually(taken_over, timeout=WORKER_START_TIMEOUT_S, message="generation 2 settled")
    f.resume_file.touch()
    first.signal(signal.SIGCONT)

    async def refused_late() -> set[EventKind]:
        events = await f.events()
        claim2 = event(events, EventKind.CLAIMED, 2)
        late = {e.kind for e in events if e.claim_generation == 1 and e.event_id > claim2.event_id}
        assert late == {EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED}, trail(events)
        return late

    await assert_eventually(refused_late, timeout=60, message="the resumed holder's renewal and settle were refused")
    answer = await asyncio.wait_for(handle.result(), timeout=120)

    requests = await f.downstream.requests(f.run_id)
    posts = [(writer_of(r.writer), fate(r)) for r in requests if r.method == "POST"]
    assert posts == [(second.identity, "applied"), (first.identity, "stale")], requests
    effects = await f.downstream.effects(f.key)
    assert [(writer_of(e.writer), e.generation) for e in effects] == [(second.identity, 2)], effects

    events = await f.events()
    assert [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED] == [
        (1, first.identity),
        (2, second.identity),
    ], trail(events)
    assert_one_valid_lease_at_a_time(events)
    late = [e for e in events if e.claim_generation == 1 and e.kind in (EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED)]
    assert all(e.lease_owner == first.identity and "generation 2" in (e.reason or "") for e in late), trail(events)
    record = await f.record()
    assert (record.status, record.claim_generation, record.lease_owner) == (TaskStatus.SETTLED, 2, second.identity)
    output = f.output(answer)
    assert (output["generation"], output["owner"], output["recovery"], output["wrote"]) == (
        2,
        second.identity,
        "retry_same_key",
        True,
    ), answer
