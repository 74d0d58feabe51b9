"""Finding 3: a claim rebuilt from what an operator sees (``tasks --json``, the trail) cannot write.

The attacker reads owner and generation of a running lease from the ledger's listings and builds a
:class:`~agentlease.records.Claim` of their own; the ledger refuses every holder write with it and
records the refusal, and the real holder (who alone has the lease token) still renews and settles.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from agentlease.enums import EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.errors import LeaseLostError
from agentlease.ledger.store import Ledger
from agentlease.records import Claim, SettlementReceipt, TaskSpec, idempotency_key_for, task_id_for
from agentlease.tools._context import LeaseHeartbeat

TTL = timedelta(minutes=5)


def _spec() -> TaskSpec:
    run = f"victim-{uuid.uuid4().hex[:8]}"
    return TaskSpec(
        task_id=task_id_for(run, "send"),
        agent_run_id=run,
        step_id="send",
        tool="smtp_send",
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=idempotency_key_for(run, "send"),
        lease_ttl=TTL,
    )


def _forged(listed: dict, events: list) -> Claim:
    """A claim made of what ``agentlease tasks --json`` and ``agentlease events`` print."""
    claimed = next(e for e in events if e.kind is EventKind.CLAIMED)
    return Claim(
        task_id=listed["task_id"],
        tool=listed["tool"],
        generation=listed["claim_generation"],
        owner=listed["lease_owner"],
        acquired_at=datetime.fromisoformat(listed["lease_acquired_at"]),
        expires_at=datetime.fromisoformat(listed["lease_expires_at"]),
        lease_ttl=TTL,
        attempts=listed["attempts"],
        previous_stage=None,
        previous_error_class=None,
        idempotency_key=listed["idempotency_key"],
        trace=claimed.trace,
    )


def _receipt(external_id: str) -> SettlementReceipt:
    return SettlementReceipt(
        external_system="smtp", external_id=external_id, status="sent", verified_at=datetime.now(UTC)
    )


async def test_a_claim_rebuilt_from_listings_cannot_renew_settle_or_release(ledger: Ledger) -> None:
    spec = _spec()
    real = await ledger.claim(spec, "worker-a")
    [listed] = [t.as_json() for t in await ledger.list_tasks(spec.agent_run_id)]
    shown = f"{listed} {[e.model_dump(mode='json') for e in await ledger.events(spec.task_id)]} {real!r}"
    forged = _forged(listed, await ledger.events(spec.task_id))
    before = await ledger.get_task(spec.task_id)

    with pytest.raises(LeaseLostError, match="lease token"):
        await ledger.renew(forged, reason="forged renewal", stage=Stage.EXTERNAL_CALL)
    with pytest.raises(LeaseLostError, match="lease token"):
        await ledger.settle(forged, _receipt("forged"))
    with pytest.raises(LeaseLostError, match="lease token"):
        await ledger.release(forged, error_class="retryable", error="forged release")
    assert await ledger.get_task(spec.task_id) == before  # nothing changed

    refusals = [
        e for e in await ledger.events(spec.task_id) if e.kind in (EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED)
    ]
    assert [(e.details or {})["operation"] for e in refusals] == ["renew", "settle", "release"], refusals
    assert all("lease token" in (e.reason or "") for e in refusals), refusals

    # The holder, who alone received the token, still holds the lease.
    await ledger.renew(real, reason="sending", stage=Stage.EXTERNAL_CALL)
    stored = await ledger.settle(real, _receipt("msg-1"))
    assert stored.receipt.external_id == "msg-1"
    assert (await ledger.get_task(spec.task_id)).status is TaskStatus.SETTLED

    # The token is shown nowhere: not in listings, the trail, the claim's repr or its JSON dump,
    # nor in the heartbeat details an attempt sends to Temporal.
    token = real.lease_token.get_secret_value()
    assert len(token) >= 40
    shown += f" {[e.model_dump(mode='json') for e in await ledger.events(spec.task_id)]} {real.model_dump_json()}"
    assert token not in shown
    assert set(LeaseHeartbeat.model_fields) == {"task_id", "claim_generation", "stage", "reason", "lease_expires_at"}


async def test_a_guessed_token_is_refused_and_each_claim_mints_its_own(ledger: Ledger) -> None:
    spec = _spec()
    first = await ledger.claim(spec, "worker-a")
    guessed = first.model_copy(update={"lease_token": SecretStr("A" * 43)})
    with pytest.raises(LeaseLostError, match="lease token"):
        await ledger.renew(guessed, reason="guessing")
    await ledger.release(first, error_class="retryable", error="503")
    second = await ledger.claim(spec, "worker-a")
    assert second.lease_token.get_secret_value() != first.lease_token.get_secret_value()
    # The previous claim's token does not carry over to the new generation.
    stale = second.model_copy(update={"lease_token": first.lease_token})
    with pytest.raises(LeaseLostError):
        await ledger.renew(stale, reason="old token")
    await ledger.renew(second, reason="holder renews")
