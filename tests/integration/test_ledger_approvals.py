"""Approvals bound to one execution, checked by the ledger at the claim, on SQLite and PostgreSQL.

An approval names the task, its tool and the fingerprint of the arguments the person saw; the claim of an
approval-gated task (its ``TaskSpec`` carries the tool's ``approval_ttl``) consumes it, on the ledger's
clock, in the claim statement. Every test injects time (``base = await ledger.db_now()``), never sleeps.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from agentlease.enums import DecisionKind, ErrorClass, EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.errors import ApprovalRefusedError, LeaseHeldError, TaskClosedError
from agentlease.ledger.store import Ledger
from agentlease.observability.metrics import APPROVALS
from agentlease.records import TaskSpec, arguments_fingerprint, idempotency_key_for, task_id_for
from agentlease.recovery._policy import decide

TTL = timedelta(seconds=30)
APPROVAL_TTL = timedelta(minutes=10)
SECOND = timedelta(seconds=1)
A: dict[str, Any] = {"to": ["ops@example.com"], "subject": "refund A-1", "body": "100 EUR"}
B: dict[str, Any] = {"to": ["ops@example.com"], "subject": "refund A-1", "body": "100000 EUR"}


def gated(run: str, arguments: dict[str, Any], *, approval_ttl: timedelta | None = APPROVAL_TTL) -> TaskSpec:
    """The task of step ``send`` of ``run`` with ``arguments``, as an approval-gated tool's claim makes it."""
    return TaskSpec(
        task_id=task_id_for(run, "send"),
        agent_run_id=run,
        step_id="send",
        tool="smtp_send",
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=idempotency_key_for(run, "send"),
        lease_ttl=TTL,
        arguments_sha256=arguments_fingerprint(arguments),
        approval_ttl=approval_ttl,
    )


def seen_by_person(spec: TaskSpec) -> TaskSpec:
    """The same task as the run's decisions name it (no approval TTL: decisions do not claim)."""
    return spec.model_copy(update={"approval_ttl": None})


def refusals(events: list) -> list:
    return [e for e in events if e.kind is EventKind.APPROVAL_REFUSED]


def approvals(outcome: str) -> float:
    return sum(
        sample.value
        for metric in APPROVALS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("outcome") == outcome
    )


async def ask_and_approve(ledger: Ledger, spec: TaskSpec, *, now: datetime) -> None:
    await ledger.decide(spec.task_id, DecisionKind.AWAIT_APPROVAL, by="agentlease", reason="gated", spec=spec, now=now)
    await ledger.decide(spec.task_id, DecisionKind.APPROVE, by="alice", reason="looks right", spec=spec, now=now)


async def test_an_approval_of_arguments_a_does_not_run_arguments_b(ledger: Ledger) -> None:
    run = f"run-{uuid.uuid4().hex[:10]}"
    a, b = gated(run, A), gated(run, B)
    base = await ledger.db_now()
    mismatched = approvals("mismatched")
    await ask_and_approve(ledger, seen_by_person(a), now=base)

    with pytest.raises(ApprovalRefusedError) as refused:
        await ledger.claim(b, "w1", now=base + SECOND)
    assert refused.value.outcome == "mismatched" and "changed arguments need a new approval" in refused.value.why
    record = await ledger.get_task(a.task_id)
    assert (record.status, record.claim_generation, record.lease_owner) == (TaskStatus.AWAITING_APPROVAL, 0, None)
    [line] = refusals(await ledger.events(a.task_id))
    assert line.reason == refused.value.why
    assert line.details is not None and line.details["refused"] == "mismatched"
    assert line.details["approved_arguments_sha256"] == a.arguments_sha256
    assert line.details["arguments_sha256"] == b.arguments_sha256
    assert approvals("mismatched") == mismatched + 1

    # The person sees B and approves it: B runs, once.
    await ledger.decide(b.task_id, DecisionKind.APPROVE, by="alice", reason="B it is", spec=seen_by_person(b), now=base)
    claim = await ledger.claim(b, "w1", now=base + 2 * SECOND)
    assert claim.generation == 1 and claim.approval_remaining == APPROVAL_TTL - 2 * SECOND
    [claimed] = [e for e in await ledger.events(b.task_id) if e.kind is EventKind.CLAIMED]
    assert claimed.details is not None and claimed.details["approval"]["arguments_sha256"] == b.arguments_sha256
    assert "consumed the approval" in (claimed.reason or "")


