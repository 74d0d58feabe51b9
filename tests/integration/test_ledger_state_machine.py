"""A model-based test of the ledger: random claim / renew / settle / release / cancel / expire.

Hypothesis drives a SQLite ledger (a fresh file per example) with injected time; a model keeps
what the ledger should hold. After every step:

- G1: judged at the injected now, at most one lease per task is valid, and it is the model's;
  the evidence trail's validity intervals never overlap.
- G2: a stale holder's renew / settle / release raises ``LeaseLostError`` and leaves the row as
  it was.
- G3: generations grow by exactly 1 per granted claim and never decrease.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from agentlease.clock import duration_ms, from_ms, to_ms
from agentlease.enums import DecisionKind, EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.errors import LeaseHeldError, LeaseLostError, TaskClosedError, TaskNotFoundError
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import (
    Claim,
    SettlementReceipt,
    TaskRecord,
    TaskSpec,
    idempotency_key_for,
    task_id_for,
)
from tests.lease_trail import LeaseInterval, assert_one_valid_lease_at_a_time

T = TypeVar("T")

BASE = datetime(2031, 3, 1, 12, 0, tzinfo=UTC)
RUN = "run-state-machine"
TTLS = {"fetch": timedelta(seconds=10), "publish": timedelta(seconds=3)}
OWNERS = ("w1", "w2", "w3")
WORK_STAGES = (Stage.PREFLIGHT, Stage.EXTERNAL_CALL, Stage.COMMIT, Stage.VERIFY)
HOLDER_WRITES = ("renew", "settle", "release")

MACHINE_SETTINGS = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class ModelTask:
    """What the ledger should hold for one task, and the evidence trail it should have written."""

    spec: TaskSpec
    status: TaskStatus | None = None
    """``None`` until the first claim creates the row."""
    generation: int = 0
    owner: str | None = None
    expires_ms: int | None = None
    stage: Stage | None = None
    renewals: int = 0
    receipt_generation: int | None = None
    trail: list[tuple[EventKind, int, str | None]] = field(default_factory=list)
    """Expected ``(kind, generation, owner)`` of every event, in order."""
    checked_row: TaskRecord | None = None
    """The row as last read; a step that changed nothing must leave it equal."""
    intervals: list[LeaseInterval] = field(default_factory=list)
    """Validity intervals read from the trail at the last check."""

    def holds(self, claim: Claim, now_ms: int) -> bool:
        return (
            self.status == TaskStatus.RUNNING
            and claim.generation == self.generation
            and claim.owner == self.owner
            and self.expires_ms is not None
            and self.expires_ms > now_ms
        )


def spec_for(step_id: str) -> TaskSpec:
    return TaskSpec(
        task_id=task_id_for(RUN, step_id),
        agent_run_id=RUN,
        step_id=step_id,
        tool="http.get",
        side_effect_class=SideEffectClass.FENCED,
        idempotency_key=idempotency_key_for(RUN, step_id),
        lease_ttl=TTLS[step_id],
    )


class LedgerMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    def __init__(self, template: Path, workdir: Path) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="example-", dir=workdir))
        shutil.copyfile(template, self.dir / "ledger.db")
        self.loop = asyncio.new_event_loop()
        self.ledger = Ledger.from_url(f"sqlite:///{self.dir / 'ledger.db'}")
        self.now = BASE
        self.tasks = {step: ModelTask(spec_for(step)) for step in TTLS}
        self.by_task_id = {task.spec.task_id: task for task in self.tasks.values()}
        self.granted: list[Claim] = []
        self.changed: set[str] = set()
        """Tasks whose row a granted write changed since the last check."""
        self.touched: set[str] = set()
        """Tasks whose trail may have changed since the last check."""
        self.settle_attempted: set[str] = set()
        """Tasks with a settle (granted or refused) since the last check: their receipt is read back."""
        self.probes = 0
        self.refusals_this_step = 0

    def teardown(self) -> None:
        try:
            self.run(self.ledger.close())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------------

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    @property
    def now_ms(self) -> int:
        return to_ms(self.now)

    def granted_write(self, task: ModelTask, kind: EventKind, owner: str | None) -> None:
        task.trail.append((kind, task.generation, owner))
        self.changed.add(task.spec.task_id)
        self.touched.add(task.spec.task_id)

    def holder_write(self, operation: str, claim: Claim, stage: Stage | None = None) -> Awaitable[Any]:
        if operation == "renew":
            return self.ledger.renew(claim, reason="heartbeat", stage=stage, now=self.now)
        if operation == "settle":
            receipt = SettlementReceipt(
                external_system="http", external_id="doc", status="present", verified_at=self.now
            )
            return self.ledger.settle(claim, receipt, result={"ok": True}, now=self.now)
        return self.ledger.release(claim, error_class="retryable", error="503", now=self.now)

    def refused(self, operation: str, claim: Claim, stage: Stage | None = None) -> None:
        """G2: a stale holder's write raises LeaseLostError; the row is checked unchanged after the step."""
        task = self.by_task_id[claim.task_id]
        with pytest.raises(LeaseLostError) as refused:
            self.run(self.holder_write(operation, claim, stage))
        assert refused.value.operation == operation
        assert refused.value.generation == claim.generation
        assert refused.value.current_generation == task.generation
        assert refused.value.status == task.status
        kind = EventKind.LATE_UNAPPLIED if operation == "settle" else EventKind.LEASE_LOST
        task.trail.append((kind, claim.generation, claim.owner))
        self.touched.add(task.spec.task_id)
        self.refusals_this_step += 1
        if operation == "settle":
            self.settle_attempted.add(task.spec.task_id)

    # -- rules ---------------------------------------------------------------------------------

    @rule(target=claims, step=st.sampled_from(sorted(TTLS)), owner=st.sampled_from(OWNERS))
    def claim(self, step: str, owner: str) -> Any:
        task = self.tasks[step]
        self.touched.add(task.spec.task_id)  # a refused claim must leave row and trail as they were
        if task.status is not None and task.status.is_terminal:
            with pytest.raises(TaskClosedError) as closed:
                self.run(self.ledger.claim(task.spec, owner, now=self.now))
            assert closed.value.status == task.status
            return multiple()
        if task.status == TaskStatus.RUNNING and task.expires_ms is not None and task.expires_ms > self.now_ms:
            with pytest.raises(LeaseHeldError) as held:
                self.run(self.ledger.claim(task.spec, owner, now=self.now))
            assert held.value.retry_after == timedelta(milliseconds=task.expires_ms - self.now_ms)
            assert (held.value.holder, held.value.generation) == (task.owner, task.generation)
            return multiple()

        claim = self.run(self.ledger.claim(task.spec, owner, now=self.now))
        assert claim.generation == task.generation + 1
        assert (claim.owner, claim.acquired_at) == (owner, self.now)
        assert claim.expires_at == self.now + task.spec.lease_ttl
        assert claim.previous_stage == task.stage
        if task.status == TaskStatus.RUNNING:
            task.trail.append((EventKind.EXPIRED, task.generation, task.owner))
        task.status, task.generation, task.owner = TaskStatus.RUNNING, claim.generation, owner
        task.expires_ms = self.now_ms + duration_ms(task.spec.lease_ttl)
        self.granted_write(task, EventKind.CLAIMED, owner)
        self.granted.append(claim)
        return claim

    @rule(claim=claims, stage=st.none() | st.sampled_from(WORK_STAGES))
    def renew(self, claim: Claim, stage: Stage | None) -> None:
        task = self.by_task_id[claim.task_id]
        if not task.holds(claim, self.now_ms):
            self.refused("renew", claim, stage)
            return
        expires = self.run(self.holder_write("renew", claim, stage))
        assert expires == self.now + task.spec.lease_ttl
        task.expires_ms = to_ms(expires)
        task.renewals += 1
        if stage is not None and (task.stage is None or stage.order > task.stage.order):
            task.stage = stage  # the ledger keeps the furthest stage reached (G6)
        self.granted_write(task, EventKind.RENEWED, claim.owner)

    @rule(claim=claims)
    def settle(self, claim: Claim) -> None:
        task = self.by_task_id[claim.task_id]
        if not task.holds(claim, self.now_ms):
            self.refused("settle", claim)
            return
        stored = self.run(self.holder_write("settle", claim))
        assert stored.claim_generation == claim.generation
        task.status, task.stage, task.expires_ms = TaskStatus.SETTLED, Stage.SETTLED, None
        task.receipt_generation = claim.generation
        self.granted_write(task, EventKind.SETTLED, claim.owner)
        self.settle_attempted.add(task.spec.task_id)

    @rule(claim=claims)
    def release(self, claim: Claim) -> None:
        task = self.by_task_id[claim.task_id]
        if not task.holds(claim, self.now_ms):
            self.refused("release", claim)
            return
        self.run(self.holder_write("release", claim))
        task.status, task.owner, task.expires_ms = TaskStatus.RELEASED, None, None
        self.granted_write(task, EventKind.RELEASED, claim.owner)

    @rule(step=st.sampled_from(sorted(TTLS)))
    def cancel(self, step: str) -> None:
        task = self.tasks[step]
        cancel = self.ledger.decide(task.spec.task_id, DecisionKind.CANCEL, by="operator", reason="test", now=self.now)
        if task.status is None:
            with pytest.raises(TaskNotFoundError):
                self.run(cancel)
            return
        self.touched.add(task.spec.task_id)
        if task.status.is_terminal:
            with pytest.raises(TaskClosedError):
                self.run(cancel)
            return
        record = self.run(cancel)
        # A write whose stage reached external_call may have acted: cancelled, its effect unknown (G11).
        acted = task.spec.side_effect_class.may_have_acted(task.stage)
        status = TaskStatus.CANCELLED_EFFECT_UNKNOWN if acted else TaskStatus.CANCELLED
        assert (record.status, record.claim_generation) == (status, task.generation)
        task.status, task.owner, task.expires_ms = status, None, None
        self.granted_write(task, EventKind.CANCELLED, None)

    @rule(elapsed_ms=st.integers(min_value=1, max_value=12_000))
    def expire(self, elapsed_ms: int) -> None:
        """Advance the injected clock; leases lapse on their own."""
        self.now += timedelta(milliseconds=elapsed_ms)

    @rule(step=st.sampled_from(sorted(TTLS)), offset_ms=st.sampled_from([-1, 0, 1]))
    def expire_at_the_boundary(self, step: str, offset_ms: int) -> None:
        """Jump to just before, exactly at, or just after a lease's expiry."""
        expires_ms = self.tasks[step].expires_ms
        if expires_ms is not None and expires_ms + offset_ms > self.now_ms:
            self.now = from_ms(expires_ms + offset_ms) or self.now

    # -- invariant -----------------------------------------------------------------------------

    @invariant()
    def guarantees_hold(self) -> None:
        """G2 probe of one stale holder (unless the step already made one), then G1 and G3."""
        stale = [c for c in self.granted if not self.by_task_id[c.task_id].holds(c, self.now_ms)]
        if stale and not self.refusals_this_step:
            self.probes += 1
            claim = stale[self.probes % len(stale)]
            self.refused(HOLDER_WRITES[self.probes % len(HOLDER_WRITES)], claim, Stage.COMMIT)

        for task in self.tasks.values():
            task_id = task.spec.task_id
            if task.status is not None and task_id in self.touched:
                self.check_task(task)
            # G1 at the injected now: the trail shows at most one valid lease, the model's.
            valid_now = [i.generation for i in task.intervals if i.acquired_ms <= self.now_ms < i.end_ms]
            model_valid = [c.generation for c in self.granted if c.task_id == task_id and task.holds(c, self.now_ms)]
            assert len(valid_now) <= 1
            assert valid_now == model_valid
        self.changed.clear()
        self.touched.clear()
        self.settle_attempted.clear()
        self.refusals_this_step = 0

    def check_task(self, task: ModelTask) -> None:
        """Read back a task a write touched in this step: its row, trail and receipt."""
        task_id = task.spec.task_id
        record = self.run(self.ledger.get_task(task_id))
        previous = task.checked_row
        if task_id not in self.changed:
            assert record == previous, "a refused write (or no write) changed the row"
        task.checked_row = record
        # G3: the generation is the number of granted claims, and it never went down.
        assert record.claim_generation >= (0 if previous is None else previous.claim_generation)
        assert record.claim_generation == record.attempts == task.generation
        assert (record.status, record.stage, record.renewal_count) == (task.status, task.stage, task.renewals)
        assert record.lease_expires_at == (None if task.expires_ms is None else from_ms(task.expires_ms))
        if task.status == TaskStatus.RUNNING:
            assert record.lease_owner == task.owner

        events = self.run(self.ledger.events(task_id))
        assert [(e.kind, e.claim_generation, e.lease_owner) for e in events] == task.trail
        task.intervals = assert_one_valid_lease_at_a_time(events)
        if task_id in self.settle_attempted:
            # G10: only the generation that settled has a receipt; refused settles add none.
            stored = self.run(self.ledger.receipt(task.spec.idempotency_key))
            assert (None if stored is None else stored.claim_generation) == task.receipt_generation


@pytest.fixture(scope="module")
def migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One migrated SQLite ledger file; each example starts from a copy of it."""
    path = tmp_path_factory.mktemp("template") / "ledger.db"

    async def migrate() -> None:
        ledger = Ledger.from_url(f"sqlite:///{path}")
        try:
            await upgrade(ledger.database)
        finally:
            await ledger.close()

    asyncio.run(migrate())
    assert not path.with_name("ledger.db-wal").exists() or path.with_name("ledger.db-wal").stat().st_size == 0
    yield path


def test_ledger_state_machine(migrated_template: Path, tmp_path: Path) -> None:
    run_state_machine_as_test(
        lambda: LedgerMachine(migrated_template, tmp_path),  # type: ignore[arg-type]
        settings=MACHINE_SETTINGS,
    )
