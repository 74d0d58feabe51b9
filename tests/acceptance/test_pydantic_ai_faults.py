"""A Pydantic AI agent's leased tool call when its worker dies or pauses, with worker processes.

Workers are ``python -m agentlease.demo.agents.pydantic_ai_agent`` processes (the example's worker:
``PydanticAIPlugin`` on the client, ``AgentLeasePlugin`` on the worker) that also serve the agent
of :mod:`tests.acceptance.pydantic_ai_fault_agent`, whose tools run the pause/kill matrix's code
(hold points) against the matrix's downstream, which counts the writes it accepted in its own
database; the ledger is PostgreSQL; Temporal is the session's dev server. The agent's scripted
model makes one tool call and answers with what it was told.

- kill: the first attempt of an ``idempotent`` call writes, reaches ``commit`` and holds; its
  worker is SIGKILLed; the retry on the second worker (generation 2) reads back instead of
  writing. One effect at the downstream, the receipt stored, the answer is the retry's output.
- pause (the operational test inside an agent run): the first attempt of a ``fenced`` call holds
  in ``external_call`` before its write; its worker is SIGSTOPped past the lease; the second
  worker takes over with generation 2, writes and settles; the first is resumed and sends its
  write: the downstream's fence refuses it, and the ledger refuses its renewal (``lease_lost``)
  and its settle (``late_unapplied``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.enums import EventKind, Stage, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import LeaseEvent, TaskRecord
from tests.acceptance.fleet import Fleet, Worker, wait_polling
from tests.acceptance.matrix_downstream import MatrixDownstream, running_matrix_downstream
from tests.acceptance.matrix_tools import HOLDING
from tests.acceptance.pydantic_ai_fault_agent import WORKFLOW
from tests.acceptance.runner import Cli
from tests.acceptance.test_pause_kill_matrix import WORKER_START_TIMEOUT_S, event, fate, trail, writer_of
from tests.eventually import assert_eventually
from tests.integration.pydantic_ai_agents import prompt_for
from tests.lease_trail import assert_one_valid_lease_at_a_time

pytestmark = pytest.mark.timeout(300)

AGENT_WORKER = ("-m", "agentlease.demo.agents.pydantic_ai_agent")
"""The example's worker, run by this interpreter as its module docstring says."""
FAULT_AGENT = "tests.acceptance.pydantic_ai_fault_agent"
SERVES_FAULT_AGENT = {"AGENTLEASE_TOOL_MODULES": FAULT_AGENT, "AGENTLEASE_WORKFLOW_MODULES": FAULT_AGENT}


@dataclass
class Run:
    """One agent run whose single leased call the test stops at a stage."""

    client: Client
    ledger: Ledger
    downstream: MatrixDownstream
    fleet: Fleet
    work_dir: Path
    queue: str
    run_id: str
    handle: WorkflowHandle[Any, str] | None = None

    @property
    def resume_file(self) -> Path:
        return self.work_dir / f"{self.run_id}.resume"

    def worker(self, role: str) -> Worker:
        return self.fleet.start(
            self.queue,
            f"{self.run_id}-{role}",
            slots=4,
            program=Path(sys.executable),
            args=AGENT_WORKER,
            env=SERVES_FAULT_AGENT,
        )

    async def start(self, tool: str, hold_at: Stage) -> None:
        arguments = {
            "base_url": self.downstream.base_url,
            "target": self.run_id,
            "hold_at": hold_at.value,
            "resume_file": str(self.resume_file),
        }
        self.handle = await self.client.start_workflow(
            WORKFLOW, prompt_for([(tool, arguments)]), id=self.run_id, task_queue=self.queue, result_type=str
        )

    async def task(self) -> TaskRecord:
        tasks = await self.ledger.list_tasks(self.run_id)
        assert len(tasks) == 1, f"expected the agent's one call, found {tasks}"
        return tasks[0]

    async def events(self) -> list[LeaseEvent]:
        return await self.ledger.events((await self.task()).task_id)

    async def holding(self, stage: Stage, owner: Worker) -> None:
        """Generation 1 renews at ``stage`` (the tool's hold point), held by ``owner``."""

        async def check() -> None:
            events = await self.events()
            held = [
                e
                for e in events
                if e.kind is EventKind.RENEWED and e.claim_generation == 1 and (e.reason or "").startswith(HOLDING)
            ]
            assert held and (held[-1].stage, held[-1].lease_owner) == (stage, owner.identity), trail(events)

        await assert_eventually(check, timeout=WORKER_START_TIMEOUT_S, interval=0.25, message=f"held at {stage}")

    async def held(self, tool: str, stage: Stage) -> Worker:
        """Start the first worker and the run; return the worker once generation 1 holds at ``stage``."""
        first = self.worker("first")
        await wait_polling(self.client, self.queue, first, timeout=WORKER_START_TIMEOUT_S)
        await self.start(tool, stage)
        await self.holding(stage, first)
        return first

    async def answer(self) -> list[dict[str, Any]]:
        assert self.handle is not None
        told: list[dict[str, Any]] = json.loads(await asyncio.wait_for(self.handle.result(), 120))
        return told


