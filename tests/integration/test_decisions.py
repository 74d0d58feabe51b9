"""Human decisions on the real dev server: approve / reject, reconcile, redrive, cancel (G7, G8),
and the validators that reject a decision a task is not waiting for."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError

from agentlease.cli.app import _run_status
from agentlease.decisions.table import CancelRequest, DecisionRequest, ReconcileRequest
from agentlease.enums import DecisionKind, EventKind, RecoveryAction, SideEffectClass, Stage, TaskStatus
from agentlease.errors import LeaseLostError, TaskClosedError
from agentlease.ledger.store import Ledger
from agentlease.records import RunStatus, SettlementReceipt, TaskSpec
from agentlease.recovery._sweeper import ExpiredLeaseSweeper
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration import tools
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

pytestmark = pytest.mark.timeout(120)


@asynccontextmanager
async def running(
    client: Client, settings: AgentLeaseSettings, *steps: tuple[str, str, dict]
) -> AsyncIterator[tuple[WorkflowHandle, Ledger, str]]:
    run_id = f"dec-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-dec"):
        handle = await client.start_workflow(
            AgentRunWorkflow.run, _plan(run_id, *steps), id=run_id, task_queue=settings.task_queue
        )
        yield handle, ledger, run_id


async def wait_for(handle: WorkflowHandle, step_id: str, status: str) -> RunStatus:
    async def check() -> RunStatus:
        current = await handle.query("status", result_type=RunStatus)
        [view] = [t for t in current.tasks if t.step_id == step_id]
        assert view.status == status, current
        return current

    return await assert_eventually(check, timeout=40, message=f"{step_id} is {status}")


async def refused(handle: WorkflowHandle, update: str, payload: object, reason: str) -> None:
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await handle.execute_update(update, payload)
    assert reason in str(info.value.cause), info.value.cause


def _logged(record: logging.LogRecord) -> str:
    """A log record's message with its exception's type and text."""
    exc = record.exc_info[1] if record.exc_info else None
    return f"{record.getMessage()} {type(exc).__name__ if exc else ''} {getattr(exc, 'type', '')} {exc or ''}"


def decision_events(trail: list, kind: EventKind) -> list:
    return [e for e in trail if e.kind is kind]


async def test_unsafe_tool_waits_for_approval_and_approve_twice_is_refused(
    client: Client, settings: AgentLeaseSettings
) -> None:
    async with running(
        client, settings, ("first", "quick", {}), ("mail", "send_once", {"hold_first_attempt": False})
    ) as (handle, ledger, run):
        status = await wait_for(handle, "mail", "awaiting_approval")
        assert (status.status, (await ledger.get_task(f"{run}/mail")).status) == (
            "waiting",
            TaskStatus.AWAITING_APPROVAL,
        )
        # A settled task takes no decision.
        await refused(handle, "redrive", DecisionRequest(step_id="first", by="ops", reason="x"), "it is settled")
        await refused(handle, "cancel", CancelRequest(step_id="first", by="ops", reason="x"), "it is settled")
        await refused(handle, "approve", DecisionRequest(step_id="nope", by="ops", reason="x"), "has no step 'nope'")
        with pytest.raises((WorkflowUpdateFailedError, RPCError)):  # malformed: no `by`
            await handle.execute_update("approve", {"step_id": "mail", "reason": "x"})
        assert (await ledger.get_task(f"{run}/mail")).status is TaskStatus.AWAITING_APPROVAL
        await refused(
            handle, "redrive", DecisionRequest(step_id="mail", by="ops", reason="x"), "not blocked or dead_lettered"
        )
        await refused(
            handle,
            "reconcile",
            ReconcileRequest(step_id="mail", by="ops", reason="x", action="abandon"),
            "not needs_reconciliation",
        )
        await handle.execute_update("approve", DecisionRequest(step_id="mail", by="alice", reason="ticket OPS-1"))
        await refused(
            handle, "approve", DecisionRequest(step_id="mail", by="alice", reason="again"), "not awaiting_approval"
        )
        result = await asyncio.wait_for(handle.result(), timeout=30)
        trail = await ledger.events(f"{run}/mail")
    assert [(t.step_id, t.status) for t in result.tasks] == [("first", "settled"), ("mail", "settled")]
    history = await handle.fetch_history()
    accepted = [e for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
    assert len(accepted) == 1  # only the one valid approval; every refusal left no history
    [approved] = decision_events(trail, EventKind.APPROVED)
    assert (approved.details or {})["by"] == "alice" and approved.reason == "ticket OPS-1"
    # The approval came before the only claim.
    kinds = [e.kind for e in trail]
    assert kinds.index(EventKind.APPROVED) < kinds.index(EventKind.CLAIMED)


async def test_reject_never_runs_the_tool(client: Client, settings: AgentLeaseSettings) -> None:
    async with running(
        client, settings, ("mail", "send_once", {"hold_first_attempt": False}), ("after", "quick", {})
    ) as (handle, ledger, run):
        await wait_for(handle, "mail", "awaiting_approval")
        await handle.execute_update("reject", DecisionRequest(step_id="mail", by="bob", reason="wrong recipient"))
        result = await asyncio.wait_for(handle.result(), timeout=30)
        trail = await ledger.events(f"{run}/mail")
        record = await ledger.get_task(f"{run}/mail")
    assert [(t.step_id, t.status) for t in result.tasks] == [("mail", "rejected"), ("after", "settled")]
    assert record.status is TaskStatus.REJECTED and record.claim_generation == 0
    assert decision_events(trail, EventKind.CLAIMED) == []


@pytest.mark.parametrize("action", ["confirm", "retry", "abandon"])
async def test_ambiguous_unsafe_send_waits_for_reconciliation(
    client: Client, settings: AgentLeaseSettings, action: str
) -> None:
    """G7: after external_call an unsafe tool is never retried without a decision."""
    async with running(client, settings, ("mail", "send_once", {"hold_first_attempt": True})) as (handle, ledger, run):
        await wait_for(handle, "mail", "awaiting_approval")
        await handle.execute_update("approve", DecisionRequest(step_id="mail", by="alice", reason="go"))
        status = await wait_for(handle, "mail", "needs_reconciliation")
        [view] = status.tasks
        assert (view.stage, view.claim_generation) == (Stage.EXTERNAL_CALL, 1)
        record = await ledger.get_task(f"{run}/mail")
        assert (record.status, record.claim_generation) == (TaskStatus.NEEDS_RECONCILIATION, 1)
        assert len(tools.PROBES[f"{run}/mail"]) == 1  # not retried automatically
        with pytest.raises((WorkflowUpdateFailedError, RPCError)):
            await handle.execute_update(  # malformed: confirm without the external id
                "reconcile", {"step_id": "mail", "by": "alice", "reason": "seen", "action": "confirm"}
            )
        await refused(
            handle, "approve", DecisionRequest(step_id="mail", by="alice", reason="x"), "not awaiting_approval"
        )
        payload = ReconcileRequest(
            step_id="mail",
            by="alice",
            reason="checked the mail server log",
            action=action,
            external_id="msg-42@mx" if action == "confirm" else None,
            observed={"queue_id": "4F2A"} if action == "confirm" else {},
        )
        await handle.execute_update("reconcile", payload)
        result = await asyncio.wait_for(handle.result(), timeout=30)
        record = await ledger.get_task(f"{run}/mail")
        trail = await ledger.events(f"{run}/mail")
    [view] = result.tasks
    [reconciled] = decision_events(trail, EventKind.RECONCILED)
    assert (reconciled.details or {})["decision"] == action and (reconciled.details or {})["by"] == "alice"
    probes = tools.PROBES[f"{run}/mail"]
    if action == "confirm":
        assert (view.status, record.status) == ("settled", TaskStatus.SETTLED)
        assert record.receipt is not None and record.receipt.external_id == "msg-42@mx"
        assert record.receipt.details["observed"] == {"queue_id": "4F2A"}
        assert len(probes) == 1
    elif action == "retry":
        assert (view.status, record.status, record.claim_generation) == ("settled", TaskStatus.SETTLED, 2)
        assert [p["idempotency_key"] for p in probes] == [f"{run}:mail"] * 2
        assert probes[1]["recovery"] is RecoveryAction.RETRY_SAME_KEY
    else:
        assert (view.status, record.status, record.receipt) == ("abandoned", TaskStatus.ABANDONED, None)
        assert len(probes) == 1


async def test_blocked_on_credential_then_redriven(client: Client, settings: AgentLeaseSettings) -> None:
    async with running(client, settings, ("cred", "needs_credential", {})) as (handle, ledger, run):
        await wait_for(handle, "cred", "blocked")
        assert (await ledger.get_task(f"{run}/cred")).error_class == "credential"
        tools.CREDENTIALS_OK[f"{run}/cred"] = True  # access repaired
        await handle.execute_update("redrive", DecisionRequest(step_id="cred", by="ops", reason="token rotated"))
        result = await asyncio.wait_for(handle.result(), timeout=30)
        await refused_after_end(handle)
    assert [(t.step_id, t.status, t.claim_generation) for t in result.tasks] == [("cred", "settled", 2)]


async def refused_after_end(handle: WorkflowHandle) -> None:
    with pytest.raises((WorkflowUpdateFailedError, RPCError)):
        await handle.execute_update("redrive", DecisionRequest(step_id="cred", by="ops", reason="again"))


async def test_dead_letter_after_real_attempts_then_cancel_stays_cancelled(
    client: Client, settings: AgentLeaseSettings, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(client, settings, ("flaky", "always_retryable", {})) as (handle, ledger, run):
        status = await wait_for(handle, "flaky", "dead_lettered")
        assert status.tasks[0].attempts == 2
        # The tool's own failures are warnings; the dead letter is a recorded decision (BENIGN, not logged).
        warned = [_logged(r) for r in caplog.records if r.levelno >= logging.WARNING and run in r.getMessage()]
        assert warned and not any("DeadLettered" in text for text in warned), warned
        await handle.execute_update("redrive", DecisionRequest(step_id="flaky", by="ops", reason="upstream fixed?"))
        status = await wait_for(handle, "flaky", "dead_lettered")  # still failing: two more real attempts
        assert status.tasks[0].claim_generation == 4
        await handle.execute_update("cancel", CancelRequest(step_id="flaky", by="ops", reason="give up"))
        with pytest.raises((WorkflowUpdateFailedError, RPCError)):  # cancelled (or the run already ended)
            await handle.execute_update("redrive", DecisionRequest(step_id="flaky", by="ops", reason="x"))
        result = await asyncio.wait_for(handle.result(), timeout=30)
        record = await ledger.get_task(f"{run}/flaky")
    assert result.tasks[0].status == "cancelled" and record.status is TaskStatus.CANCELLED


async def test_cancel_during_external_call(client: Client, settings: AgentLeaseSettings) -> None:
    """G8: the old generation cannot settle, and expiry never undoes the cancel."""
    async with running(client, settings, ("export", "long_call", {}), ("after", "quick", {})) as (handle, ledger, run):
        task_id = f"{run}/export"

        async def in_external_call() -> None:
            assert tools.PROBES.get(task_id)
            assert (await ledger.get_task(task_id)).stage is Stage.EXTERNAL_CALL

        await assert_eventually(in_external_call, timeout=30, message="the export is running")

        async def status_shows_the_heartbeat() -> None:
            # `agentlease status`: the workflow's view, with the running attempt's latest heartbeat.
            shown = await _run_status(settings, run)
            assert (shown.tasks[0].status, shown.tasks[0].stage, shown.tasks[0].claim_generation) == (
                "running",
                Stage.EXTERNAL_CALL,
                1,
            ), shown

        await assert_eventually(status_shows_the_heartbeat, timeout=15, message="status shows stage and generation")
        status = await handle.execute_update(
            "cancel", CancelRequest(step_id="export", by="carol", reason="customer withdrew"), result_type=RunStatus
        )
        # The update answers once the ledger recorded the cancel; an idempotent write inside external_call may
        # have acted at the downstream, so the task is cancelled with its effect unknown (G11).
        assert status.tasks[0].status == "cancelled_effect_unknown"
        result = await asyncio.wait_for(handle.result(), timeout=30)
        old = tools.PROBES[task_id][0]["claim"]
        receipt = SettlementReceipt(
            external_system="x", external_id="late", status="present", verified_at=old.acquired_at
        )
        with pytest.raises(LeaseLostError):
            await ledger.settle(old, receipt)
        later = old.expires_at + 10 * old.lease_ttl
        assert (await ExpiredLeaseSweeper(ledger).run_once(now=later)).examined == 0
        spec = TaskSpec(
            task_id=task_id,
            agent_run_id=run,
            step_id="export",
            tool="long_call",
            side_effect_class=SideEffectClass.IDEMPOTENT,
            idempotency_key=old.idempotency_key,
            lease_ttl=old.lease_ttl,
        )
        with pytest.raises(TaskClosedError):
            await ledger.claim(spec, "someone", now=later)
        record = await ledger.get_task(task_id)
        trail = await ledger.events(task_id)
        await refused_cancel_of_settled(handle)
    assert [(t.step_id, t.status) for t in result.tasks] == [
        ("export", "cancelled_effect_unknown"),
        ("after", "settled"),
    ]
    assert (record.status, record.receipt) == (TaskStatus.CANCELLED_EFFECT_UNKNOWN, None)
    [cancelled] = decision_events(trail, EventKind.CANCELLED)
    assert (cancelled.details or {})["by"] == "carol" and cancelled.reason == "customer withdrew"


async def refused_cancel_of_settled(handle: WorkflowHandle) -> None:
    with pytest.raises((WorkflowUpdateFailedError, RPCError)):
        await handle.execute_update("cancel", CancelRequest(step_id="after", by="ops", reason="too late"))


async def test_cancel_of_an_unsafe_call_past_external_call_is_marked_effect_unknown(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """G8 with G7's signal kept: the cancel stands (never claimed again, expiry never undoes it), and the
    task says its effect is unknown until a person records what happened, which leaves it cancelled."""
    async with running(client, settings, ("send", "unsafe_long_call", {}), ("after", "quick", {})) as (
        handle,
        ledger,
        run,
    ):
        task_id = f"{run}/send"

        async def sending() -> None:
            assert [r.stage for r in await ledger.list_tasks(run) if r.task_id == task_id] == [Stage.EXTERNAL_CALL]

        await assert_eventually(sending, timeout=30, message="the message may be on its way")
        status = await handle.execute_update(
            "cancel", CancelRequest(step_id="send", by="carol", reason="wrong recipient"), result_type=RunStatus
        )
        assert status.tasks[0].status == TaskStatus.CANCELLED_EFFECT_UNKNOWN.value
        result = await asyncio.wait_for(handle.result(), timeout=30)
        record = await ledger.get_task(task_id)
        trail = await ledger.events(task_id)

        # The run goes on and completes: a cancel is final for the run, whatever the effect.
        assert result.status == "completed"
        assert [(t.step_id, t.status.value) for t in result.tasks] == [
            ("send", "cancelled_effect_unknown"),
            ("after", "settled"),
        ]
        assert (record.status, record.stage, record.lease_owner) == (
            TaskStatus.CANCELLED_EFFECT_UNKNOWN,
            Stage.EXTERNAL_CALL,
            None,
        )
        [cancelled] = decision_events(trail, EventKind.CANCELLED)
        assert cancelled.details == {"by": "carol", "decision": "cancel", "effect": "unknown"}
        spec = TaskSpec(
            task_id=task_id,
            agent_run_id=run,
            step_id="send",
            tool="unsafe_long_call",
            side_effect_class=SideEffectClass.UNSAFE,
            idempotency_key=f"{run}:send",
            lease_ttl=record.lease_ttl,
        )
        with pytest.raises(TaskClosedError):  # G8: no attempt runs it again
            await ledger.claim(spec, "someone")

        # Recording what happened does not undo the cancel.
        confirmed = await ledger.decide(
            task_id,
            DecisionKind.CONFIRM_EFFECT,
            by="carol",
            reason="the MTA log shows it delivered",
            receipt=SettlementReceipt(
                external_system="reconciliation",
                external_id="<m-1@mx>",
                status="confirmed",
                verified_at=record.updated_at,
            ),
        )
        assert (confirmed.status, confirmed.stage) == (TaskStatus.CANCELLED, Stage.EXTERNAL_CALL)
        stored = await ledger.receipt(f"{run}:send")
        assert stored is not None and stored.receipt.external_id == "<m-1@mx>"
        with pytest.raises(TaskClosedError):
            await ledger.decide(task_id, DecisionKind.ABANDON_EFFECT, by="carol", reason="twice")


async def test_cancel_of_a_task_waiting_for_reconciliation_keeps_its_signal(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """A pending needs_reconciliation cancelled: cancelled, and still marked effect unknown."""
    async with running(client, settings, ("mail", "send_once", {"hold_first_attempt": True})) as (handle, ledger, run):
        await wait_for(handle, "mail", "awaiting_approval")
        await handle.execute_update("approve", DecisionRequest(step_id="mail", by="alice", reason="ok"))
        await wait_for(handle, "mail", "needs_reconciliation")
        await handle.execute_update("cancel", CancelRequest(by="alice", reason="customer left"), result_type=RunStatus)
        result = await asyncio.wait_for(handle.result(), timeout=30)
        record = await ledger.get_task(f"{run}/mail")
    assert result.status == "cancelled"
    assert record.status is TaskStatus.CANCELLED_EFFECT_UNKNOWN
    assert result.tasks[0].status == "cancelled_effect_unknown"
