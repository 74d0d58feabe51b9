"""The expired-lease sweeper on SQLite and PostgreSQL, with injected time (no sleeping)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from agentlease.enums import DecisionKind, EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.expiry import Expiry, expired_leases, record_expiries, record_expiry
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import Claim, SettlementReceipt, TaskSpec, idempotency_key_for, task_id_for
from agentlease.recovery._sweeper import ExpiredLeaseSweeper, SweeperSettings

TTL = timedelta(seconds=10)
LATER = TTL + timedelta(seconds=1)


def spec(cls: SideEffectClass = SideEffectClass.IDEMPOTENT, *, run: str | None = None, step: str = "s") -> TaskSpec:
    run = run or f"sweep-{uuid.uuid4().hex[:10]}"
    return TaskSpec(
        task_id=task_id_for(run, step),
        agent_run_id=run,
        step_id=step,
        tool="tool",
        side_effect_class=cls,
        idempotency_key=idempotency_key_for(run, step),
        lease_ttl=TTL,
    )


async def claimed_at_stage(ledger: Ledger, task: TaskSpec, stage: Stage | None, base: datetime) -> Claim:
    claim = await ledger.claim(task, "worker-1", now=base)
    if stage is not None:
        await ledger.renew(claim, reason=f"entering {stage.value}", stage=stage, now=base)
    return claim


def receipt() -> SettlementReceipt:
    return SettlementReceipt(external_system="x", external_id="1", status="present", verified_at=datetime.now(UTC))


def sweeper_events(trail: list) -> list:
    return [e for e in trail if e.kind is EventKind.EXPIRED and (e.details or {}).get("by") == "sweeper"]


async def test_sweeper_classifies_by_policy(ledger: Ledger) -> None:
    base = await ledger.db_now()
    cases = {
        "read_only@external_call": (SideEffectClass.READ_ONLY, Stage.EXTERNAL_CALL, TaskStatus.RELEASED),
        "idempotent@commit": (SideEffectClass.IDEMPOTENT, Stage.COMMIT, TaskStatus.RELEASED),
        "fenced@preflight": (SideEffectClass.FENCED, Stage.PREFLIGHT, TaskStatus.RELEASED),
        "unsafe@preflight": (SideEffectClass.UNSAFE, Stage.PREFLIGHT, TaskStatus.RELEASED),
        "unsafe@external_call": (SideEffectClass.UNSAFE, Stage.EXTERNAL_CALL, TaskStatus.NEEDS_RECONCILIATION),
        "unsafe@verify": (SideEffectClass.UNSAFE, Stage.VERIFY, TaskStatus.NEEDS_RECONCILIATION),
    }
    tasks = {name: spec(cls) for name, (cls, _, _) in cases.items()}
    for name, (_, stage, _) in cases.items():
        await claimed_at_stage(ledger, tasks[name], stage, base)
    valid = spec()
    await claimed_at_stage(ledger, valid, Stage.EXTERNAL_CALL, base + LATER - timedelta(seconds=2))
    settled = spec()
    await ledger.settle(await claimed_at_stage(ledger, settled, Stage.VERIFY, base), receipt(), now=base)

    result = await ExpiredLeaseSweeper(ledger, SweeperSettings(batch_size=2)).run_once(now=base + LATER)

    assert (result.examined, result.released, result.needs_reconciliation, result.skipped) == (6, 4, 2, 0)
    for name, (_, stage, expected) in cases.items():
        record = await ledger.get_task(tasks[name].task_id)
        assert (record.status, record.stage, record.lease_owner) == (expected, stage, None), name
        [event] = sweeper_events(await ledger.events(tasks[name].task_id))
        assert (event.stage, event.claim_generation, event.lease_owner) == (stage, 1, "worker-1")
    assert (await ledger.get_task(valid.task_id)).status is TaskStatus.RUNNING
    assert (await ledger.get_task(settled.task_id)).status is TaskStatus.SETTLED
    # A second sweep finds nothing left to record.
    again = await ExpiredLeaseSweeper(ledger).run_once(now=base + LATER)
    assert again.examined == 0


async def test_sweeper_dead_letters_a_task_out_of_attempts(ledger: Ledger) -> None:
    base = await ledger.db_now()
    task = spec(SideEffectClass.IDEMPOTENT)
    for attempt in range(3):
        claim = await ledger.claim(task, "w", now=base + attempt * LATER)
    assert claim.attempts == 3
    sweeper = ExpiredLeaseSweeper(ledger, SweeperSettings(max_attempts_by_tool={"tool": 3}))
    result = await sweeper.run_once(now=base + 3 * LATER)
    assert result.dead_lettered == 1
    assert (await ledger.get_task(task.task_id)).status is TaskStatus.DEAD_LETTERED


async def test_settlement_between_read_and_write_stands(ledger: Ledger) -> None:
    """The River rescuer race: the sweeper read an expired lease; a newer attempt settles; the write is refused."""
    base = await ledger.db_now()
    task = spec(SideEffectClass.IDEMPOTENT)
    await claimed_at_stage(ledger, task, Stage.COMMIT, base)
    [lease] = await expired_leases(ledger, limit=10, now=base + LATER)

    newer = await ledger.claim(task, "worker-2", now=base + LATER)
    stored = await ledger.settle(newer, receipt(), now=base + LATER)

    assert not await record_expiry(ledger, lease, status=TaskStatus.RELEASED, decision="test", now=base + LATER)
    record = await ledger.get_task(task.task_id)
    assert (record.status, record.claim_generation, record.receipt) == (TaskStatus.SETTLED, 2, stored.receipt)
    assert sweeper_events(await ledger.events(task.task_id)) == []


async def test_two_sweepers_record_each_expired_task_once(ledger_url: str) -> None:
    ledgers = [Ledger.from_url(ledger_url) for _ in range(2)]
    try:
        await upgrade(ledgers[0].database)
        base = await ledgers[0].db_now()
        run = f"many-{uuid.uuid4().hex[:8]}"
        tasks = [spec(SideEffectClass.READ_ONLY, run=run, step=f"s{i:02d}") for i in range(30)]
        for task in tasks:
            await claimed_at_stage(ledgers[0], task, Stage.EXTERNAL_CALL, base)
        sweepers = [ExpiredLeaseSweeper(one, SweeperSettings(batch_size=7)) for one in ledgers]

        results = await asyncio.gather(*(s.run_once(now=base + LATER) for s in sweepers))

        assert sum(r.released for r in results) == 30
        trail = await ledgers[0].events(agent_run_id=run)
        recorded = [e.task_id for e in sweeper_events(trail)]
        assert sorted(recorded) == sorted(t.task_id for t in tasks)
        assert all(r.status is TaskStatus.RELEASED for r in await ledgers[0].list_tasks(run))
    finally:
        for one in ledgers:
            await one.close()


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        SweeperSettings(interval=timedelta(0))
    with pytest.raises(ValueError):
        SweeperSettings(batch_size=0)
    with pytest.raises(ValueError):
        SweeperSettings(max_attempts_by_tool={"t": 0})


async def test_a_batch_records_only_the_leases_unchanged_since_it_was_read(ledger: Ledger) -> None:
    """One statement per batch, row by row conditional: a task settled, cancelled or claimed again
    between the sweeper's read and its write keeps what the newer writer recorded (G1, G8)."""
    base = await ledger.db_now()
    run = f"batch-{uuid.uuid4().hex[:8]}"
    settled, cancelled, taken, lapsed = (spec(SideEffectClass.IDEMPOTENT, run=run, step=s) for s in "abcd")
    for task in (settled, cancelled, taken, lapsed):
        await claimed_at_stage(ledger, task, Stage.EXTERNAL_CALL, base)
    later = base + LATER
    leases = await expired_leases(ledger, limit=10, now=later)
    assert {lease.task_id for lease in leases} == {t.task_id for t in (settled, cancelled, taken, lapsed)}

    stored = await ledger.settle(await ledger.claim(settled, "worker-2", now=later), receipt(), now=later)
    await ledger.decide(cancelled.task_id, DecisionKind.CANCEL, by="carol", reason="withdrawn", now=later)
    await ledger.claim(taken, "worker-2", now=later)

    expiries = [Expiry(lease, TaskStatus.RELEASED, "test") for lease in leases]
    assert await record_expiries(ledger, expiries, now=later) == {lapsed.task_id}

    records = {t.task_id: await ledger.get_task(t.task_id) for t in (settled, cancelled, taken, lapsed)}
    assert (records[settled.task_id].status, records[settled.task_id].receipt) == (TaskStatus.SETTLED, stored.receipt)
    # cancelled inside external_call: its effect may be in place (G11); the sweep left it as it was
    assert records[cancelled.task_id].status is TaskStatus.CANCELLED_EFFECT_UNKNOWN
    taken_now = records[taken.task_id]
    assert (taken_now.status, taken_now.claim_generation, taken_now.lease_owner) == (TaskStatus.RUNNING, 2, "worker-2")
    assert (records[lapsed.task_id].status, records[lapsed.task_id].lease_owner) == (TaskStatus.RELEASED, None)
    swept = sweeper_events(await ledger.events(agent_run_id=run))
    assert [(e.task_id, e.claim_generation) for e in swept] == [(lapsed.task_id, 1)]
