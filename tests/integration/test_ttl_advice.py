"""The TTL advisor on a ledger filled with known renewal histories (injected time, no sleeps)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from agentlease.enums import SideEffectClass, Stage
from agentlease.ledger.store import Ledger
from agentlease.records import SettlementReceipt, TaskSpec
from agentlease.ttl_advice import advise, read_samples, since_argument

S = timedelta(seconds=1)


def spec(tool: str, ttl: timedelta) -> TaskSpec:
    run = f"ttl-{uuid.uuid4().hex[:8]}"
    return TaskSpec(
        task_id=f"{run}/step",
        agent_run_id=run,
        step_id="step",
        tool=tool,
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=f"{run}:step",
        lease_ttl=ttl,
    )


def receipt(at: datetime) -> SettlementReceipt:
    return SettlementReceipt(external_system="x", external_id="1", status="ok", verified_at=at)


async def steady_call(ledger: Ledger, start: datetime) -> None:
    """Renews every second through three stages, settles at +4 s (TTL 10 s)."""
    task = spec("steady", 10 * S)
    claim = await ledger.claim(task, "w1", now=start)
    for offset, stage in ((1, Stage.PREFLIGHT), (2, Stage.EXTERNAL_CALL), (3, Stage.VERIFY)):
        await ledger.renew(claim, reason=f"{stage.value} work", stage=stage, now=start + offset * S)
    await ledger.settle(claim, receipt(start), now=start + 4 * S)


async def bursty_call(ledger: Ledger, start: datetime) -> None:
    """Goes quiet for 4.5 s in external_call with a 5 s TTL, then a pause past the TTL is taken over."""
    task = spec("bursty", 5 * S)
    first = await ledger.claim(task, "w1", now=start)
    await ledger.renew(first, reason="checking", stage=Stage.PREFLIGHT, now=start + S)
    await ledger.renew(first, reason="calling", stage=Stage.EXTERNAL_CALL, now=start + 2 * S)
    await ledger.renew(first, reason="still calling", now=start + 6500 * S / 1000)
    # Paused now: the lease lapses at +11.5 s and a second worker takes over at +12 s.
    second = await ledger.claim(task, "w2", now=start + 12 * S)
    await ledger.renew(second, reason="calling again", stage=Stage.EXTERNAL_CALL, now=start + 13 * S)
    await ledger.settle(second, receipt(start), now=start + 14 * S)


async def test_the_advice_follows_the_recorded_gaps(ledger: Ledger) -> None:
    base = await ledger.db_now()
    for n in range(3):
        await steady_call(ledger, base + n * 20 * S)
    await bursty_call(ledger, base + 100 * S)

    advice = {a.tool: a for a in advise(await read_samples(ledger))}
    steady, bursty = advice["steady"], advice["bursty"]

    assert (steady.current_ttl_s, steady.gaps.count, steady.gaps.p99, steady.gaps.max) == (10.0, 12, 1.0, 1.0)
    assert [s.stage for s in steady.stages] == ["none", "preflight", "external_call", "verify"]
    assert steady.recommended_ttl_s == 2.0 and steady.warnings == []
    [current, recommended] = steady.options
    assert (current.ttl_s, current.recovery_after_crash_s, current.pause_expiry_chance) == (10.0, 11.0, 0.0)
    assert recommended.ttl_s == 2.0 and round(current.renewals_per_minute) == 45  # 3 renewals in 4 s

    assert bursty.current_ttl_s == 5.0
    assert bursty.gaps.max == 4.5  # the quiet spell in external_call before the pause
    external = next(s for s in bursty.stages if s.stage == "external_call")
    assert (external.gaps.max, external.expiries) == (4.5, 1)
    assert bursty.recommended_ttl_s == 9.0  # 2 x p99 (4.5 s)
    assert len(bursty.warnings) == 1 and "up to 4.5s" in bursty.warnings[0]
    assert [round(o.pause_expiry_chance, 2) for o in bursty.options] == [0.0, 0.0]


async def test_the_advisor_reads_one_tool_since_a_time(ledger: Ledger) -> None:
    base = await ledger.db_now()
    await steady_call(ledger, base)
    await bursty_call(ledger, base + 100 * S)
    only = advise(await read_samples(ledger, tool="steady"))
    assert [a.tool for a in only] == ["steady"]
    later = advise(await read_samples(ledger, since=base + 50 * S))
    assert [a.tool for a in later] == ["bursty"]
    assert since_argument("30m", base) == base - 30 * 60 * S
    assert since_argument("2026-12-01T00:00:00+00:00", base).isoformat() == "2026-12-01T00:00:00+00:00"
