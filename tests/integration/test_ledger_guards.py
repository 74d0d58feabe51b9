"""The ledger's guards (G1, G2, G3, G8, G10) on SQLite and PostgreSQL, with injected time.

Every test takes ``base = await ledger.db_now()`` and passes ``now=base + offset`` so that
expiry is decided on the ledger's terms without sleeping.
"""

from __future__ import annotations

import inspect
import re
import uuid
from datetime import datetime, timedelta

import pytest

from agentlease.clock import from_ms
from agentlease.enums import DecisionKind, EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.errors import (
    ClockBehindError,
    LeaseHeldError,
    LeaseLostError,
    TaskClosedError,
    TaskMovedError,
    TaskNotFoundError,
)
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import (
    Claim,
    LeaseEvent,
    SettlementReceipt,
    TaskRecord,
    TaskSpec,
    idempotency_key_for,
    task_id_for,
)
from tests.eventually import assert_eventually
from tests.lease_trail import assert_one_valid_lease_at_a_time

TTL = timedelta(seconds=30)
_GENERATION_LIKE = re.compile(r"(^|_)(gen|generation|token|fenc\w*|epoch|version|attempt)(_|$)", re.IGNORECASE)
MS = timedelta(milliseconds=1)


def make_spec(step_id: str = "fetch", *, ttl: timedelta = TTL) -> TaskSpec:
    run = f"run-{uuid.uuid4().hex[:12]}"
    return TaskSpec(
        task_id=task_id_for(run, step_id),
        agent_run_id=run,
        step_id=step_id,
        tool="http.get",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=idempotency_key_for(run, step_id),
        lease_ttl=ttl,
    )


def make_receipt(external_id: str, at: datetime) -> SettlementReceipt:
    return SettlementReceipt(
        external_system="http",
        external_id=external_id,
        status="present",
        details={"bytes": 42},
        verified_at=at,
    )


async def row(ledger: Ledger, spec: TaskSpec) -> TaskRecord:
    return await ledger.get_task(spec.task_id)


