"""Automatic reconciliation by a tool's readback probe, with worker processes as a user runs them (issue 18).

For each built-in tool with a probe (``smtp_send`` asks the mail server by ``Message-ID``, ``http_publish``
asks the publishing service by key) and for a tool of the tests' own (``probed_send``,
:mod:`tests.acceptance.reconciling_tools`): the worker holding generation 1 is SIGKILLed after the effect
reached the downstream and before the settle; the next attempt, on a second worker, asks the probe and
settles from what it found, with no person involved; the downstream holds one effect. A probe that
cannot tell leaves the task waiting for a person, as without a probe. On SQLite and PostgreSQL.

Workers are ``agentlease worker`` processes (:mod:`tests.acceptance.fleet`); the mail server and the
publishing service run in this process (the tests hold their answers to kill the worker at the right
moment); the tests' tool writes to the matrix's downstream, a process of its own.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.decisions.table import DecisionRequest
from agentlease.demo import mail, publishing
from agentlease.enums import EventKind, Stage, TaskStatus
from agentlease.errors import TaskNotFoundError
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep, RunStatus, TaskRecord
from agentlease.runtime.names import STATUS_QUERY
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.conftest import fresh_pg_database
from tests.acceptance.fleet import Fleet, Worker, wait_polling
from tests.acceptance.matrix_downstream import MatrixDownstream, running_matrix_downstream
from tests.acceptance.matrix_tools import HOLDING
from tests.acceptance.reconciling_tools import HELD_FOR
from tests.acceptance.runner import Cli
from tests.acceptance.test_pause_kill_matrix import WORKER_START_TIMEOUT_S, trail
from tests.eventually import assert_eventually

pytestmark = pytest.mark.timeout(300)

STEP = "act"
TOOLS = "tests.acceptance.reconciling_tools"
TAKEOVER_S = 90.0
"""Deadline for the second worker's attempt (a lease of up to 15 s, Temporal's retry, a loaded machine)."""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The workers' ledger: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    with fresh_pg_database("agentlease_probe") as url:
        yield url


@pytest.fixture(scope="module")
def downstream_url(pg_module_database: Callable[[str], str]) -> str:
    return pg_module_database("probe_downstream")


@dataclass
class Probed:
    """One test's run: its queue and workers, its ledger, the client."""

    client: Client
    ledger: Ledger
    fleet: Fleet
    work_dir: Path
    run_id: str = field(default_factory=lambda: f"probe-{uuid.uuid4().hex[:10]}")

    @property
    def queue(self) -> str:
        return f"q-{self.run_id}"

    @property
    def task_id(self) -> str:
        return f"{self.run_id}/{STEP}"

    async def worker(self, role: str, **settings: str) -> Worker:
        env = {f"AGENTLEASE_{name.upper()}": value for name, value in settings.items()}
        started = self.fleet.start(self.queue, f"{self.run_id}-{role}", env=env)
        await wait_polling(self.client, self.queue, started, timeout=WORKER_START_TIMEOUT_S)
        return started

    async def start(self, tool: str, **arguments: Any) -> WorkflowHandle[AgentRunWorkflow, RunStatus]:
        plan = AgentRunPlan(agent_run_id=self.run_id, steps=[PlanStep(step_id=STEP, tool=tool, arguments=arguments)])
        return await self.client.start_workflow(AgentRunWorkflow.run, plan, id=self.run_id, task_queue=self.queue)

    async def approve(self, handle: WorkflowHandle[AgentRunWorkflow, RunStatus]) -> None:
        async def waiting() -> None:
            [view] = (await handle.query(STATUS_QUERY, result_type=RunStatus)).tasks
            assert view.status == TaskStatus.AWAITING_APPROVAL.value, view

        await assert_eventually(waiting, timeout=WORKER_START_TIMEOUT_S, message="the call waits for approval")
        request = DecisionRequest(step_id=STEP, by="alice", reason="send it")
        await handle.execute_update("approve", request, result_type=RunStatus)

    async def record(self) -> TaskRecord:
        return await self.ledger.get_task(self.task_id)

    async def events(self) -> list[LeaseEvent]:
        return await self.ledger.events(self.task_id)

    async def at_stage(self, stage: Stage, generation: int = 1) -> None:
        record = await self.record()
        assert (record.status, record.stage, record.claim_generation) == (TaskStatus.RUNNING, stage, generation), record

    async def ended(self, status: TaskStatus) -> TaskRecord:
        async def check() -> TaskRecord:
            try:
                record = await self.record()
            except TaskNotFoundError:
                raise AssertionError(f"no task {self.task_id} yet") from None
            assert record.status is status, (record, trail(await self.events()))
            return record

        return await assert_eventually(check, timeout=TAKEOVER_S, interval=0.2, message=f"task {status.value}")


