"""The pause and kill matrix of issue 3, and the short lease, with worker processes as a user runs them.

Workers are ``agentlease worker`` processes (the console script beside this interpreter, configured
by ``AGENTLEASE_*``, tools from :mod:`tests.acceptance.matrix_tools`); the downstream is a real
HTTP server on 127.0.0.1 (:mod:`tests.acceptance.matrix_downstream`) that counts its own accepted
writes; the ledger is PostgreSQL; Temporal is the session's dev server.

Matrix: every stage (preflight, external_call, commit, verify) x every side-effect class
(read_only, idempotent, fenced, unsafe), once with SIGSTOP + SIGCONT (pause) and once with SIGKILL
(kill). In each case the attempt of generation 1 advances to the stage and holds there, renewing
(see :mod:`tests.acceptance.matrix_tools`); the test waits until the ledger shows it holding, sends
the signal, and a second worker takes over once the lease (TTL 2 s) has lapsed and Temporal's
retry (backoff 1 s) arrives. For a pause the second worker is started after SIGSTOP, and the first
is resumed only after the takeover, so its late writes and settle come after generation 2's. For a
kill the second worker is already polling when SIGKILL is sent, so the time to the takeover claim
(ledger clock) measures the lease and the retry, not a process start.

Unsafe tools wait for an operator's approval before they run: the test approves each unsafe call
through the run's ``approve`` update (what ``temporal workflow update`` or ``agentlease approve``
send). An unsafe task the takeover parks as ``needs_reconciliation`` leaves its run waiting for a
person; the test reads the run's ``status`` query instead of waiting for its end.

Cases share worker processes: the cases of one group share a task queue and one pair of worker
processes (the first holds all of them, ``max_concurrent_activities`` = group size, so it has no
free slot to poll for the retries), and are told apart by their run ids; a signal stops every case
of the group at once, each at its own stage. :data:`CASES_PER_WORKER_PAIR` sets the group size
(1: a pair of processes per case). The groups of one mode run concurrently, the two modes one
after the other. One pair per mode keeps the CPU for the leases: every worker start costs about
1.7 s of CPU, and with a 2 s lease on 2 cores, a start-up storm delays renewals past the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.clock import to_ms
from agentlease.decisions.table import DecisionRequest
from agentlease.enums import EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep, RunStatus, TaskRecord
from agentlease.runtime.names import STATUS_QUERY
from agentlease.workflow._options import RETRY_INITIAL_INTERVAL
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.fleet import Fleet, Worker, wait_polling
from tests.acceptance.matrix_downstream import Effect, LoggedRequest, MatrixDownstream, running_matrix_downstream
from tests.acceptance.matrix_tools import HOLDING, LEASE_TTL
from tests.acceptance.runner import Cli
from tests.eventually import assert_eventually
from tests.lease_trail import assert_one_valid_lease_at_a_time

pytestmark = [pytest.mark.timeout(300), pytest.mark.serial]  # a 2 s lease: alone on the cores


STAGES = (Stage.PREFLIGHT, Stage.EXTERNAL_CALL, Stage.COMMIT, Stage.VERIFY)
CLASSES = (SideEffectClass.READ_ONLY, SideEffectClass.IDEMPOTENT, SideEffectClass.FENCED, SideEffectClass.UNSAFE)
MODES = ("pause", "kill")

CASES_PER_WORKER_PAIR = 16
"""Cases that share one task queue and one pair of worker processes (1: a pair per case)."""

TTL_S = LEASE_TTL.total_seconds()
BACKOFF_S = RETRY_INITIAL_INTERVAL.total_seconds()
RECOVERY_MARGIN_S = 10.0
"""Slack over TTL + backoff for a takeover after SIGKILL, for a loaded 2-core machine."""

STALL_S = 5.0
"""How long the short-lease tool keeps working without renewing."""

WORKER_START_TIMEOUT_S = 90.0
"""Deadline for workers to come up and claim (many start at once on 2 cores)."""

STEP = "act"


# -- cases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One cell of the matrix."""

    mode: str
    cls: SideEffectClass
    stage: Stage

    @property
    def id(self) -> str:
        return f"{self.mode}-{self.cls.value}-{self.stage.value}"

    @property
    def tool(self) -> str:
        return f"matrix_{self.cls.value}"

    @property
    def reconciles(self) -> bool:
        """An unsafe tool past external_call is never retried automatically (G7)."""
        return self.cls is SideEffectClass.UNSAFE and self.stage.order >= Stage.EXTERNAL_CALL.order

    def expected_posts(self) -> list[tuple[str, str]]:
        """Every write the downstream receives for this case, in order: (worker role, its fate)."""
        if self.cls is SideEffectClass.READ_ONLY:
            return []
        if self.stage in (Stage.COMMIT, Stage.VERIFY):
            return [("first", "applied")]  # Written before the signal; the takeover reads back.
        if self.cls is SideEffectClass.UNSAFE:
            if self.stage is Stage.PREFLIGHT:
                return [("second", "applied")]  # The resumed first stops at its refused renewal.
            return [("first", "applied")] if self.mode == "pause" else []  # In flight when paused.
        late = "replayed" if self.cls is SideEffectClass.IDEMPOTENT else "stale"
        return [("second", "applied")] + ([("first", late)] if self.mode == "pause" else [])

    def late_write(self) -> bool:
        """Whether the resumed first attempt sends a write after the takeover."""
        return self.mode == "pause" and any(
            role == "first" and (fate != "applied" or self.stage is Stage.EXTERNAL_CALL)
            for role, fate in self.expected_posts()
        )

    def expected_recovery(self) -> str:
        """The recovery decision of the settling attempt (``ctx.recovery.action``)."""
        if self.cls is SideEffectClass.READ_ONLY:
            return "retry"
        return {
            Stage.PREFLIGHT: "retry",
            Stage.EXTERNAL_CALL: "retry_same_key",
            Stage.COMMIT: "read_back_first",
            Stage.VERIFY: "retry_readback",
        }[self.stage]

    def late_evidence_holds(self, kinds: set[EventKind]) -> bool:
        """Whether the first attempt's refusals after the takeover are what this case must leave."""
        if self.mode == "pause" and self.stage is Stage.VERIFY:
            return bool(kinds & {EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED})
        return self.expected_late() <= kinds

    def expected_late(self) -> set[EventKind]:
        """What the resumed first attempt leaves for generation 1: a refused renewal, a refused settle."""
        if self.mode == "kill":
            return set()
        if self.stage is Stage.VERIFY:
            # Nothing left to renew: it reads back and returns, so its settle is refused; unless the
            # pause landed inside one of its renewals, which is then refused and ends the attempt.
            return {EventKind.LATE_UNAPPLIED}
        if self.cls is SideEffectClass.UNSAFE:
            return {EventKind.LEASE_LOST}  # It stops at the refused renewal.
        return {EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED}


