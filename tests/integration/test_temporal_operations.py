"""Temporal's own activity operations against leased tool calls, with the temporal CLI on the dev server:
``temporal activity pause / unpause / reset / update-options`` (the operator's tools beside agentlease's).

A pause or a reset is not a failure: the attempt it interrupts releases its lease with the cause
(``details.cause``, error class ``paused`` / ``reset``) and gives its attempt back, so the task's
budget of real attempts is what the tool itself used. A reset restarts Temporal's attempt count, never
the claim generation (G3). An ``update-options`` that moves the heartbeat timeout away from the lease
TTL is recorded by the next claim.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import PollerBehaviorSimpleMaximum

from agentlease.enums import ErrorClass, EventKind, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.records import LeaseEvent
from agentlease.runtime.devserver import temporal_binary
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration import tools
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

pytestmark = pytest.mark.timeout(120)


async def temporal_activity(settings: AgentLeaseSettings, handle: WorkflowHandle, command: str, *extra: str) -> None:
    """``temporal activity <command>`` on the run's pending tool call, as an operator types it."""
    [pending] = (await handle.describe()).raw_description.pending_activities
    args = [
        temporal_binary(),
        "activity",
        command,
        "--address",
        settings.temporal_address,
        "--workflow-id",
        handle.id,
        "--activity-id",
        pending.activity_id,
        *extra,
    ]
    done = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"


async def holding(ledger: Ledger, task_id: str, generation: int) -> None:
    records = [r for r in await ledger.list_tasks(task_id.split("/")[0]) if r.task_id == task_id]
    assert records, f"no task {task_id} yet"
    [record] = records
    assert (record.status, record.claim_generation) == (TaskStatus.RUNNING, generation), record
    renewed = [
        e for e in await ledger.events(task_id) if e.kind is EventKind.RENEWED and e.claim_generation == generation
    ]
    assert len(renewed) >= 2, renewed  # past preflight: renewing while it waits


def released(events: list[LeaseEvent]) -> list[tuple[int, str | None, Any]]:
    return [
        (e.claim_generation, (e.reason or "").split(":")[0], (e.details or {}).get("cause"))
        for e in events
        if e.kind is EventKind.RELEASED
    ]


async def test_a_reset_gives_its_attempt_back_and_never_rewinds_the_generation(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """Two real failures of three allowed, then a reset of the running third: it is given back and the
    task settles instead of being dead-lettered; the update-options made before it is recorded (G3)."""
    run_id = f"reset-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/flaky"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-reset"):
        handle = await client.start_workflow(
            AgentRunWorkflow.run,
            _plan(run_id, ("flaky", "fail_twice_then_hold", {})),
            id=run_id,
            task_queue=settings.task_queue,
        )
        await assert_eventually(lambda: holding(ledger, task_id, 3), timeout=30, message="the third attempt holds")
        # The failure the ledger recorded said when to come back: paced by real attempts, not Temporal's backoff.
        [pending] = (await handle.describe()).raw_description.pending_activities
        assert pending.last_failure.application_failure_info.next_retry_delay.ToTimedelta() == timedelta(seconds=2)
        await temporal_activity(settings, handle, "update-options", "--heartbeat-timeout", "7s")
        await temporal_activity(settings, handle, "reset")

        await assert_eventually(lambda: holding(ledger, task_id, 4), timeout=30, message="the reset attempt holds")
        tools.gate(task_id).set()
        result = await asyncio.wait_for(handle.result(), timeout=30)
        record = await ledger.get_task(task_id)
        events = await ledger.events(task_id)

    assert result.status == "completed"
    assert (record.status, record.claim_generation, record.attempts) == (TaskStatus.SETTLED, 4, 3)
    assert released(events) == [(1, "retryable", None), (2, "retryable", None), (3, "reset", "reset")]
    # Temporal started counting again at 1; the ledger's generation went on (G3).
    probes = [(p["generation"], p["attempts"], p["temporal_attempt"]) for p in tools.PROBES[task_id]]
    assert [(generation, attempts) for generation, attempts, _ in probes] == [(1, 1), (2, 2), (3, 3), (4, 3)]
    # (A first attempt after the reset may find the lease still held, the release not written yet.)
    assert [temporal for *_, temporal in probes][:3] == [1, 2, 3] and probes[3][2] < 3, probes
    [claim4] = [e for e in events if e.kind is EventKind.CLAIMED and e.claim_generation == 4]
    assert claim4.details is not None
    assert (claim4.details["heartbeat_timeout_ms"], claim4.details["lease_ttl_ms"]) == (7000, 3000), claim4
    assert "heartbeat timeout (7s) is not the lease TTL (3s)" in (claim4.reason or "")


async def test_a_pause_releases_with_its_cause_and_unpause_resumes(
    client: Client, settings: AgentLeaseSettings
) -> None:
    run_id = f"pause-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/wait"
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-pause"):
        handle = await client.start_workflow(
            AgentRunWorkflow.run, _plan(run_id, ("wait", "gated", {})), id=run_id, task_queue=settings.task_queue
        )
        await assert_eventually(lambda: holding(ledger, task_id, 1), timeout=30, message="the first attempt holds")
        await temporal_activity(settings, handle, "pause")

        async def given_back() -> None:
            record = await ledger.get_task(task_id)
            assert (record.status, record.error_class, record.attempts) == (TaskStatus.RELEASED, "paused", 0), record

        await assert_eventually(given_back, timeout=30, message="the pause released the lease")
        paused = await ledger.events(task_id)
        await temporal_activity(settings, handle, "unpause")
        await assert_eventually(lambda: holding(ledger, task_id, 2), timeout=30, message="unpaused, it runs again")
        tools.gate(task_id).set()
        result = await asyncio.wait_for(handle.result(), timeout=30)
        record = await ledger.get_task(task_id)

    assert released(paused) == [(1, ErrorClass.PAUSED.value, "paused")]
    assert result.status == "completed"
    assert (record.status, record.claim_generation, record.attempts) == (TaskStatus.SETTLED, 2, 1)


async def test_the_worker_applies_its_recovery_settings(client: Client, settings: AgentLeaseSettings) -> None:
    tuned = settings.model_copy(
        update={"sticky_schedule_to_start": timedelta(seconds=2), "activity_pollers": 3, "workflow_pollers": 4}
    )
    async with opened_ledger(settings) as ledger:
        worker = build_worker(client, ledger, load_registry(["tests.integration.tools"]), tuned)
        config = worker.config(active_config=True)  # as its plugins left it
    assert config["sticky_queue_schedule_to_start_timeout"] == timedelta(seconds=2)
    assert config["activity_task_poller_behavior"] == PollerBehaviorSimpleMaximum(3)
    assert config["workflow_task_poller_behavior"] == PollerBehaviorSimpleMaximum(4)