async def test_renew_after_expiry_raises_lease_lost_and_changes_nothing(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    claim = await ledger.claim(spec, "w1", now=base)
    assert claim.generation == 1
    assert claim.expires_at == base.replace(microsecond=base.microsecond // 1000 * 1000) + TTL
    before = await row(ledger, spec)

    for late in (TTL, TTL + MS, TTL + timedelta(hours=1)):  # expiry itself is already too late
        with pytest.raises(LeaseLostError) as refused:
            await ledger.renew(claim, reason="still fetching", stage=Stage.EXTERNAL_CALL, now=base + late)
        assert refused.value.operation == "renew"
        assert refused.value.generation == 1
        assert refused.value.current_generation == 1
        assert refused.value.status == TaskStatus.RUNNING
        assert await row(ledger, spec) == before

    lost = [e for e in await ledger.events(spec.task_id) if e.kind == EventKind.LEASE_LOST]
    assert len(lost) == 3
    assert all(e.claim_generation == 1 and e.lease_owner == "w1" for e in lost)
    # The entry says why: the holder's own lease lapsed (it said "ledger has generation 1, status running").
    assert [e.reason for e in lost] == [
        f"renew refused: the lease of generation 1 lapsed {lapsed}s earlier (no renewal within its TTL); "
        "nobody has claimed the task since"
        for lapsed in ("0.0", "0.0", "3600.0")
    ]


async def test_renew_within_lease_extends_by_own_ttl_and_records_stage(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    claim = await ledger.claim(spec, "w1", now=base)

    expires = await ledger.renew(claim, reason="request sent", stage=Stage.EXTERNAL_CALL, now=base + TTL - MS)
    assert expires == claim.expires_at + TTL - MS
    task = await row(ledger, spec)
    assert (task.stage, task.renewal_count, task.lease_expires_at) == (Stage.EXTERNAL_CALL, 1, expires)
    # The renewal moved the expiry: the old expiry no longer ends the lease.
    await ledger.renew(claim, reason="verifying readback", stage=Stage.VERIFY, now=base + TTL + MS)
    renewed = [e for e in await ledger.events(spec.task_id) if e.kind == EventKind.RENEWED]
    assert [(e.stage, e.reason) for e in renewed] == [
        (Stage.EXTERNAL_CALL, "request sent"),
        (Stage.VERIFY, "verifying readback"),
    ]


async def test_superseded_generation_cannot_renew_or_settle(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    old = await ledger.claim(spec, "w1", now=base)
    new = await ledger.claim(spec, "w2", now=base + TTL)
    assert new.generation == 2
    before = await row(ledger, spec)

    # Judged at the takeover instant, and also at a time when the old lease looked valid:
    # the generation alone fences the old holder off.
    for at in (base + TTL + MS, base + timedelta(seconds=1)):
        with pytest.raises(LeaseLostError) as renew_refused:
            await ledger.renew(old, reason="late heartbeat", now=at)
        assert (renew_refused.value.generation, renew_refused.value.current_generation) == (1, 2)
        with pytest.raises(LeaseLostError) as settle_refused:
            await ledger.settle(old, make_receipt("doc-1", at), now=at)
        assert settle_refused.value.operation == "settle"
        assert settle_refused.value.current_generation == 2
        assert await row(ledger, spec) == before

    assert await ledger.receipt(spec.idempotency_key) is None
    # The current holder is unaffected.
    await ledger.renew(new, reason="still mine", now=base + TTL + timedelta(seconds=2))


async def test_settle_after_cancel_is_refused_and_task_stays_cancelled(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    claim = await ledger.claim(spec, "w1", now=base)
    cancelled = await ledger.decide(
        spec.task_id, DecisionKind.CANCEL, by="alice", reason="wrong target", now=base + timedelta(seconds=1)
    )
    assert cancelled.status == TaskStatus.CANCELLED
    assert cancelled.lease_expires_at is None
    before = await row(ledger, spec)

    # Within the lease's original TTL, and long after it would have expired.
    for at in (base + timedelta(seconds=2), base + TTL + timedelta(minutes=5)):
        with pytest.raises(LeaseLostError) as refused:
            await ledger.settle(claim, make_receipt("doc-1", at), result={"ok": True}, now=at)
        assert refused.value.status == TaskStatus.CANCELLED
        with pytest.raises(LeaseLostError):
            await ledger.renew(claim, reason="late heartbeat", now=at)
        with pytest.raises(TaskClosedError) as closed:
            await ledger.claim(spec, "w2", now=at)
        assert closed.value.status == TaskStatus.CANCELLED
        assert await row(ledger, spec) == before

    assert (await row(ledger, spec)).status == TaskStatus.CANCELLED
    assert await ledger.receipt(spec.idempotency_key) is None
    with pytest.raises(TaskClosedError):
        await ledger.decide(spec.task_id, DecisionKind.CANCEL, by="bob", reason="again", now=base + TTL * 3)


@pytest.mark.parametrize("operation", ["release", "dead_letter"])
async def test_stale_holder_cannot_release_or_dead_letter(ledger: Ledger, operation: str) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    old = await ledger.claim(spec, "w1", now=base)
    new = await ledger.claim(spec, "w2", now=base + TTL + MS)
    before = await row(ledger, spec)

    end = getattr(ledger, operation)
    with pytest.raises(LeaseLostError) as superseded:
        await end(old, error_class="retryable", error="503 from upstream", now=base + TTL + 2 * MS)
    assert superseded.value.operation == operation
    assert (superseded.value.generation, superseded.value.current_generation) == (1, 2)
    assert await row(ledger, spec) == before

    # Lapsed without a takeover: the holder of generation 2 is stale too.
    with pytest.raises(LeaseLostError) as lapsed:
        await end(new, error_class="retryable", error="too late", now=new.expires_at)
    assert (lapsed.value.generation, lapsed.value.current_generation) == (2, 2)
    assert await row(ledger, spec) == before


@pytest.mark.parametrize("closing", ["settle", "dead_letter", "cancel"])
async def test_claim_of_closed_task_raises_task_closed(ledger: Ledger, closing: str) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    claim = await ledger.claim(spec, "w1", now=base)
    at = base + timedelta(seconds=1)
    if closing == "settle":
        await ledger.settle(claim, make_receipt("doc-1", at), now=at)
        status = TaskStatus.SETTLED
    elif closing == "dead_letter":
        await ledger.dead_letter(claim, error_class="permanent", error="404", now=at)
        status = TaskStatus.DEAD_LETTERED
    else:
        await ledger.decide(spec.task_id, DecisionKind.CANCEL, by="alice", reason="not needed", now=at)
        status = TaskStatus.CANCELLED
    before = await row(ledger, spec)
    assert before.status == status

    for later in (timedelta(seconds=2), TTL * 10):
        with pytest.raises(TaskClosedError) as closed:
            await ledger.claim(spec, "w2", now=base + later)
        assert closed.value.status == status
        assert closed.value.task_id == spec.task_id
    assert await row(ledger, spec) == before


async def test_claim_while_lease_valid_raises_lease_held_with_remaining_ttl(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    await ledger.claim(spec, "w1", now=base)
    before = await row(ledger, spec)

    with pytest.raises(LeaseHeldError) as held:
        await ledger.claim(spec, "w2", now=base + timedelta(seconds=12, milliseconds=345))
    assert held.value.retry_after == TTL - timedelta(seconds=12, milliseconds=345)
    assert (held.value.holder, held.value.generation) == ("w1", 1)
    # The same owner does not get a second lease either.
    with pytest.raises(LeaseHeldError) as same_owner:
        await ledger.claim(spec, "w1", now=base + TTL - MS)
    assert same_owner.value.retry_after == MS
    assert await row(ledger, spec) == before


async def test_lease_held_retry_after_follows_renewal(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    claim = await ledger.claim(spec, "w1", now=base)
    await ledger.renew(claim, reason="long download", now=base + timedelta(seconds=20))
    with pytest.raises(LeaseHeldError) as held:
        await ledger.claim(spec, "w2", now=base + timedelta(seconds=21))
    assert held.value.retry_after == TTL - timedelta(seconds=1)


async def test_generations_never_decrease(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    seen: list[int] = []

    async def note() -> None:
        seen.append((await row(ledger, spec)).claim_generation)

    at = base
    c1 = await ledger.claim(spec, "w1", now=at)
    await note()
    await ledger.release(c1, error_class="retryable", error="503", now=at + MS)
    await note()
    c2 = await ledger.claim(spec, "w2", now=at + 2 * MS)
    await note()
    with pytest.raises(LeaseHeldError):
        await ledger.claim(spec, "w3", now=at + 3 * MS)
    await note()
    at = c2.expires_at
    c3 = await ledger.claim(spec, "w3", now=at)  # takeover after lapse
    await note()
    for stale in (c1, c2):
        with pytest.raises(LeaseLostError):
            await ledger.renew(stale, reason="late", now=at + MS)
        await note()
    # Injected time going backwards cannot bring an old generation back either.
    with pytest.raises(LeaseHeldError):
        await ledger.claim(spec, "w1", now=base)
    await note()
    await ledger.release(c3, error_class="retryable", error="worker lost its upstream", now=at + 2 * MS)
    c4 = await ledger.claim(spec, "w1", now=at + 3 * MS)
    await note()

    assert [c.generation for c in (c1, c2, c3, c4)] == [1, 2, 3, 4]
    assert seen == sorted(seen)
    assert seen[-1] == 4
    assert (await row(ledger, spec)).attempts == 4


async def test_no_api_accepts_a_generation(ledger: Ledger) -> None:
    claim_params = list(inspect.signature(Ledger.claim).parameters)
    assert claim_params == ["self", "spec", "owner", "trace", "heartbeat_timeout", "now"]
    assert not [p for p in claim_params if _GENERATION_LIKE.search(p)]
    assert not [f for f in TaskSpec.model_fields if _GENERATION_LIKE.search(f)], TaskSpec.model_fields
    for name in ("renew", "settle", "release", "dead_letter", "await_decision"):
        params = inspect.signature(getattr(Ledger, name)).parameters
        assert not [p for p in params if _GENERATION_LIKE.search(p)], (name, params)
    # decide takes one only as a precondition (a signed decision's generation), never as a value to write:
    # below, one the ledger did not mint changes nothing.
    decide_params = inspect.signature(Ledger.decide).parameters
    assert [p for p in decide_params if _GENERATION_LIKE.search(p)] == ["expected_generation"], decide_params

    # A forged claim carrying a generation the ledger did not mint is refused.
    spec = make_spec()
    base = await ledger.db_now()
    real = await ledger.claim(spec, "w1", now=base)
    before = await row(ledger, spec)
    for forged_generation in (real.generation + 1, real.generation + 100):
        forged = Claim(**{**real.model_dump(), "generation": forged_generation})
        with pytest.raises(LeaseLostError) as refused:
            await ledger.renew(forged, reason="forged", now=base + MS)
        assert refused.value.current_generation == real.generation
        with pytest.raises(LeaseLostError):
            await ledger.settle(forged, make_receipt("doc-x", base), now=base + MS)
    assert await row(ledger, spec) == before
    for forged_generation in (real.generation + 1, real.generation + 100):
        with pytest.raises(TaskMovedError):
            await ledger.decide(
                spec.task_id, DecisionKind.CANCEL, by="x", reason="forged", expected_generation=forged_generation
            )
    assert await row(ledger, spec) == before
    await ledger.release(real, error_class="retryable", error="503", now=base + 2 * MS)
    assert (await ledger.claim(spec, "w2", now=base + 3 * MS)).generation == real.generation + 1


async def test_refused_settle_recorded_as_late_unapplied(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    old = await ledger.claim(spec, "w1", now=base)
    new = await ledger.claim(spec, "w2", now=old.expires_at)
    late_receipt = make_receipt("doc-late", base + timedelta(seconds=40))
    at = old.expires_at + timedelta(seconds=10)

    with pytest.raises(LeaseLostError):
        await ledger.settle(old, late_receipt, result={"status_code": 200}, now=at)

    late = [e for e in await ledger.events(spec.task_id) if e.kind == EventKind.LATE_UNAPPLIED]
    assert len(late) == 1
    event = late[0]
    assert event.reason == "settle refused: ledger has generation 2, status running"  # taken over: no lapse told
    assert (event.claim_generation, event.lease_owner) == (1, "w1")
    assert event.details is not None
    assert event.details["operation"] == "settle"
    assert event.details["receipt"] == late_receipt.model_dump(mode="json")
    assert SettlementReceipt.model_validate(event.details["receipt"]) == late_receipt
    assert event.details["result"] == {"status_code": 200}
    assert await ledger.receipt(spec.idempotency_key) is None
    assert (await row(ledger, spec)).receipt is None

    # The current generation settles; its receipt stands, not the late one.
    good = make_receipt("doc-good", at)
    stored = await ledger.settle(new, good, now=at + MS)
    assert (stored.claim_generation, stored.receipt) == (2, good)
    assert await ledger.receipt(spec.idempotency_key) == stored
    with pytest.raises(LeaseLostError):
        await ledger.settle(old, late_receipt, now=at + 2 * MS)
    assert await ledger.receipt(spec.idempotency_key) == stored
    settled = [e for e in await ledger.events(spec.task_id) if e.kind == EventKind.SETTLED]
    assert [e.claim_generation for e in settled] == [2]


async def test_takeover_evidence_trail(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    first = await ledger.claim(spec, "w1", now=base)
    takeover_at = first.expires_at + timedelta(milliseconds=5)
    second = await ledger.claim(spec, "w2", now=takeover_at)

    events = await ledger.events(spec.task_id)
    assert [(e.kind, e.claim_generation, e.lease_owner) for e in events] == [
        (EventKind.CLAIMED, 1, "w1"),
        (EventKind.EXPIRED, 1, "w1"),
        (EventKind.CLAIMED, 2, "w2"),
    ]
    claimed1, expired1, claimed2 = events
    assert claimed1.at == first.acquired_at
    assert expired1.at == claimed2.at == second.acquired_at == takeover_at
    assert claimed1.details is not None
    assert expired1.details == {"lease_expires_at_ms": claimed1.details["lease_expires_at_ms"], "by": "takeover"}
    assert from_details(expired1) == first.expires_at
    assert from_details(claimed2) == second.expires_at
    intervals = assert_one_valid_lease_at_a_time(events)
    assert [(i.generation, i.ended_by) for i in intervals] == [(1, "expiry"), (2, "expiry")]
    assert second.attempts == 2


def from_details(event: LeaseEvent) -> datetime:
    assert event.details is not None
    value = from_ms(event.details["lease_expires_at_ms"])
    assert value is not None
    return value


async def test_lease_lapses_on_the_database_clock(ledger: Ledger) -> None:
    """Without injected time: a short lease lapses on the ledger's clock and can be taken over."""
    spec = make_spec(ttl=timedelta(milliseconds=300))
    first = await ledger.claim(spec, "w1")
    try:
        await ledger.claim(spec, "w2")
    except LeaseHeldError as held:
        assert timedelta(0) <= held.retry_after <= timedelta(milliseconds=300)

    async def take_over() -> Claim:
        try:
            return await ledger.claim(spec, "w2")
        except LeaseHeldError as held:
            raise AssertionError(f"still held for {held.retry_after}") from held

    second = await assert_eventually(take_over, timeout=10, interval=0.02, message="takeover after lapse")
    assert second.generation == first.generation + 1
    assert second.acquired_at >= first.expires_at
    with pytest.raises(LeaseLostError):
        await ledger.renew(first, reason="late heartbeat")


async def test_a_renewal_never_lowers_the_recorded_stage(ledger: Ledger) -> None:
    """G6 in the ledger itself: whoever renews, the recorded stage only moves forward, also across attempts."""
    spec = make_spec()
    base = await ledger.db_now()
    first = await ledger.claim(spec, "w1", now=base)
    await ledger.renew(first, reason="writing", stage=Stage.COMMIT, now=base + MS)
    await ledger.renew(first, reason="caller asks to go back", stage=Stage.PREFLIGHT, now=base + 2 * MS)
    assert (await row(ledger, spec)).stage is Stage.COMMIT
    await ledger.renew(first, reason="still writing", now=base + 3 * MS)  # no stage: keeps it
    assert (await row(ledger, spec)).stage is Stage.COMMIT
    await ledger.release(first, error_class="retryable", error="connection dropped", now=base + 4 * MS)

    second = await ledger.claim(spec, "w2", now=base + 5 * MS)
    assert second.previous_stage is Stage.COMMIT
    await ledger.renew(second, reason="starting over", stage=Stage.PREFLIGHT, now=base + 6 * MS)
    assert (await row(ledger, spec)).stage is Stage.COMMIT
    await ledger.renew(second, reason="reading back", stage=Stage.VERIFY, now=base + 7 * MS)
    assert (await row(ledger, spec)).stage is Stage.VERIFY
    renewals = [e for e in await ledger.events(spec.task_id) if e.kind is EventKind.RENEWED]
    assert [e.stage for e in renewals] == [Stage.COMMIT, Stage.COMMIT, Stage.COMMIT, Stage.COMMIT, Stage.VERIFY]


async def test_the_ledger_refuses_what_only_a_careful_caller_would_avoid(ledger: Ledger) -> None:
    spec = make_spec()
    base = await ledger.db_now()
    claim = await ledger.claim(spec, "w1", now=base)
    with pytest.raises(ValueError, match="settled"):
        await ledger.renew(claim, reason="done", stage=Stage.SETTLED, now=base + MS)
    with pytest.raises(ValueError, match="reason"):
        await ledger.renew(claim, reason="  ", now=base + MS)
    with pytest.raises(ValueError, match="ErrorClass"):
        await ledger.release(claim, error_class="PermanentToolError", error="404", now=base + MS)
    with pytest.raises(ValueError, match="park"):
        await ledger.await_decision(
            claim, status=TaskStatus.AWAITING_APPROVAL, error_class="retryable", error="x", now=base + MS
        )
    with pytest.raises(ValueError, match="needs settlement receipt"):
        await ledger.decide(spec.task_id, DecisionKind.CONFIRM, by="alice", reason="seen it")
    with pytest.raises(ValueError, match="takes no settlement receipt"):
        await ledger.decide(spec.task_id, DecisionKind.CANCEL, by="alice", reason="x", receipt=make_receipt("r", base))
    record = await row(ledger, spec)
    assert (record.status, record.stage, record.claim_generation) == (TaskStatus.RUNNING, None, 1)
    assert [e.kind for e in await ledger.events(spec.task_id)] == [EventKind.CLAIMED]


@pytest.mark.parametrize("ttl", [timedelta(0), -5 * timedelta(seconds=1), timedelta(microseconds=500)])
async def test_a_renewal_for_no_time_is_refused_not_granted(ledger: Ledger, ttl: timedelta) -> None:
    """G1: a renewal whose ttl is zero, negative or under a millisecond would answer with an expiry already past
    (another worker could claim at once while the holder believes it renewed): refused, the lease left as it was."""
    spec = make_spec()
    base = await ledger.db_now()
    claim = await ledger.claim(spec, "w1", now=base)
    with pytest.raises(ValueError, match="ttl must be at least 1 ms"):
        await ledger.renew(claim, reason="working", ttl=ttl, now=base + MS)
    assert (await row(ledger, spec)).lease_expires_at == claim.expires_at
    assert [e.kind for e in await ledger.events(spec.task_id)] == [EventKind.CLAIMED]
    with pytest.raises(LeaseHeldError):
        await ledger.claim(spec, "w2", now=base + 2 * MS)


async def test_a_zero_heartbeat_timeout_is_none_and_a_negative_one_is_refused(ledger: Ledger) -> None:
    """G1: Temporal's zero heartbeat timeout means none, so the claim keeps the lease's TTL; a negative one (or one
    under a millisecond) would grant a lease already lapsed: refused, nothing claimed."""
    spec = make_spec()
    base = await ledger.db_now()
    for timeout in (-5 * timedelta(seconds=1), timedelta(microseconds=500)):
        with pytest.raises(ValueError, match="heartbeat timeout must be at least 1 ms"):
            await ledger.claim(spec, "w0", heartbeat_timeout=timeout, now=base)
    with pytest.raises(TaskNotFoundError):
        await row(ledger, spec)

    first = await ledger.claim(spec, "w1", now=base)
    await ledger.release(first, error_class="retryable", error="503 from upstream", now=base + MS)
    claim = await ledger.claim(spec, "w2", heartbeat_timeout=timedelta(0), now=base + 2 * MS)
    assert claim.expires_at - claim.acquired_at == TTL
    with pytest.raises(LeaseHeldError):
        await ledger.claim(spec, "w3", now=base + 3 * MS)
    claimed = [e for e in await ledger.events(spec.task_id) if e.kind is EventKind.CLAIMED]
    assert "heartbeat" not in (claimed[-1].reason or "")


async def test_a_settle_that_finds_a_standing_receipt_shows_that_one(ledger: Ledger) -> None:
    """The first receipt of an idempotency key stands, in the receipts table and on the task."""
    base = await ledger.db_now()
    first, second = make_spec("a"), make_spec("b")
    second = second.model_copy(update={"idempotency_key": first.idempotency_key})
    claim = await ledger.claim(first, "w1", now=base)
    await ledger.settle(claim, make_receipt("first", base), now=base + MS)
    other = await ledger.claim(second, "w2", now=base + 2 * MS)
    assert other.receipt is not None and other.receipt.receipt.external_id == "first"
    stored = await ledger.settle(other, make_receipt("second", base), now=base + 3 * MS)
    assert stored.receipt.external_id == "first"
    standing = (await row(ledger, second)).receipt
    assert standing is not None and standing.external_id == "first"


async def test_a_sqlite_claim_on_a_clock_behind_the_ledger_is_refused(sqlite_url: str) -> None:
    """G1 on SQLite is one host, one clock: each process judges time by its own clock. A process whose
    clock is 20 s ahead writes (injected ``now``: its clock); a claim on the host's clock afterwards runs
    20 s behind the ledger's latest recorded time and is refused, with nothing written."""
    ledger = Ledger.from_url(sqlite_url)
    try:
        await upgrade(ledger.database)
        ahead = await ledger.db_now() + timedelta(seconds=20)
        await ledger.claim(make_spec("ahead"), "w-fast-clock", now=ahead)
        before = await ledger.events()
        with pytest.raises(ClockBehindError) as behind:
            await ledger.claim(make_spec("honest"), "w-host-clock")
        assert timedelta(seconds=19) < behind.value.behind <= timedelta(seconds=20)
        assert "behind the ledger's latest recorded time" in str(behind.value)
        assert await ledger.events() == before
        with pytest.raises(TaskNotFoundError):
            await ledger.get_task(make_spec("honest").task_id)
        # A claim on a clock that has caught up goes ahead (here injected: tests control time).
        await ledger.claim(make_spec("later"), "w-host-clock", now=ahead + MS)
    finally:
        await ledger.close()


@pytest.mark.postgres
async def test_postgresql_judges_every_claim_on_its_own_clock(pg_url: str) -> None:
    """G1 on PostgreSQL: one clock, the server's; an entry written with a later injected time refuses nothing."""
    ledger = Ledger.from_url(pg_url)
    try:
        await upgrade(ledger.database)
        await ledger.claim(make_spec("ahead"), "w1", now=await ledger.db_now() + timedelta(seconds=20))
        assert (await ledger.claim(make_spec("now"), "w2")).generation == 1
    finally:
        await ledger.close()