@pytest.fixture(scope="module")
def fault_ledger_url(pg_module_database: Callable[[str], str]) -> str:
    return pg_module_database("ledger")


@pytest.fixture(scope="module")
def fault_downstream_url(pg_module_database: Callable[[str], str]) -> str:
    return pg_module_database("downstream")


@pytest.fixture
def fleet(temporal_address: str, fault_ledger_url: str, tmp_path: Path) -> Iterator[Fleet]:
    """Worker processes, each stopped (SIGCONT, then SIGKILL) after the test."""
    (tmp_path / "data").mkdir()
    started = Fleet(temporal_address, fault_ledger_url, Cli(cwd=tmp_path, data_dir=tmp_path / "data"))
    yield started
    for worker in started.started:
        worker.stop()


@asynccontextmanager
async def fault_run(
    temporal_address: str, fault_ledger_url: str, fault_downstream_url: str, fleet: Fleet, work_dir: Path
) -> AsyncIterator[Run]:
    """One run, its downstream (a process of its own) and the ledger, closed afterwards."""
    async with running_matrix_downstream(fault_downstream_url) as downstream:
        ledger = Ledger.from_url(fault_ledger_url)
        try:
            await upgrade(ledger.database)
            client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
            run_id = f"pa-{uuid.uuid4().hex[:8]}"
            yield Run(client, ledger, downstream, fleet, work_dir, f"pydantic-ai-{run_id}", run_id)
        finally:
            await ledger.close()


async def test_killed_after_its_write_the_retry_reads_back_and_the_agent_answers_from_it(
    temporal_address: str, fault_ledger_url: str, fault_downstream_url: str, fleet: Fleet, tmp_path: Path
) -> None:
    """SIGKILL after the effect: the retry on another worker reads back; one effect, a receipt, the
    agent's answer is the retry's output."""
    async with fault_run(temporal_address, fault_ledger_url, fault_downstream_url, fleet, tmp_path) as run:
        first = await run.held("publish_document", Stage.COMMIT)
        second = run.worker("second")
        await wait_polling(run.client, run.queue, second, timeout=WORKER_START_TIMEOUT_S)
        first.signal(signal.SIGKILL)
        told = await run.answer()
        task = await run.task()
        events = await run.events()
        effects = await run.downstream.effects(task.idempotency_key)

    claims = [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED]
    assert claims == [(1, first.identity), (2, second.identity)], trail(events)
    assert_one_valid_lease_at_a_time(events)
    assert task.idempotency_key == f"{run.run_id}:{task.step_id}" and task.step_id.startswith("publish_document-")
    # Exactly one effect, the first attempt's; the retry read it back instead of writing.
    assert [(writer_of(e.writer), e.action) for e in effects] == [(first.identity, task.idempotency_key)], effects
    assert (task.status, task.claim_generation, task.lease_owner) == (TaskStatus.SETTLED, 2, second.identity)
    assert task.receipt is not None
    details = task.receipt.details
    assert (details["recovery"], details["wrote"], details["owner"]) == ("read_back_first", False, second.identity)
    # The agent's answer is built from the retry's output.
    [result] = told
    assert (result["tool"], result["outcome"]) == ("publish_document", "success")
    assert {k: result["content"][k] for k in ("generation", "owner", "recovery", "wrote")} == {
        "generation": 2,
        "owner": second.identity,
        "recovery": "read_back_first",
        "wrote": False,
    }
    assert result["content"]["found"]["writer"] == f"{first.identity}#g1"