@pytest.fixture
async def probed(temporal_address: str, ledger_url: str, tmp_path: Path) -> AsyncIterator[Probed]:
    (tmp_path / "data").mkdir()
    ledger = Ledger.from_url(ledger_url)
    fleet = Fleet(temporal_address, ledger_url, Cli(cwd=tmp_path, data_dir=tmp_path / "data"), tool_modules=TOOLS)
    try:
        await upgrade(ledger.database)
        client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
        yield Probed(client, ledger, fleet, tmp_path)
    finally:
        await fleet.stop_all()
        await ledger.close()


def reconciled_by_probe(events: list[LeaseEvent]) -> LeaseEvent:
    """The one settle of the trail, made from the probe's receipt; and no person was asked."""
    [settled] = [e for e in events if e.kind is EventKind.SETTLED]
    assert settled.details is not None and settled.details["reconciled_by"] == "probe", trail(events)
    assert (settled.reason or "").startswith("reconciled by the probe, no person involved"), trail(events)
    kinds = {e.kind for e in events}
    assert not kinds & {EventKind.NEEDS_RECONCILIATION, EventKind.RECONCILED}, trail(events)
    return settled


# -- the tests' own tool -----------------------------------------------------------------------------


@pytest.fixture
async def matrix(downstream_url: str) -> AsyncIterator[MatrixDownstream]:
    async with running_matrix_downstream(downstream_url) as downstream:
        yield downstream


async def kill_after_the_effect(p: Probed, matrix: MatrixDownstream, tool: str) -> tuple[Worker, Worker, str]:
    """Generation 1 sends its message, reaches commit and holds; its worker is SIGKILLed with the second polling."""
    first = await p.worker("first")
    target = p.run_id
    resume = p.work_dir / "never"
    await p.start(tool, base_url=matrix.base_url, target=target, hold_at="commit", resume_file=str(resume))

    async def holding() -> None:
        events = await p.events()
        assert any(e.kind is EventKind.RENEWED and (e.reason or "").startswith(HOLDING) for e in events), trail(events)

    await assert_eventually(holding, timeout=WORKER_START_TIMEOUT_S, message="generation 1 holds at commit")
    second = await p.worker("second")
    first.signal(signal.SIGKILL)
    assert len(await matrix.effects(f"{p.run_id}:{STEP}")) == 1
    return first, second, target


async def test_a_tool_of_our_own_settles_from_its_probe_after_a_kill(probed: Probed, matrix: MatrixDownstream) -> None:
    p = probed
    _, second, target = await kill_after_the_effect(p, matrix, "probed_send")
    record = await p.ended(TaskStatus.SETTLED)

    events = await p.events()
    settled = reconciled_by_probe(events)
    assert (settled.claim_generation, settled.lease_owner) == (2, second.identity), trail(events)
    assert settled.details is not None and settled.details["evidence"] == {"probe": "happened", "messages": 1}
    assert record.receipt is not None and (record.receipt.external_id, record.receipt.status) == (target, "delivered")
    assert len(await matrix.effects(f"{p.run_id}:{STEP}")) == 1  # sent once: the probe found it, nothing resent
    probing = [e for e in events if e.kind is EventKind.RENEWED and (e.reason or "").startswith("probe: asking")]
    assert [e.claim_generation for e in probing] == [2], trail(events)
    handle = p.client.get_workflow_handle(p.run_id, result_type=RunStatus)
    done = await asyncio.wait_for(handle.result(), TAKEOVER_S)
    assert (done.status, done.tasks[0].settled_by) == ("completed", "probe")


