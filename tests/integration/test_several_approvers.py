"""Several approvers: a tool that asks for two people (``ApprovalRule(approvers=2)``) runs only once two
different people approved the call it shows them, each approval bound like one alone (task, tool, arguments'
fingerprint, ledger clock), one person counting once, and the views showing how many approved so far.

The ledger's rules on SQLite and PostgreSQL, time injected; then a run on the real dev server.
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest
from rich.console import Console
from temporalio.client import Client, WorkflowUpdateFailedError

from agentlease.cli.listings import list_waiting
from agentlease.decisions.table import DecisionRequest
from agentlease.enums import DecisionKind, EventKind, TaskStatus
from agentlease.errors import ApprovalRepeatedError
from agentlease.ledger.store import Ledger
from agentlease.observability.metrics import APPROVALS_EXPIRING
from agentlease.records import ApprovalRequest, RunStatus
from agentlease.recovery._sweeper import ExpiredLeaseSweeper, SweeperSettings
from agentlease.runtime.names import APPLY_DECISION, STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._binding import claimed_refusal
from agentlease.ui.app import ui_app
from tests.integration import approval_tools
from tests.integration.test_bound_approvals import _worker, settings_for, start, waiting_on
from tests.integration.test_lease_on_temporal import opened_ledger
from tests.integration.test_ledger_approvals import APPROVAL_TTL, SECOND, A, gated

pytestmark = pytest.mark.timeout(120)


def two_people(spec_arguments: dict[str, object]) -> ApprovalRequest:
    return ApprovalRequest(tool="smtp_send", arguments=spec_arguments, arguments_sha256="0" * 64, approvals_required=2)


async def test_two_different_people_approve_before_the_claim_may_consume_it(ledger: Ledger) -> None:
    run = f"run-{uuid.uuid4().hex[:10]}"
    spec = gated(run, A)  # as the decision activity passes it: with the tool's approval TTL
    request = two_people(A).model_copy(update={"arguments_sha256": spec.arguments_sha256})
    base = await ledger.db_now()
    await ledger.decide(
        spec.task_id, DecisionKind.AWAIT_APPROVAL, by="agentlease", reason="gated", spec=spec, approval_request=request
    )

    first = await ledger.decide(spec.task_id, DecisionKind.APPROVE, by="alice", reason="ok", spec=spec, now=base)
    assert first.status is TaskStatus.AWAITING_APPROVAL  # one of two: nothing may run yet
    assert first.approval_request is not None and first.approval_request.approved_by == ["alice"]
    assert first.approval_request.expires_at == base + APPROVAL_TTL
    with pytest.raises(ApprovalRepeatedError, match="alice approved it already"):
        await ledger.decide(spec.task_id, DecisionKind.APPROVE, by="alice", reason="again", spec=spec, now=base)

    # Alice's approval lapsed before Bob's: it no longer counts, Bob's is the first of two again.
    late = base + APPROVAL_TTL + SECOND
    second = await ledger.decide(spec.task_id, DecisionKind.APPROVE, by="bob", reason="ok", spec=spec, now=late)
    assert (second.status, second.approval_request and second.approval_request.approved_by) == (
        TaskStatus.AWAITING_APPROVAL,
        ["bob"],
    )
    third = await ledger.decide(
        spec.task_id, DecisionKind.APPROVE, by="carol", reason="ok", spec=spec, now=late + SECOND
    )
    assert third.status is TaskStatus.PENDING
    assert third.approval_request is not None and third.approval_request.approved_by == ["bob", "carol"]
    assert third.approval_request.expires_at == late + APPROVAL_TTL  # the first of the two lapses first

    # The approval lasts as long as Bob's, the first of the two, on the ledger's clock.
    claim = await ledger.claim(spec, "w1", now=late + 2 * SECOND)
    assert claim.generation == 1 and claim.approval_remaining == APPROVAL_TTL - 2 * SECOND
    approved = [e for e in await ledger.events(spec.task_id) if e.kind is EventKind.APPROVED]
    assert [(e.details or {}).get("by") for e in approved] == ["alice", "bob", "carol"]
    assert [(e.details or {})["approval"]["given"] for e in approved] == [1, 1, 2]
    assert {(e.details or {})["approval"]["required"] for e in approved} == {2}


async def test_a_run_waits_for_two_approvers_and_shows_how_many_approved(
    client: Client, settings: AgentLeaseSettings
) -> None:
    settings = settings_for(settings)
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-approvals"):
        handle = await start(client, settings, "two_person_send")
        task_id = f"{handle.id}/send"
        await waiting_on(handle, TaskStatus.AWAITING_APPROVAL)
        alice = DecisionRequest(step_id="send", by="alice", reason="looks right")
        run = await handle.execute_update("approve", alice, result_type=RunStatus)
        assert run.tasks[0].status is TaskStatus.AWAITING_APPROVAL, run  # one of two
        with pytest.raises(WorkflowUpdateFailedError) as again:
            await handle.execute_update("approve", alice, result_type=RunStatus)
        assert "alice approved it already (1 of 2 approvals" in str(again.value.cause)

        shown = await handle.query(STATUS_QUERY, result_type=RunStatus)
        request = shown.tasks[0].approval_request
        assert request is not None and request.approved_by == ["alice"] and request.expires_at is not None, request
        expiry = request.expires_at.isoformat(timespec="seconds")
        assert request.describe().endswith(f"; 1 of 2 approvals (alice), expires at {expiry}"), request
        out = io.StringIO()
        await list_waiting(ledger, limit=None, as_json=False, out=Console(file=out, width=400))
        assert f"1 of 2 approvals (alice), expires at {expiry}" in out.getvalue(), out.getvalue()
        transport = httpx.ASGITransport(app=ui_app(ledger))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            page = (await http.get("/")).text
        assert f"<span class='approvals'>1 of 2 approvals (alice), expires at {expiry}</span>" in page, page
        assert approval_tools.SENT.get(task_id, 0) == 0

        bob = DecisionRequest(step_id="send", by="bob", reason="agreed")
        await handle.execute_update("approve", bob, result_type=RunStatus)
        done = await asyncio.wait_for(handle.result(), 60)
        events = await ledger.events(task_id)

    assert (done.status, done.tasks[0].status) == ("completed", TaskStatus.SETTLED)
    assert approval_tools.SENT[task_id] == 1
    approved = [e for e in events if e.kind is EventKind.APPROVED]
    assert [((e.details or {}).get("by"), (e.details or {})["approval"]["given"]) for e in approved] == [
        ("alice", 1),
        ("bob", 2),
    ]


def expiring(waiting_for: str) -> float:
    return sum(
        sample.value
        for metric in APPROVALS_EXPIRING.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("waiting_for") == waiting_for
    )


async def test_an_approval_about_to_lapse_is_warned_of_once(ledger: Ledger) -> None:
    """The sweeper writes one ``approval_expiring`` entry (and counts it) for an approval not yet consumed that
    lapses within its warning margin: one still waiting for a second person, one approved but not claimed."""
    base = await ledger.db_now()
    pair, alone = gated(f"run-{uuid.uuid4().hex[:10]}", A), gated(f"run-{uuid.uuid4().hex[:10]}", A)
    request = two_people(A).model_copy(update={"arguments_sha256": pair.arguments_sha256})
    for spec, asked in ((pair, request), (alone, None)):
        ask: dict[str, Any] = {"by": "agentlease", "reason": "gated", "spec": spec, "approval_request": asked}
        await ledger.decide(spec.task_id, DecisionKind.AWAIT_APPROVAL, **ask)
        await ledger.decide(spec.task_id, DecisionKind.APPROVE, by="alice", reason="ok", spec=spec, now=base)
    sweeper = ExpiredLeaseSweeper(ledger, SweeperSettings(approval_warning=timedelta(minutes=5)))
    person, claim = expiring("person"), expiring("claim")

    assert (await sweeper.run_once(now=base + timedelta(minutes=4))).approvals_expiring == 0  # 6 minutes left
    soon = base + APPROVAL_TTL - timedelta(minutes=4)
    assert (await sweeper.run_once(now=soon)).approvals_expiring == 2
    assert (await sweeper.run_once(now=soon + SECOND)).approvals_expiring == 0  # once per approval
    assert (expiring("person"), expiring("claim")) == (person + 1, claim + 1)

    [waits_for_bob] = [e for e in await ledger.events(pair.task_id) if e.kind is EventKind.APPROVAL_EXPIRING]
    assert (waits_for_bob.reason or "").startswith("1 of 2 approvals (alice): the first lapses at "), waits_for_bob
    assert "(in 240s, ledger clock)" in (waits_for_bob.reason or "")
    assert waits_for_bob.details is not None and waits_for_bob.details["waiting_for"] == "person"
    [unclaimed] = [e for e in await ledger.events(alone.task_id) if e.kind is EventKind.APPROVAL_EXPIRING]
    assert unclaimed.details is not None and unclaimed.details["waiting_for"] == "claim", unclaimed

    # Consumed, or lapsed: nothing more to warn of.
    await ledger.claim(alone, "w1", now=soon + 2 * SECOND)
    assert (await sweeper.run_once(now=base + APPROVAL_TTL + SECOND)).approvals_expiring == 0


async def test_the_claim_runs_a_two_person_tool_only_on_two_peoples_approvals(ledger: Ledger) -> None:
    """The ledger's last word after the claim: a run that asked one person (a catalog learnt before the tool
    asked for two) gets no execution of a tool that asks for two; one approved by two runs."""
    base = await ledger.db_now()
    asked_one, asked_two = gated(f"run-{uuid.uuid4().hex[:10]}", A), gated(f"run-{uuid.uuid4().hex[:10]}", A)
    for spec, required, people in ((asked_one, 1, ["alice"]), (asked_two, 2, ["alice", "bob"])):
        request = two_people(A).model_copy(
            update={"arguments_sha256": spec.arguments_sha256, "approvals_required": required}
        )
        ask: dict[str, Any] = {"by": "agentlease", "reason": "gated", "spec": spec, "approval_request": request}
        await ledger.decide(spec.task_id, DecisionKind.AWAIT_APPROVAL, **ask)
        for person in people:
            await ledger.decide(spec.task_id, DecisionKind.APPROVE, by=person, reason="ok", spec=spec, now=base)

    one = await ledger.claim(asked_one, "w1", now=base + SECOND)
    why = await claimed_refusal(ledger, one, "smtp_send", requires_approval=True, approvers=2)
    assert why == (
        "tool 'smtp_send' requires approval by 2 different people, and the ledger shows 1 for task "
        f"{asked_one.task_id!r}: it runs only once that many approved it"
    )
    two = await ledger.claim(asked_two, "w1", now=base + SECOND)
    assert await claimed_refusal(ledger, two, "smtp_send", requires_approval=True, approvers=2) is None


async def test_a_single_approvers_request_reaches_the_worker_as_before(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """A rolling upgrade: the request a one-person tool's run sends with ``await_approval`` has only the fields a
    worker from before several approvers reads (its model refuses any other)."""
    settings = settings_for(settings)
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-approvals"):
        handle = await start(client, settings, "quick_send")
        await waiting_on(handle, TaskStatus.AWAITING_APPROVAL)
        history = await handle.fetch_history()
        await handle.cancel()

    sent = [
        json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data)
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == APPLY_DECISION
    ]
    [asked] = [d for d in sent if d["kind"] == DecisionKind.AWAIT_APPROVAL.value]
    assert set(asked["request"]) == {"tool", "arguments", "arguments_sha256"}, asked


async def test_one_signing_operator_counts_once_whatever_name_they_give(ledger: Ledger) -> None:
    """With authenticated decisions a person is the operator whose key signed: two approvals signed by the same
    key, under two ``--by`` names, are one approval."""
    spec = gated(f"run-{uuid.uuid4().hex[:10]}", A)
    request = two_people(A).model_copy(update={"arguments_sha256": spec.arguments_sha256})
    ask: dict[str, Any] = {"by": "agentlease", "reason": "gated", "spec": spec, "approval_request": request}
    await ledger.decide(spec.task_id, DecisionKind.AWAIT_APPROVAL, **ask)
    signed = {"signed_by": "alice", "signed": {"request": {"proof": {"operator": "alice"}}}}
    await ledger.decide(spec.task_id, DecisionKind.APPROVE, by="alice@laptop", reason="ok", spec=spec, details=signed)
    with pytest.raises(ApprovalRepeatedError, match=r"alice approved it already \(1 of 2 approvals\)"):
        await ledger.decide(spec.task_id, DecisionKind.APPROVE, by="bob?", reason="ok", spec=spec, details=signed)
    record = await ledger.get_task(spec.task_id)
    assert record.status is TaskStatus.AWAITING_APPROVAL
    assert record.approval_request is not None and record.approval_request.approved_by == ["alice"]