async def test_an_expired_approval_is_refused_at_the_claim_with_one_line(ledger: Ledger) -> None:
    run = f"run-{uuid.uuid4().hex[:10]}"
    spec = gated(run, A)
    base = await ledger.db_now()
    await ask_and_approve(ledger, seen_by_person(spec), now=base)

    late = base + APPROVAL_TTL  # expiry itself is already too late, on the ledger's clock
    with pytest.raises(ApprovalRefusedError) as refused:
        await ledger.claim(spec, "w1", now=late)
    assert refused.value.outcome == "expired" and "expired at" in refused.value.why
    events = await ledger.events(spec.task_id)
    [line] = refusals(events)
    assert line.reason is not None and line.reason.startswith("approval refused at the claim: the approval given at ")
    assert "approve it again" in line.reason
    assert [e.kind for e in events] == [
        EventKind.AWAITING_APPROVAL,
        EventKind.APPROVED,
        EventKind.APPROVAL_REFUSED,
    ]
    assert (await ledger.get_task(spec.task_id)).status is TaskStatus.AWAITING_APPROVAL

    # Approved again, it runs; just inside the TTL is in time.
    await ledger.decide(
        spec.task_id, DecisionKind.APPROVE, by="alice", reason="still right", spec=seen_by_person(spec), now=late
    )
    claim = await ledger.claim(spec, "w1", now=late + APPROVAL_TTL - SECOND)
    assert claim.generation == 1


async def test_a_claim_without_any_approval_sends_the_task_to_a_person(ledger: Ledger) -> None:
    """A workflow of its own that skips the approval: the ledger refuses the claim, nothing runs."""
    spec = gated(f"run-{uuid.uuid4().hex[:10]}", A)
    with pytest.raises(ApprovalRefusedError) as refused:
        await ledger.claim(spec, "w1")
    assert refused.value.outcome == "missing"
    record = await ledger.get_task(spec.task_id)
    assert (record.status, record.claim_generation) == (TaskStatus.AWAITING_APPROVAL, 0)
    assert [e.kind for e in await ledger.events(spec.task_id)] == [EventKind.APPROVAL_REFUSED]


async def test_a_consumed_approval_never_authorises_a_second_execution(ledger: Ledger) -> None:
    """The approved attempt reaches external_call and times out: the next claim is granted without a new
    approval, consumes none, and the recovery policy (not the approval) decides: reconcile (G7)."""
    spec = gated(f"run-{uuid.uuid4().hex[:10]}", A)
    base = await ledger.db_now()
    await ask_and_approve(ledger, seen_by_person(spec), now=base)
    first = await ledger.claim(spec, "w1", now=base + SECOND)
    await ledger.renew(first, reason="sending", stage=Stage.EXTERNAL_CALL, now=base + 2 * SECOND)
    await ledger.release(first, error_class=ErrorClass.TIMED_OUT, error="timed out", now=base + 3 * SECOND)

    second = await ledger.claim(spec, "w2", now=base + 4 * SECOND)
    assert (second.generation, second.previous_stage, second.approval_remaining) == (2, Stage.EXTERNAL_CALL, None)
    [_, claimed] = [e for e in await ledger.events(spec.task_id) if e.kind is EventKind.CLAIMED]
    assert claimed.details is not None and claimed.details["approval"] == {"consumed_by_generation": 1}
    assert "follows the recovery policy" in (claimed.reason or "")
    decision = decide(
        SideEffectClass.UNSAFE,
        second.previous_stage,
        receipt_present=False,
        error_class=ErrorClass.parse(second.previous_error_class),
        real_attempts=second.attempts - 1,
        max_attempts=5,
    )
    assert not decision.action.runs_tool and decision.action.value == "reconcile"
    assert refusals(await ledger.events(spec.task_id)) == []

    # Approving again is not possible: the approval belongs to a task that is no longer waiting for one.
    with pytest.raises(TaskClosedError):
        await ledger.decide(spec.task_id, DecisionKind.APPROVE, by="mallory", reason="again", spec=seen_by_person(spec))


async def test_a_valid_approval_does_not_hide_a_held_lease(ledger: Ledger) -> None:
    """A second claim while the approved attempt holds its lease is LeaseHeld, not an approval refusal."""
    spec = gated(f"run-{uuid.uuid4().hex[:10]}", A)
    base = await ledger.db_now()
    await ask_and_approve(ledger, seen_by_person(spec), now=base)
    await ledger.claim(spec, "w1", now=base + SECOND)
    with pytest.raises(LeaseHeldError):
        await ledger.claim(spec, "w2", now=base + 2 * SECOND)
    assert refusals(await ledger.events(spec.task_id)) == []