async def test_a_probe_that_cannot_tell_leaves_the_task_to_a_person(probed: Probed, matrix: MatrixDownstream) -> None:
    p = probed
    await kill_after_the_effect(p, matrix, "blind_send")
    record = await p.ended(TaskStatus.NEEDS_RECONCILIATION)

    events = await p.events()
    [parked] = [e for e in events if e.kind is EventKind.NEEDS_RECONCILIATION]
    assert parked.claim_generation == 2 and "the probe could not tell" in (parked.reason or ""), trail(events)
    assert "keeps no record" in (record.last_error or ""), record
    assert len(await matrix.effects(f"{p.run_id}:{STEP}")) == 1


# -- a downstream that shows a write late -------------------------------------------------------------------

KILL_LAG_MS = 8000
"""Longer than a takeover after a kill (the rest of the 2 s lease, Temporal noticing it and retrying: about 4 s
from the write): the next attempt's probe looks before the message shows."""

DROPPED_ANSWER_LAG_MS = 200
"""A lag of the kind search indexes and replicas have: the attempt that lost its answer probes within it."""


async def test_a_lagging_downstream_settles_through_the_probe_after_a_kill(
    probed: Probed, matrix: MatrixDownstream
) -> None:
    """Generation 1 sends, holds at commit and is SIGKILLed; the downstream shows the message to the probe
    later than the next attempt asks. "Not found" inside the tool's settle window is asked again, not
    trusted: the task settles through the probe and the message is sent once."""
    p = probed
    workers = [await p.worker("first"), await p.worker("second")]  # both up: the kill follows the write at once
    await p.start(
        "lagging_send",
        base_url=matrix.base_url,
        target=p.run_id,
        hold_at="commit",
        resume_file=str(p.work_dir / "never"),
        lag_ms=KILL_LAG_MS,
    )

    async def holding() -> str:
        events = await p.events()
        assert any(e.kind is EventKind.RENEWED and (e.reason or "").startswith(HOLDING) for e in events), trail(events)
        return (await p.record()).lease_owner or ""

    holder = await assert_eventually(holding, timeout=WORKER_START_TIMEOUT_S, message="generation 1 holds")
    [victim] = [w for w in workers if w.identity == holder]
    victim.signal(signal.SIGKILL)
    await p.ended(TaskStatus.SETTLED)

    events = await p.events()
    assert len(await matrix.effects(f"{p.run_id}:{STEP}")) == 1, trail(events)  # sent once
    settled = reconciled_by_probe(events)
    assert settled.claim_generation == 2 and settled.details is not None, trail(events)
    assert settled.details["evidence"] == {"probe": "happened", "messages": 1}, trail(events)
    waited = [e for e in events if (e.reason or "").startswith("probe: not found yet")]
    assert waited and all(e.claim_generation == 2 for e in waited), trail(events)


async def test_an_attempt_that_lost_its_answer_waits_out_the_settle_window(
    probed: Probed, matrix: MatrixDownstream
) -> None:
    """Generation 1 sends, loses the answer and asks the probe at once, 200 ms before the downstream shows the
    message: the probe is asked again until the window has passed, and the task settles without a second send."""
    p = probed
    await p.worker("only")
    await p.start("lagging_send", base_url=matrix.base_url, target=p.run_id, drop_answer=True, lag_ms=200)
    await p.ended(TaskStatus.SETTLED)

    events = await p.events()
    assert len(await matrix.effects(f"{p.run_id}:{STEP}")) == 1, trail(events)
    assert not any("did not happen" in (e.reason or "") for e in events), trail(events)  # never a wrong "not applied"
    settled = reconciled_by_probe(events)
    assert settled.claim_generation == 1, trail(events)  # settled by the attempt that lost its answer


async def test_a_key_found_with_other_arguments_is_never_run_again(probed: Probed, matrix: MatrixDownstream) -> None:
    """The probe answers "conflict": the attempt that lost its answer parks the task for a person at once, with
    what the downstream holds in the trail; no later attempt sends again."""
    p = probed
    await p.worker("only")
    await p.start("conflicted_send", base_url=matrix.base_url, target=p.run_id, drop_answer=True)
    record = await p.ended(TaskStatus.NEEDS_RECONCILIATION)

    events = await p.events()
    [parked] = [e for e in events if e.kind is EventKind.NEEDS_RECONCILIATION]
    assert parked.claim_generation == 1, trail(events)
    assert "never run again" in (record.last_error or "") and "other arguments" in (record.last_error or ""), record
    [noted] = [e for e in events if (e.reason or "").startswith("probe: the probe found the key with other")]
    assert noted.details is not None and noted.details["probe"]["held"] == HELD_FOR, trail(events)
    assert record.attempts == 1 and len(await matrix.effects(f"{p.run_id}:{STEP}")) == 1