CASES = [Case(mode, cls, stage) for mode in MODES for cls in CLASSES for stage in STAGES]


@dataclass
class Observed:
    """What one case left behind: the ledger, the downstream, the workflow, the signal time."""

    case: Case
    run_id: str
    first: str
    second: str
    signalled_at: datetime
    task: TaskRecord
    events: list[LeaseEvent]
    effects: list[Effect]
    requests: list[LoggedRequest]
    run: RunStatus

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{STEP}"


# -- helpers ---------------------------------------------------------------------------------------


def plan(run_id: str, tool: str, **arguments: object) -> AgentRunPlan:
    return AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id=STEP, tool=tool, arguments=arguments)])


def task_id(run_id: str) -> str:
    return f"{run_id}/{STEP}"


def event(events: list[LeaseEvent], kind: EventKind, generation: int) -> LeaseEvent:
    found = [e for e in events if e.kind is kind and e.claim_generation == generation]
    assert len(found) == 1, f"expected one {kind} of generation {generation}: {found}"
    return found[0]


def writer_of(writer: str | None) -> str | None:
    """The lease owner in an ``X-Writer`` header (``<owner>#g<generation>``)."""
    return None if writer is None else writer.rsplit("#g", 1)[0]


def fate(request: LoggedRequest) -> str:
    """What became of a write: applied, replayed, refused as stale, or another HTTP status."""
    if request.status == 409 and request.error == "stale_fencing_token":
        return "stale"
    if request.replayed:
        return "replayed"
    return "applied" if 200 <= request.status < 300 else f"HTTP {request.status} {request.error}"


