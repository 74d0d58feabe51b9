"""What a tool or a probe returns is bounded (``docs/limits.md``, "What a tool or a probe returns"), on the real dev
server: a result that cannot be recorded ends its attempt for good, with one line naming the bound, instead of a
settle whose answer Temporal refuses on every retry; a probe's evidence never floods the evidence trail."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import AbstractAsyncContextManager

import pytest
from sqlalchemy import update
from sqlalchemy.engine import Connection
from temporalio.client import Client
from temporalio.worker import Worker

from agentlease import limits
from agentlease.enums import EventKind, SideEffectClass, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import RECEIPTS, TASKS
from agentlease.records import AgentRunPlan, PlanStep, SettlementReceipt
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.bounded_tools import HUGE
from tests.integration.test_lease_on_temporal import _worker as serving
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(120)

REGISTRY = load_registry(["tests.integration.bounded_tools"])

CALL_ENDS_WITHIN_S = 40.0
"""Patience for a call to end: before the bounds, the call with a 3 MiB receipt was retried about once a second,
forever."""


def _worker(client: Client, ledger: Ledger, settings: AgentLeaseSettings) -> AbstractAsyncContextManager[Worker]:
    return serving(client, ledger, settings, "bounds-worker", registry=REGISTRY)


def _plan(run_id: str, *steps: tuple[str, str]) -> AgentRunPlan:
    return AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id=s, tool=t, arguments={}) for s, t in steps])


@pytest.mark.parametrize(("tool", "what"), [("huge_output", "output"), ("huge_receipt", "receipt")])
async def test_result_over_the_bound_ends_its_call_with_one_line(
    client: Client, settings: AgentLeaseSettings, tool: str, what: str
) -> None:
    """A 3 MiB output or receipt is refused before the ledger's settle: the step fails for good (a ``fenced`` tool:
    dead-lettered, as for any permanent failure after its call, and the run waits for a person), its call ends, and
    what was recorded stays. Before the bounds the receipt settled and Temporal refused the answer on every retry
    (the call never ended); the output settled, and the agent never saw it."""
    run_id = f"bounds-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings):
        handle = await client.start_workflow(
            AgentRunWorkflow.run,
            _plan(run_id, ("first", "small_read"), ("report", tool)),
            id=run_id,
            task_queue=settings.task_queue,
        )

        async def call_ended() -> None:
            statuses = {record.step_id: record.status for record in await ledger.list_tasks(run_id)}
            assert statuses.get("report") in (TaskStatus.DEAD_LETTERED, TaskStatus.SETTLED)
            assert not (await handle.describe()).raw_description.pending_activities

        await assert_eventually(call_ended, timeout=CALL_ENDS_WITHIN_S, message="the call ends (no endless retry)")

        first = await ledger.get_task(f"{run_id}/first")
        assert first.status is TaskStatus.SETTLED and first.receipt is not None
        report = await ledger.get_task(f"{run_id}/report")
        assert report.status is TaskStatus.DEAD_LETTERED
        assert report.receipt is None
        assert report.last_error is not None and "\n" not in report.last_error
        bound = limits.MAX_OUTPUT_BYTES if what == "output" else limits.MAX_RECEIPT_BYTES
        assert f"more than {bound} (the bound on a tool's {what})" in report.last_error
        trail = await ledger.events(f"{run_id}/report")
        kinds = [event.kind for event in trail]
        assert EventKind.SETTLED not in kinds
        assert [event.stage for event in trail if event.kind is EventKind.RENEWED][-1] is not None
        assert report.attempts == 1  # refused once, never retried


async def test_unsafe_result_over_the_bound_waits_for_reconciliation(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """An ``unsafe`` call past ``external_call`` whose result cannot be recorded may have sent its message: it is
    never retried blindly (G7), it waits for a person, as for any permanent failure after its call."""
    run_id = f"bounds-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings):
        handle = await client.start_workflow(
            AgentRunWorkflow.run,
            _plan(run_id, ("send", "huge_unsafe_output")),
            id=run_id,
            task_queue=settings.task_queue,
        )

        async def call_ended() -> None:
            assert [record.status for record in await ledger.list_tasks(run_id)] == [TaskStatus.NEEDS_RECONCILIATION]
            assert not (await handle.describe()).raw_description.pending_activities

        await assert_eventually(call_ended, timeout=CALL_ENDS_WITHIN_S, message="the call waits for a person")
        record = await ledger.get_task(f"{run_id}/send")

    assert record.attempts == 1 and record.receipt is None
    assert record.last_error is not None
    assert f"more than {limits.MAX_OUTPUT_BYTES} (the bound on a tool's output)" in record.last_error


async def test_probe_evidence_over_the_bound_is_refused(client: Client, settings: AgentLeaseSettings) -> None:
    """A probe answering with 5 MB of evidence is taken as "cannot tell": the ambiguous call waits for
    reconciliation, and neither its trail entries nor its reason holds the evidence."""
    assert REGISTRY.get("probed_send").side_effect_class is SideEffectClass.UNSAFE
    run_id = f"bounds-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/send"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings):
        await client.start_workflow(
            AgentRunWorkflow.run, _plan(run_id, ("send", "probed_send")), id=run_id, task_queue=settings.task_queue
        )

        async def probed() -> None:
            statuses = [record.status for record in await ledger.list_tasks(run_id)]
            assert statuses in ([TaskStatus.NEEDS_RECONCILIATION], [TaskStatus.SETTLED])

        await assert_eventually(probed, timeout=CALL_ENDS_WITHIN_S, message="the probe answered")
        record = await ledger.get_task(task_id)
        trail = await ledger.events(task_id)

    for event in trail:
        assert len(event.reason or "") <= limits.MAX_REASON_CHARS
        assert len(json.dumps(event.details or {})) <= 2 * limits.MAX_EVIDENCE_BYTES
    assert record.last_error is not None and len(record.last_error) <= limits.MAX_REASON_CHARS
    assert "the bound on a probe's evidence" in record.last_error
    assert record.status is TaskStatus.NEEDS_RECONCILIATION


async def test_a_receipt_stored_over_the_bound_is_read_marked(client: Client, settings: AgentLeaseSettings) -> None:
    """A receipt the ledger kept before the bounds (3 MiB) neither stops a run that reads it again (a call settled
    from it, as after a reset) nor floods a view: it is read without its details, marked, with its size and digest.
    Before, the call settled from it answered 3 MiB, which Temporal refused on every retry."""
    run_id = f"bounds-{uuid.uuid4().hex[:8]}"
    plan = _plan(run_id, ("first", "small_read"))
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings):
        await client.execute_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        huge = SettlementReceipt.now("bounds", "k", "present", report="x" * HUGE).model_dump(mode="json")

        def kept_before_the_bounds(conn: Connection) -> None:
            conn.execute(update(TASKS).where(TASKS.c.agent_run_id == run_id).values(receipt=huge))
            conn.execute(update(RECEIPTS).where(RECEIPTS.c.task_id == f"{run_id}/first").values(receipt=huge))

        await ledger.database.write(kept_before_the_bounds)
        again = await asyncio.wait_for(
            client.execute_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue),
            CALL_ENDS_WITHIN_S,
        )
        record = await ledger.get_task(f"{run_id}/first")
    [step] = again.tasks
    for receipt in (step.receipt, record.receipt):
        assert receipt is not None and receipt.external_system == "bounds"
        assert receipt.details["truncated"] is True and "report" not in receipt.details, receipt.details
        assert receipt.details["stored_bytes"] > limits.MAX_RECEIPT_BYTES