async def test_paused_holder_cannot_renew_settle_or_write_through_the_fence_inside_an_agent_run(
    temporal_address: str, fault_ledger_url: str, fault_downstream_url: str, fleet: Fleet, tmp_path: Path
) -> None:
    """The operational test inside an agent run: SIGSTOP past the lease in external_call; generation 2
    takes over and settles; the resumed holder's renewal, settle and write are all refused."""
    async with fault_run(temporal_address, fault_ledger_url, fault_downstream_url, fleet, tmp_path) as run:
        first = await run.held("publish_fenced_document", Stage.EXTERNAL_CALL)
        first.signal(signal.SIGSTOP)
        second = run.worker("second")

        async def taken_over() -> None:
            task = await run.task()
            assert (task.status, task.claim_generation) == (TaskStatus.SETTLED, 2), task

        await assert_eventually(taken_over, timeout=WORKER_START_TIMEOUT_S, message="generation 2 settled")
        told = await run.answer()
        run.resume_file.touch()
        first.signal(signal.SIGCONT)

        async def late_evidence() -> list[LeaseEvent]:
            events = await run.events()
            late = {e.kind for e in events if e.claim_generation == 1 and e.kind is not EventKind.RENEWED}
            assert {EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED} <= late, trail(events)
            return events

        events = await assert_eventually(late_evidence, timeout=60, message="the resumed holder was refused")
        task = await run.task()
        effects = await run.downstream.effects(task.idempotency_key)
        requests = await run.downstream.requests(run.run_id)

    claims = [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED]
    assert claims == [(1, first.identity), (2, second.identity)], trail(events)
    assert_one_valid_lease_at_a_time(events)
    claim2 = event(events, EventKind.CLAIMED, 2)
    # After the takeover, generation 1 could not renew, and its settle was recorded as late_unapplied.
    lost = event(events, EventKind.LEASE_LOST, 1)
    late = event(events, EventKind.LATE_UNAPPLIED, 1)
    assert claim2.event_id < lost.event_id < late.event_id
    assert lost.details is not None and lost.details["operation"] == "renew"
    assert lost.lease_owner == late.lease_owner == first.identity
    # At the downstream: generation 2's write applied; generation 1's, sent after its resume, refused by the fence.
    posts = [(writer_of(r.writer), fate(r)) for r in requests if r.method == "POST"]
    assert posts == [(second.identity, "applied"), (first.identity, "stale")], requests
    assert [(writer_of(e.writer), e.generation) for e in effects] == [(second.identity, 2)], effects
    assert (task.status, task.claim_generation, task.lease_owner) == (TaskStatus.SETTLED, 2, second.identity)
    assert task.receipt is not None and task.receipt.details["generation"] == 2
    # The agent's answer is generation 2's output.
    [result] = told
    assert (result["tool"], result["outcome"]) == ("publish_fenced_document", "success")
    assert (result["content"]["generation"], result["content"]["owner"], result["content"]["wrote"]) == (
        2,
        second.identity,
        True,
    )