def trail(events: list[LeaseEvent]) -> str:
    """The evidence trail in short, for failure messages."""
    return "\n".join(
        f"  {e.at:%H:%M:%S.%f} {e.kind.value} g{e.claim_generation} {e.lease_owner} {e.stage} {e.reason}"
        for e in events
    )


def seconds(later: datetime, earlier: datetime) -> float:
    return (to_ms(later) - to_ms(earlier)) / 1000


# -- one group of cases --------------------------------------------------------------------------


@dataclass
class Env:
    client: Client
    ledger: Ledger
    downstream: MatrixDownstream
    fleet: Fleet
    work_dir: Path


class Group:
    """Cases of one mode sharing a task queue and a pair of worker processes."""

    def __init__(self, env: Env, mode: str, cases: list[Case]) -> None:
        self.env = env
        self.mode = mode
        self.cases = cases
        self.name = f"{mode}-{uuid.uuid4().hex[:8]}"
        self.queue = f"matrix-{self.name}"
        self.runs = {case: f"{case.id}-{uuid.uuid4().hex[:8]}" for case in cases}
        self.failed: dict[Case, BaseException] = {}
        self.observed: dict[Case, Observed] = {}
        self.first: Worker | None = None
        self.second: Worker | None = None
        self.signalled_at: datetime | None = None
        self.handles: dict[Case, WorkflowHandle[AgentRunWorkflow, RunStatus]] = {}

    def live(self) -> list[Case]:
        return [case for case in self.cases if case not in self.failed]

    async def each(
        self,
        what: str,
        check: Callable[[Case], Awaitable[object]],
        *,
        timeout: float,
        only: Callable[[Case], bool] = lambda case: True,
    ) -> None:
        """Wait for ``check`` on every live case (``only`` those) concurrently; a case that times out is failed."""

        async def one(case: Case) -> None:
            try:
                await assert_eventually(
                    lambda: check(case), timeout=timeout, interval=0.25, message=f"{case.id}: {what}"
                )
            except AssertionError as exc:
                self.failed[case] = exc

        await asyncio.gather(*(one(case) for case in self.live() if only(case)))

    def resume_file(self, case: Case) -> Path:
        return self.env.work_dir / f"{self.runs[case]}.resume"

    async def record(self, case: Case) -> TaskRecord:
        return await self.env.ledger.get_task(task_id(self.runs[case]))

    async def events(self, case: Case) -> list[LeaseEvent]:
        return await self.env.ledger.events(task_id(self.runs[case]))

    async def holding(self, case: Case) -> None:
        events = await self.events(case)
        held = [
            e
            for e in events
            if e.kind is EventKind.RENEWED and e.claim_generation == 1 and (e.reason or "").startswith(HOLDING)
        ]
        assert self.first is not None
        assert held and (held[-1].stage, held[-1].lease_owner) == (case.stage, self.first.identity), trail(events)

    async def taken_over(self, case: Case) -> None:
        record = await self.record(case)
        status = TaskStatus.NEEDS_RECONCILIATION if case.reconciles else TaskStatus.SETTLED
        assert (record.status, record.claim_generation) == (status, 2), record

    async def late_evidence(self, case: Case) -> None:
        events = await self.events(case)
        claim2 = event(events, EventKind.CLAIMED, 2)
        late = {e.kind for e in events if e.claim_generation == 1 and e.event_id > claim2.event_id}
        assert case.late_evidence_holds(late), late
        if case.late_write():
            assert self.first is not None
            requests = await self.env.downstream.requests(self.runs[case])
            assert any(r.method == "POST" and writer_of(r.writer) == self.first.identity for r in requests), requests

    async def status(self, case: Case) -> RunStatus:
        return await self.handles[case].query(STATUS_QUERY, result_type=RunStatus)

    async def approved(self, case: Case) -> None:
        """An operator approves the unsafe call (every unsafe tool waits for one before it runs)."""
        [view] = (await self.status(case)).tasks
        assert view.status == TaskStatus.AWAITING_APPROVAL.value, view
        request = DecisionRequest(step_id=STEP, by="matrix-operator", reason="approved for the pause/kill matrix")
        await self.handles[case].execute_update("approve", request, result_type=RunStatus)

    async def waiting_for_reconciliation(self, case: Case) -> RunStatus:
        status = await self.status(case)
        [view] = status.tasks
        assert (status.status, view.status) == ("waiting", TaskStatus.NEEDS_RECONCILIATION.value), status
        return status

    async def run(self) -> None:
        env = self.env
        self.first = env.fleet.start(self.queue, f"{self.name}-first", slots=len(self.cases))
        # Its first attempts must not compete with its own start-up for the CPU: a 2 s lease is short.
        await wait_polling(env.client, self.queue, self.first, timeout=WORKER_START_TIMEOUT_S)
        for case in self.cases:
            run_id = self.runs[case]
            arguments = {
                "base_url": env.downstream.base_url,
                "target": run_id,
                "hold_at": case.stage.value,
                "resume_file": str(self.resume_file(case)),
            }
            self.handles[case] = await env.client.start_workflow(
                AgentRunWorkflow.run, plan(run_id, case.tool, **arguments), id=run_id, task_queue=self.queue
            )

        def unsafe(case: Case) -> bool:
            return case.cls is SideEffectClass.UNSAFE

        await self.each("approved", self.approved, timeout=WORKER_START_TIMEOUT_S, only=unsafe)
        await self.each("generation 1 holds at its stage", self.holding, timeout=WORKER_START_TIMEOUT_S)
        if not self.live():
            return
        if self.mode == "kill":
            self.second = env.fleet.start(self.queue, f"{self.name}-second")
            await wait_polling(env.client, self.queue, self.second, timeout=WORKER_START_TIMEOUT_S)
        self.signalled_at = await env.ledger.db_now()
        self.first.signal(signal.SIGSTOP if self.mode == "pause" else signal.SIGKILL)
        if self.mode == "pause":
            self.second = env.fleet.start(self.queue, f"{self.name}-second")
        await self.each("generation 2 took over", self.taken_over, timeout=WORKER_START_TIMEOUT_S)
        if self.mode == "pause":
            for case in self.cases:
                self.resume_file(case).touch()
            self.first.signal(signal.SIGCONT)
            await self.each("the resumed first attempt left its evidence", self.late_evidence, timeout=60)

    async def observe(self, case: Case) -> None:
        run_id = self.runs[case]
        assert self.first is not None and self.second is not None and self.signalled_at is not None
        if case.reconciles:  # The run waits for a person's decision; it does not end.
            run = await assert_eventually(
                lambda: self.waiting_for_reconciliation(case), timeout=60, message=f"{case.id}: run waits"
            )
        else:
            run = await asyncio.wait_for(self.handles[case].result(), timeout=90)
        self.observed[case] = Observed(
            case=case,
            run_id=run_id,
            first=self.first.identity,
            second=self.second.identity,
            signalled_at=self.signalled_at,
            task=await self.record(case),
            events=await self.events(case),
            effects=await self.env.downstream.effects(f"{run_id}:{STEP}"),
            requests=await self.env.downstream.requests(run_id),
            run=run,
        )

    async def outcomes(self) -> dict[Case, Observed | BaseException]:
        handles = self.handles
        try:
            await self.run()
            await asyncio.gather(*(self._observe_or_fail(case) for case in self.live()))
        except Exception as exc:  # Unexpected: every case of the group reports it.
            for case in self.live():
                self.failed[case] = exc
        finally:
            workers = [w for w in (self.first, self.second) if w is not None]
            await asyncio.gather(*(asyncio.to_thread(w.stop) for w in workers))
        results: dict[Case, Observed | BaseException] = dict(self.observed)
        for case, failure in self.failed.items():
            tails = "".join(f"\n--- {w.identity} stderr ---\n{w.stderr_tail()}" for w in workers)
            temporal = await self._temporal_view(handles.get(case))
            results[case] = AssertionError(f"{failure}\nrun {self.runs[case]} on {self.queue}\n{temporal}{tails}")
        for handle in handles.values():
            with contextlib.suppress(Exception):  # already ended
                await handle.terminate("matrix case over")
        return results

    @staticmethod
    async def _temporal_view(handle: WorkflowHandle[AgentRunWorkflow, RunStatus] | None) -> str:
        """What Temporal says of a failed case's run: its history's event types and pending activities."""
        if handle is None:
            return "(no workflow)"
        try:
            history = await handle.fetch_history()
            described = await handle.describe()
        except Exception as exc:
            return f"(no Temporal view: {exc!r})"
        kinds = [event.event_type for event in history.events]
        pending = [
            (a.activity_type.name, a.state, a.attempt, a.last_worker_identity, a.last_failure.message)
            for a in described.raw_description.pending_activities
        ]
        return f"history event types {kinds}; pending activities {pending}"

    async def _observe_or_fail(self, case: Case) -> None:
        try:
            await self.observe(case)
        except Exception as exc:
            self.failed[case] = exc