# -- smtp_send, asked by Message-ID ---------------------------------------------------------------------


class HoldingMail(mail.RecordingHandler):
    """Records each message, then holds its 250 reply until :data:`RELEASE` is set."""

    release = asyncio.Event()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        reply = await super().handle_DATA(server, session, envelope)
        await type(self).release.wait()
        return reply


class HoldingMailWithoutLookup(HoldingMail):
    answers_lookups = False


MAIL = {"to": ["ops@example.com"], "subject": "refund A-1", "body": "Refunded 100 EUR."}


@pytest.mark.parametrize("lookups", [True, False], ids=["server-answers", "server-cannot-be-asked"])
async def test_smtp_send_settles_from_the_mail_server_after_a_kill(
    probed: Probed, tmp_path: Path, lookups: bool
) -> None:
    p = probed
    handler = HoldingMail if lookups else HoldingMailWithoutLookup
    handler.release = asyncio.Event()
    url = mail.database_url(tmp_path)
    async with mail.running_mail(url, handler=handler) as (host, port):
        smtp = {"smtp_host": host, "smtp_port": str(port)}
        first = await p.worker("first", **smtp)
        handle = await p.start("smtp_send", **MAIL)
        await p.approve(handle)

        async def taken() -> None:
            assert len(await mail.received_messages(url)) == 1
            await p.at_stage(Stage.EXTERNAL_CALL)

        await assert_eventually(taken, timeout=WORKER_START_TIMEOUT_S, message="the server took the message")
        await p.worker("second", **smtp)
        first.signal(signal.SIGKILL)  # the 250 reply never reached it: the effect happened, nothing settled
        handler.release.set()
        record = await p.ended(TaskStatus.SETTLED if lookups else TaskStatus.NEEDS_RECONCILIATION)
        events = await p.events()
        received = await mail.received_messages(url)

    assert len(received) == 1, received  # delivered once
    if lookups:
        settled = reconciled_by_probe(events)
        assert settled.claim_generation == 2
        assert record.receipt is not None and record.receipt.external_id == received[0].message_id
        assert record.receipt.details["found_by"] == "XLOOKUP"
        return
    [parked] = [e for e in events if e.kind is EventKind.NEEDS_RECONCILIATION]
    assert "the probe could not tell" in (parked.reason or "") and "502" in (parked.reason or ""), trail(events)


# -- http_publish, asked by key ---------------------------------------------------------------------------


async def test_http_publish_settles_from_the_publishing_service_after_a_kill(probed: Probed, tmp_path: Path) -> None:
    p = probed
    release = asyncio.Event()
    written: list[int] = []

    async def hold(post_id: int) -> None:
        written.append(post_id)
        await release.wait()

    url = publishing.database_url(tmp_path)
    async with publishing.running_publishing(url, after_write=hold) as base_url:
        first = await p.worker("first", publish_base_url=base_url)
        await p.start("http_publish", slug="refund-a-1", title="Refund A-1", body="Refunded 100 EUR.")

        async def committed() -> None:
            assert written, "no write yet"
            await p.at_stage(Stage.EXTERNAL_CALL)

        await assert_eventually(committed, timeout=WORKER_START_TIMEOUT_S, message="the service wrote the post")
        await p.worker("second", publish_base_url=base_url)
        first.signal(signal.SIGKILL)  # the 201 never reached it
        release.set()
        record = await p.ended(TaskStatus.SETTLED)
        events = await p.events()
        count = await publishing.count_publications(url)

    assert count == 1  # published once: the retry asked first, and did not write
    settled = reconciled_by_probe(events)
    assert settled.claim_generation == 2
    assert record.receipt is not None and record.receipt.external_id == str(written[0])
    assert record.receipt.details["idempotency_key"] == f"{p.run_id}:{STEP}"
