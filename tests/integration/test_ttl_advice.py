"""The TTL advisor on a ledger filled with known renewal histories (injected time, no sleeps)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from agentlease.enums import EventKind, SideEffectClass, Stage
from agentlease.errors import LeaseLostError
from agentlease.ledger.store import Ledger
from agentlease.records import SettlementReceipt, TaskSpec
from agentlease.recovery.ttl_advice import MIN_GAPS, EventSample, advise, read_samples, since_argument

S = timedelta(seconds=1)

STEADY_CALLS = 6
"""Calls of ``steady`` a recommendation is made from: 4 gaps each, 24 in all (>= MIN_GAPS)."""


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
    """Renews every second through three stages, settles at +4 s (TTL 10 s): 4 gaps of 1 s."""
    task = spec("steady", 10 * S)
    claim = await ledger.claim(task, "w1", now=start)
    for offset, stage in ((1, Stage.PREFLIGHT), (2, Stage.EXTERNAL_CALL), (3, Stage.VERIFY)):
        await ledger.renew(claim, reason=f"{stage.value} work", stage=stage, now=start + offset * S)
    await ledger.settle(claim, receipt(start), now=start + 4 * S)


async def steady_calls(ledger: Ledger, start: datetime, calls: int = STEADY_CALLS) -> None:
    for n in range(calls):
        await steady_call(ledger, start + n * 20 * S)


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


async def quick_call(ledger: Ledger, start: datetime) -> None:
    """``quick`` (TTL 3 s): renews every half second through its stages, settles at +2 s."""
    task = spec("quick", 3 * S)
    claim = await ledger.claim(task, "w1", now=start)
    for offset, stage in ((0.5, Stage.PREFLIGHT), (1, Stage.EXTERNAL_CALL), (1.5, Stage.VERIFY)):
        await ledger.renew(claim, reason=f"{stage.value} work", stage=stage, now=start + offset * S)
    await ledger.settle(claim, receipt(start), now=start + 2 * S)


async def paused_quick_call(ledger: Ledger, start: datetime) -> None:
    """``quick`` paused for 6 s in external_call: taken over at +5 s, and the paused holder comes
    back at +7 s: its renewal is refused (``lease_lost``). It was alive all along."""
    task = spec("quick", 3 * S)
    first = await ledger.claim(task, "w1", now=start)
    await ledger.renew(first, reason="calling", stage=Stage.EXTERNAL_CALL, now=start + S)
    second = await ledger.claim(task, "w2", now=start + 5 * S)
    await ledger.settle(second, receipt(start), now=start + 6 * S)
    with pytest.raises(LeaseLostError):
        await ledger.renew(first, reason="still calling", now=start + 7 * S)


async def test_the_advice_follows_the_recorded_gaps(ledger: Ledger) -> None:
    base = await ledger.db_now()
    await steady_calls(ledger, base)
    advice = {a.tool: a for a in advise(await read_samples(ledger))}
    steady = advice["steady"]

    assert (steady.current_ttl_s, steady.leases, steady.gaps.count, steady.gaps.p99, steady.gaps.max) == (
        10.0,
        STEADY_CALLS,
        4 * STEADY_CALLS,
        1.0,
        1.0,
    )
    assert [(s.stage, s.gaps.count) for s in steady.stages] == [
        ("none", STEADY_CALLS),
        ("preflight", STEADY_CALLS),
        ("external_call", STEADY_CALLS),
        ("verify", STEADY_CALLS),
    ]
    assert steady.recommended_ttl_s == 2.0 and steady.missing_samples == 0 and steady.warnings == []
    [current, recommended] = steady.options
    assert (current.ttl_s, current.recovery_after_crash_s, current.pause_expiry_chance) == (10.0, 11.0, 0.0)
    assert (recommended.ttl_s, recommended.recovery_after_crash_s) == (2.0, 3.0)
    assert not hasattr(current, "renewals_per_minute")  # a tool's renewal cadence is no cost of its TTL


async def test_no_recommendation_from_fewer_gaps_than_the_minimum(ledger: Ledger) -> None:
    base = await ledger.db_now()
    await bursty_call(ledger, base)
    await steady_calls(ledger, base + 100 * S, calls=MIN_GAPS // 4 - 1)  # 4 gaps short
    advice = {a.tool: a for a in advise(await read_samples(ledger))}
    bursty, steady = advice["bursty"], advice["steady"]

    assert (bursty.gaps.count, bursty.leases, bursty.recommended_ttl_s) == (5, 2, None)
    assert bursty.missing_samples == MIN_GAPS - 5
    assert [o.ttl_s for o in bursty.options] == [5.0]  # the current TTL only
    assert bursty.gaps.max == 4.5  # the quiet spell in external_call before the pause
    external = next(s for s in bursty.stages if s.stage == "external_call")
    # The paused holder never came back: a lapse, not evidence that it was alive.
    assert (external.gaps.max, external.expiries, external.lapsed_alive) == (4.5, 1, 0)
    assert len(bursty.warnings) == 1 and "up to 4.5s" in bursty.warnings[0]
    assert (steady.gaps.count, steady.recommended_ttl_s, steady.missing_samples) == (MIN_GAPS - 4, None, 4)


async def test_a_tool_whose_holder_came_back_after_its_lease_lapsed_is_never_advised_shorter(ledger: Ledger) -> None:
    base = await ledger.db_now()
    for n in range(MIN_GAPS // 4 + 1):  # gaps of 0.5 s alone would recommend the 2 s minimum
        await quick_call(ledger, base + n * 10 * S)
    await paused_quick_call(ledger, base + 100 * S)
    [quick] = advise(await read_samples(ledger))

    assert quick.current_ttl_s == 3.0 and quick.lapsed_alive == 1
    external = next(s for s in quick.stages if s.stage == "external_call")
    assert (external.expiries, external.lapsed_alive) == (1, 1)
    assert quick.gaps.max == 6.0  # from its last renewal to its refused one: the pause it survived
    assert quick.recommended_ttl_s is not None and quick.recommended_ttl_s >= quick.current_ttl_s
    assert quick.recommended_ttl_s == 12.0  # 2 x p99, which for 27 gaps is the 6 s pause
    assert "1 lease(s) lapsed while the holder was alive (1 in external_call)" in quick.warnings[0]


def test_a_lapse_while_alive_keeps_the_current_ttl_as_the_floor() -> None:
    """Even when the window (``--since``) holds only the refused write of the paused holder, not its
    quiet spell: the recommendation from the other gaps is raised to the current TTL."""
    samples = []
    for n in range(MIN_GAPS):
        samples += [
            EventSample("quick", f"t{n}", 1, EventKind.CLAIMED, None, n * 10_000, 3_000),
            EventSample("quick", f"t{n}", 1, EventKind.SETTLED, "verify", n * 10_000 + 500, 3_000),
        ]
    samples += [
        EventSample("quick", "paused", 1, EventKind.EXPIRED, "external_call", 500_000, 3_000),
        EventSample("quick", "paused", 1, EventKind.LEASE_LOST, None, 502_000, 3_000),
    ]
    [quick] = advise(samples)
    assert (quick.gaps.count, quick.gaps.max, quick.lapsed_alive) == (MIN_GAPS, 0.5, 1)
    assert quick.recommended_ttl_s == 3.0  # not the 2 s the gaps alone give


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


def test_a_since_duration_of_non_ascii_digits_is_not_a_duration() -> None:
    """``"²"`` is a digit to ``str.isdigit``: ``²s`` is refused as text that is neither a duration nor a time,
    not read as a duration that reaches past the calendar."""
    with pytest.raises(ValueError, match="isoformat"):
        since_argument("²s", datetime(2026, 12, 6, tzinfo=UTC))