async def run_matrix(
    temporal_address: str, ledger_url: str, downstream_url: str, work_dir: Path
) -> dict[Case, Observed | BaseException]:
    ledger = Ledger.from_url(ledger_url)
    fleet = Fleet(temporal_address, ledger_url, Cli(cwd=work_dir, data_dir=work_dir / "data"))
    try:
        await upgrade(ledger.database)  # Once, before many workers start on the same database.
        async with running_matrix_downstream(downstream_url) as downstream:
            client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
            env = Env(client, ledger, downstream, fleet, work_dir)
            groups = [
                Group(env, mode, cases[i : i + CASES_PER_WORKER_PAIR])
                for mode in MODES
                for cases in [[c for c in CASES if c.mode == mode]]
                for i in range(0, len(cases), CASES_PER_WORKER_PAIR)
            ]
            results: dict[Case, Observed | BaseException] = {}
            for mode in MODES:  # One mode at a time: a 2 s lease leaves little room for a CPU storm.
                batch = [group for group in groups if group.mode == mode]
                for outcome in await asyncio.gather(*(group.outcomes() for group in batch)):
                    results.update(outcome)
            return results
    finally:
        await fleet.stop_all()
        await ledger.close()


@pytest.fixture(scope="module")
def matrix_ledger_url(pg_module_database: Callable[[str], str]) -> str:
    """The PostgreSQL ledger of every run of this module."""
    return pg_module_database("ledger")


@pytest.fixture(scope="module")
def matrix_downstream_url(pg_module_database: Callable[[str], str]) -> str:
    """The downstream's own PostgreSQL database."""
    return pg_module_database("downstream")


@pytest.fixture(scope="module")
def matrix(
    temporal_address: str,
    matrix_ledger_url: str,
    matrix_downstream_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[Case, Observed | BaseException]]:
    """Every case of the matrix, run once for the module (see the module's docstring)."""
    work_dir = tmp_path_factory.mktemp("matrix")
    (work_dir / "data").mkdir()
    yield asyncio.run(run_matrix(temporal_address, matrix_ledger_url, matrix_downstream_url, work_dir))


# -- tests ---------------------------------------------------------------------------------------


async def test_short_lease_is_taken_over_and_the_late_write_fenced(
    temporal_address: str, matrix_ledger_url: str, matrix_downstream_url: str, tmp_path: Path
) -> None:
    """TTL 2 s: the tool stops renewing after preflight and keeps working for 5 s; the other worker
    claims once the lease lapsed (plus Temporal's retry backoff); the first one's write is fenced off."""
    (tmp_path / "data").mkdir()
    ledger = Ledger.from_url(matrix_ledger_url)
    fleet = Fleet(temporal_address, matrix_ledger_url, Cli(cwd=tmp_path, data_dir=tmp_path / "data"))
    run_id = f"short-lease-{uuid.uuid4().hex[:8]}"
    queue = f"matrix-{run_id}"
    try:
        await upgrade(ledger.database)
        async with running_matrix_downstream(matrix_downstream_url) as downstream:
            client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
            # One slot each: the worker whose attempt stalls cannot take the retry itself.
            workers = [fleet.start(queue, f"{run_id}-{name}", slots=1) for name in ("a", "b")]
            await asyncio.gather(*(wait_polling(client, queue, w, timeout=WORKER_START_TIMEOUT_S) for w in workers))
            arguments = {"base_url": downstream.base_url, "target": run_id, "stall_s": STALL_S}
            handle = await client.start_workflow(
                AgentRunWorkflow.run, plan(run_id, "matrix_fenced", **arguments), id=run_id, task_queue=queue
            )
            run = await asyncio.wait_for(handle.result(), timeout=90)

            async def first_attempt_over() -> None:
                kinds = {e.kind for e in await ledger.events(task_id(run_id)) if e.claim_generation == 1}
                assert EventKind.LATE_UNAPPLIED in kinds, kinds

            await assert_eventually(first_attempt_over, timeout=30, message="the stalled attempt tried to settle")
            record = await ledger.get_task(task_id(run_id))
            events = await ledger.events(task_id(run_id))
            effects = await downstream.effects(f"{run_id}:{STEP}")
            requests = await downstream.requests(run_id)
    finally:
        await fleet.stop_all()
        await ledger.close()

    claims = [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED]
    assert [generation for generation, _ in claims] == [1, 2], claims
    (_, first), (_, second) = claims
    assert first != second
    assert_one_valid_lease_at_a_time(events)
    claim2 = event(events, EventKind.CLAIMED, 2)
    renewals = [e for e in events if e.kind is EventKind.RENEWED and e.claim_generation == 1]
    assert [e.stage for e in renewals] == [Stage.PREFLIGHT], "it stopped renewing after preflight"
    waited = seconds(claim2.at, renewals[-1].at)
    assert TTL_S <= waited <= TTL_S + BACKOFF_S + RECOVERY_MARGIN_S, f"claimed {waited:.3f}s after the last renewal"

    # At the downstream: the second worker's write applied; the first one's, 5 s late, refused by the fence.
    posts = [(writer_of(r.writer), fate(r)) for r in requests if r.method == "POST"]
    assert posts == [(second, "applied"), (first, "stale")], requests
    assert [(writer_of(e.writer), e.generation) for e in effects] == [(second, 2)]

    # Its renewal and its settle were refused, after the takeover.
    lost = event(events, EventKind.LEASE_LOST, 1)
    late = event(events, EventKind.LATE_UNAPPLIED, 1)
    assert claim2.event_id < lost.event_id < late.event_id
    assert lost.details is not None and (lost.details["operation"], lost.details["stage"]) == ("renew", "external_call")
    assert (record.status, record.claim_generation, record.lease_owner) == (TaskStatus.SETTLED, 2, second)
    assert run.status == "completed"
    assert [(t.status, t.claim_generation) for t in run.tasks] == [("settled", 2)]

    # The superseded attempt's refusals are expected outcomes: one line each, no traceback.
    stale = next(w for w in workers if w.identity == first)
    log = "".join(stale.command.stderr)
    assert "Traceback" not in log, log
    assert re.search(r"INFO agentlease\.lease: lease lost on \S+: settle with generation 1 refused", log), log


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_pause_kill_matrix(matrix: dict[Case, Observed | BaseException], case: Case) -> None:
    outcome = matrix[case]
    if isinstance(outcome, BaseException):
        raise outcome
    o = outcome
    events = o.events
    role = {o.first: "first", o.second: "second"}

    # The first worker held generation 1 at the stage until the signal; the second took over with 2.
    claims = [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED]
    assert claims == [(1, o.first), (2, o.second)], claims
    claim2 = event(events, EventKind.CLAIMED, 2)
    assert event(events, EventKind.EXPIRED, 1).stage is case.stage
    assert_one_valid_lease_at_a_time(events)  # G1 and G3, on the ledger's clock.

    # Effects, counted at the downstream: at most one per idempotency key, never one by a takeover
    # of an unsafe tool past external_call; a late write is refused by the fence or replayed by the key.
    posts = [(role.get(writer_of(r.writer) or ""), fate(r)) for r in o.requests if r.method == "POST"]
    assert posts == case.expected_posts(), o.requests
    applied = [who for who, what in case.expected_posts() if what == "applied"]
    assert [role.get(writer_of(e.writer) or "") for e in o.effects] == applied, o.effects
    assert len(o.effects) == len(applied) <= 1
    if case.cls is SideEffectClass.FENCED:
        assert [e.generation for e in o.effects] == [1 if who == "first" else 2 for who in applied]

    # How the task ended, in the ledger and in the workflow's status.
    [view] = o.run.tasks
    assert view.idempotency_key == o.idempotency_key  # G4: from the run and step, in every attempt.
    if case.reconciles:
        assert (o.task.status, o.task.claim_generation, o.task.receipt) == (TaskStatus.NEEDS_RECONCILIATION, 2, None)
        assert event(events, EventKind.NEEDS_RECONCILIATION, 2).lease_owner == o.second
        assert (o.run.status, view.status, view.claim_generation) == ("waiting", "needs_reconciliation", 2)
    else:
        assert (o.task.status, o.task.claim_generation, o.task.lease_owner) == (TaskStatus.SETTLED, 2, o.second)
        assert o.task.receipt is not None
        details = o.task.receipt.details
        wrote = case.cls is not SideEffectClass.READ_ONLY and case.stage in (Stage.PREFLIGHT, Stage.EXTERNAL_CALL)
        assert (details["recovery"], details["wrote"], details["owner"]) == (case.expected_recovery(), wrote, o.second)
        assert event(events, EventKind.SETTLED, 2).lease_owner == o.second
        assert (o.run.status, view.status, view.claim_generation) == ("completed", "settled", 2)

    # The first worker's renewal and settle after the takeover were refused; a killed one left nothing.
    late = [e for e in events if e.claim_generation == 1 and e.event_id > claim2.event_id]
    kinds = {e.kind for e in late}
    assert case.late_evidence_holds(kinds) and kinds <= {EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED}, late
    assert all(e.lease_owner == o.first and "generation 2" in (e.reason or "") for e in late), late
    if case.mode == "kill":
        recovery = seconds(claim2.at, o.signalled_at)
        assert 0 < recovery <= TTL_S + BACKOFF_S + RECOVERY_MARGIN_S, f"took over {recovery:.3f}s after SIGKILL"
