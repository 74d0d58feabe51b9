"""Leased tool calls on the real Temporal dev server (G1-G5, G9, G10)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY as METRICS
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from agentlease.decisions.table import CancelRequest
from agentlease.enums import EventKind, RecoveryAction, SideEffectClass, Stage, TaskStatus
from agentlease.errors import LeaseLostError
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import (
    AgentRunPlan,
    LeaseEvent,
    PlanStep,
    RunStatus,
    SettlementReceipt,
    TaskSpec,
    ToolCall,
    idempotency_key_for,
    task_id_for,
)
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import ToolRegistry, load_registry
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration import tools

pytestmark = pytest.mark.timeout(120)

REGISTRY = load_registry(["tests.integration.tools"])
WORKER_SHUTDOWN_BOUND_S = 30.0
"""How long a test's in-process worker is given to shut down before the test goes on without it."""


def renewed_stages(events: Iterable[LeaseEvent]) -> list[Stage | None]:
    """The stages a task's renewals recorded, in order, a repeat counted once (a stage that outlasts a third of
    the TTL on a loaded machine renews twice)."""
    return [stage for stage, _ in itertools.groupby(e.stage for e in events if e.kind is EventKind.RENEWED)]


@asynccontextmanager
async def opened_ledger(settings: AgentLeaseSettings) -> AsyncIterator[Ledger]:
    """The ledger of ``settings``, migrated; closed afterwards."""
    ledger = Ledger.from_url(settings.ledger_url)
    try:
        await upgrade(ledger.database)
        yield ledger
    finally:
        await ledger.close()


@asynccontextmanager
async def _worker(
    client: Client,
    ledger: Ledger,
    settings: AgentLeaseSettings,
    identity: str,
    slots: int = 10,
    registry: ToolRegistry = REGISTRY,
) -> AsyncIterator[Worker]:
    """An in-process worker serving ``registry`` (default the tools of ``tests.integration.tools``) with a client of
    its own: the SDK allows one worker per task queue and runtime, so each simulated worker host gets its own
    runtime, like a separate process."""
    own_client = await Client.connect(
        client.service_client.config.target_host,
        data_converter=pydantic_data_converter,
        runtime=Runtime(telemetry=TelemetryConfig()),
        identity=identity,
    )
    worker = build_worker(
        own_client,
        ledger,
        registry,
        settings.model_copy(update={"max_concurrent_activities": slots}),
        identity=identity,
    )
    running = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        # Under load Temporal's core has been seen to wait past 120 s for a poll after its shutdown began (a
        # race in its graceful poll shutdown, temporalio/sdk-rust#1197): bounded here, where the worker's
        # shutdown is not what a test checks (tests/integration/test_sqlite_shutdown.py checks it).
        shutdown = asyncio.ensure_future(worker.shutdown())
        done, _ = await asyncio.wait({shutdown}, timeout=WORKER_SHUTDOWN_BOUND_S)
        if done:
            shutdown.result()
            await running


def _plan(run_id: str, *steps: tuple[str, str, dict], keep_open: bool = False) -> AgentRunPlan:
    return AgentRunPlan(
        agent_run_id=run_id,
        steps=[PlanStep(step_id=s, tool=t, arguments=a) for s, t, a in steps],
        keep_open=keep_open,
    )


def _worker_process(settings: AgentLeaseSettings, identity: str, **extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "AGENTLEASE_TEMPORAL_ADDRESS": settings.temporal_address,
        "AGENTLEASE_TASK_QUEUE": settings.task_queue,
        "AGENTLEASE_LEDGER_URL": settings.ledger_url,
        "AGENTLEASE_TOOL_MODULES": "tests.integration.tools",
        "AGENTLEASE_WORKER_IDENTITY": identity,
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "agentlease.cli.app", "worker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def test_paused_holder_cannot_renew_settle_or_overwrite(client: Client, settings: AgentLeaseSettings) -> None:
    """The seeds' operational test: A is held past its lease, B takes over with generation 2 and settles."""
    run_id = f"op-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/write"
    async with AsyncExitStack() as stack:
        ledger, ledger_a, ledger_b = [await stack.enter_async_context(opened_ledger(settings)) for _ in "oab"]
        await stack.enter_async_context(_worker(client, ledger_a, settings, "worker-A", slots=1))
        stack.callback(tools.gate(task_id).set)  # Whatever happens, A's held attempt ends before A stops.
        handle = await client.start_workflow(
            AgentRunWorkflow.run, _plan(run_id, ("write", "held_write", {})), id=run_id, task_queue=settings.task_queue
        )

        async def claimed_by_a() -> None:
            records = await ledger.list_tasks(run_id)
            assert len(records) == 1
            [record] = records
            assert (record.lease_owner, record.claim_generation, record.stage) == ("worker-A", 1, Stage.EXTERNAL_CALL)

        await assert_eventually(claimed_by_a, timeout=20, message="worker A holds generation 1")
        # A's only slot is busy with the held attempt, so Temporal's retry goes to B.
        await stack.enter_async_context(_worker(client, ledger_b, settings, "worker-B"))
        stack.callback(tools.gate(task_id).set)
        result = await asyncio.wait_for(handle.result(), timeout=60)

        assert result.status == "completed"
        [view] = result.tasks
        assert (view.status, view.claim_generation) == ("settled", 2)
        record = await ledger.get_task(task_id)
        assert (record.status, record.claim_generation, record.lease_owner) == (TaskStatus.SETTLED, 2, "worker-B")
        b_receipt = record.receipt
        assert b_receipt is not None and b_receipt.details["owner"] == "worker-B"

        tools.gate(task_id).set()  # A resumes.

        async def a_result_recorded_late() -> None:
            kinds = [(e.kind, e.claim_generation) for e in await ledger.events(task_id)]
            assert (EventKind.LATE_UNAPPLIED, 1) in kinds

        await assert_eventually(a_result_recorded_late, timeout=20, message="A's late result recorded")

    a_probe, b_probe = tools.PROBES[task_id]
    assert isinstance(a_probe["renew_error"], LeaseLostError)
    assert a_probe["renew_error"].current_generation == 2
    # G4: both attempts used the run/step key, whatever Temporal's activity id.
    assert a_probe["idempotency_key"] == b_probe["idempotency_key"] == f"{run_id}:write"
    assert b_probe["previous_stage"] == Stage.EXTERNAL_CALL

    async with opened_ledger(settings) as ledger:
        record = await ledger.get_task(task_id)
        stored = await ledger.receipt(f"{run_id}:write")
        trail = await ledger.events(task_id)
    # B's settlement stands: A overwrote nothing.
    assert (record.status, record.claim_generation, record.receipt) == (TaskStatus.SETTLED, 2, b_receipt)
    assert stored is not None and stored.claim_generation == 2 and stored.receipt == b_receipt
    summary = [(e.kind, e.claim_generation, e.lease_owner) for e in trail]
    assert summary[:2] == [(EventKind.CLAIMED, 1, "worker-A"), (EventKind.RENEWED, 1, "worker-A")]
    assert (EventKind.EXPIRED, 1, "worker-A") in summary
    assert (EventKind.CLAIMED, 2, "worker-B") in summary
    assert (EventKind.SETTLED, 2, "worker-B") in summary
    assert (EventKind.LEASE_LOST, 1, "worker-A") in summary
    assert (EventKind.LATE_UNAPPLIED, 1, "worker-A") in summary
    expired = next(e for e in trail if e.kind is EventKind.EXPIRED)
    assert expired.stage is Stage.EXTERNAL_CALL and "superseded by generation 2" in (expired.reason or "")
    assert all(e.trace.workflow_id == run_id for e in trail if e.kind is not EventKind.EXPIRED)
    assert {e.trace.attempt for e in trail if e.kind is EventKind.CLAIMED} == {1, 2}


async def test_stage_survives_heartbeat_throttling(client: Client, settings: AgentLeaseSettings) -> None:
    """G5: three stages inside one heartbeat throttle window, then the worker process dies.

    The ledger recorded `commit` before the work of that stage; Temporal's heartbeat copy (throttled,
    latest only) never got that far. The next attempt reads `commit` from the ledger.
    """
    run_id = f"throttle-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/die"
    async with opened_ledger(settings) as ledger:
        dying = _worker_process(settings, "worker-dying")
        handle = await client.start_workflow(
            AgentRunWorkflow.run,
            _plan(run_id, ("die", "die_after_commit", {})),
            id=run_id,
            task_queue=settings.task_queue,
        )
        _, stderr = await asyncio.to_thread(dying.communicate, timeout=60)
        assert dying.returncode == 17, stderr.decode()[-2000:]
        record = await ledger.get_task(task_id)
        assert (record.status, record.stage, record.claim_generation) == (TaskStatus.RUNNING, Stage.COMMIT, 1)
        assert renewed_stages(await ledger.events(task_id)) == [Stage.PREFLIGHT, Stage.EXTERNAL_CALL, Stage.COMMIT]

        async with _worker(client, ledger, settings, "worker-next"):
            result = await asyncio.wait_for(handle.result(), timeout=60)
        [view] = result.tasks
        assert (view.status, view.claim_generation) == ("settled", 2)
        history = await handle.fetch_history()
        [completed] = [
            e.activity_task_completed_event_attributes
            for e in history.events
            if e.HasField("activity_task_completed_event_attributes")
        ]
        [outcome] = await pydantic_data_converter.decode(completed.result.payloads)
        assert outcome["result"]["previous_stage"] == "commit"
        seen = outcome["result"]["temporal_heartbeat_details"]
        # Temporal kept only what the throttle let through: its copy never reached `commit`.
        assert seen is None or seen["stage"] != "commit"


@workflow.defn(name="NoHeartbeatTimeoutWorkflow")
class NoHeartbeatTimeoutWorkflow:
    """Schedules a leased tool the wrong way: without a heartbeat timeout."""

    @workflow.run
    async def run(self, call: ToolCall) -> str:
        await workflow.execute_activity(
            "quick",
            call,
            task_queue=workflow.info().task_queue.removesuffix("-wf"),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        return "ran"


async def test_tool_call_without_heartbeat_timeout_is_refused(client: Client, settings: AgentLeaseSettings) -> None:
    """G9: the activity refuses, non-retryably, before claiming anything."""
    async with opened_ledger(settings) as ledger:
        async with (
            _worker(client, ledger, settings, "worker-g9"),
            Worker(
                client,
                task_queue=settings.task_queue + "-wf",
                workflows=[NoHeartbeatTimeoutWorkflow],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ),
        ):
            call = ToolCall(
                task_id="g9/step",
                agent_run_id="g9",
                step_id="step",
                tool="quick",
                arguments={},
                idempotency_key="g9:step",
            )
            with pytest.raises(WorkflowFailureError) as info:
                await client.execute_workflow(
                    NoHeartbeatTimeoutWorkflow.run,
                    call,
                    id=f"g9-{uuid.uuid4().hex[:8]}",
                    task_queue=settings.task_queue + "-wf",
                )
        cause = info.value.cause
        assert isinstance(cause, ActivityError)
        assert isinstance(cause.cause, ApplicationError)
        assert cause.cause.type == "MissingHeartbeatTimeout"
        assert "heartbeat_timeout" in cause.cause.message
        assert await ledger.list_tasks() == []


async def test_submit_close_and_status(client: Client, settings: AgentLeaseSettings) -> None:
    """`submit` adds tool calls, its validator rejects bad ones, `close` ends the run, `status` reports."""
    run_id = f"open-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger:
        async with _worker(client, ledger, settings, "worker-open"):
            handle = await client.start_workflow(
                AgentRunWorkflow.run,
                _plan(run_id, ("first", "quick", {}), keep_open=True),
                id=run_id,
                task_queue=settings.task_queue,
            )

            async def first_settled() -> None:
                status = await handle.query("status", result_type=RunStatus)
                assert status.tasks[0].status == "settled"

            await assert_eventually(first_settled, timeout=30, message="first step settled")
            for bad, reason in [
                (PlanStep(step_id="x", tool="no_such_tool"), "unknown tool 'no_such_tool'"),
                (PlanStep(step_id="first", tool="quick"), "step id 'first' is already used"),
            ]:
                with pytest.raises(WorkflowUpdateFailedError) as rejected:
                    await handle.execute_update("submit", bad)
                assert reason in str(rejected.value.cause)
            view = await handle.execute_update("submit", PlanStep(step_id="second", tool="gated"), result_type=None)
            assert view["task_id"] == f"{run_id}/second"
            await handle.signal("close")

            async def closed() -> None:
                assert (await handle.query("status", result_type=RunStatus)).closed

            await assert_eventually(closed, timeout=10, message="the run took the close signal")
            with pytest.raises(WorkflowUpdateFailedError) as rejected:
                await handle.execute_update("submit", PlanStep(step_id="late", tool="quick"))
            assert "is closed" in str(rejected.value.cause)
            tools.gate(f"{run_id}/second").set()
            result = await asyncio.wait_for(handle.result(), timeout=30)
            assert result.status == "completed"
            assert [(t.step_id, t.status, t.claim_generation, t.attempts) for t in result.tasks] == [
                ("first", "settled", 1, 1),
                ("second", "settled", 1, 1),
            ]
            assert all(t.receipt is not None and t.stage is Stage.SETTLED for t in result.tasks)
        # Rejected updates left no trace in the history.
        history = await handle.fetch_history()
        accepted = [e for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
        assert len(accepted) == 1


async def test_permanent_error_dead_letters_and_waits(client: Client, settings: AgentLeaseSettings) -> None:
    """A dead-lettered task waits for a person; cancelling it lets the run go on."""
    run_id = f"dead-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger:
        async with _worker(client, ledger, settings, "worker-dead"):
            handle = await client.start_workflow(
                AgentRunWorkflow.run,
                _plan(run_id, ("bad", "always_permanent", {}), ("after", "quick", {})),
                id=run_id,
                task_queue=settings.task_queue,
            )

            async def waiting() -> None:
                status = await handle.query("status", result_type=RunStatus)
                assert status.status == "waiting"
                assert [(t.step_id, t.status) for t in status.tasks] == [("bad", "dead_lettered"), ("after", "pending")]
                assert (status.tasks[0].claim_generation, status.tasks[0].attempts) == (1, 1)

            await assert_eventually(waiting, timeout=30, message="the run waits on its dead-lettered step")
            record = await ledger.get_task(f"{run_id}/bad")
            assert (record.status, record.attempts, record.error_class) == (TaskStatus.DEAD_LETTERED, 1, "permanent")
            await handle.execute_update("cancel", CancelRequest(step_id="bad", by="ops", reason="bad request"))
            result = await asyncio.wait_for(handle.result(), timeout=30)
        assert result.status == "completed"
        assert [(t.step_id, t.status) for t in result.tasks] == [("bad", "cancelled"), ("after", "settled")]


async def test_sigterm_releases_running_tools_with_reason_shutdown(
    client: Client, settings: AgentLeaseSettings
) -> None:
    run_id = f"term-{uuid.uuid4().hex[:8]}"
    task_id = f"{run_id}/wait"
    async with opened_ledger(settings) as ledger:
        proc = _worker_process(settings, "worker-term", AGENTLEASE_SHUTDOWN_GRACE="1")
        await client.start_workflow(
            AgentRunWorkflow.run, _plan(run_id, ("wait", "wait_forever", {})), id=run_id, task_queue=settings.task_queue
        )

        async def running() -> None:
            records = await ledger.list_tasks(run_id)
            assert len(records) == 1
            [record] = records
            assert (record.status, record.stage) == (TaskStatus.RUNNING, Stage.PREFLIGHT)

        try:
            await assert_eventually(running, timeout=30, message="the tool is running")
        except AssertionError:
            proc.kill()
            raise AssertionError(proc.communicate()[1].decode()[-3000:]) from None
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, stderr.decode()[-2000:]
        record = await ledger.get_task(task_id)
        assert (record.status, record.error_class, record.lease_owner) == (TaskStatus.RELEASED, "shutdown", None)
        assert (record.claim_generation, record.attempts) == (1, 0)  # a shutdown is not a real attempt
        assert record.stage is Stage.PREFLIGHT
        await client.get_workflow_handle(run_id).terminate("test over")


async def test_an_early_failure_does_not_erase_commit(client: Client, settings: AgentLeaseSettings) -> None:
    """G6 across attempts: attempt 2 failing in preflight leaves `commit`, so attempt 3 reads back first."""
    run_id = f"regress-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger:
        async with _worker(client, ledger, settings, "worker-regress"):
            result = await client.execute_workflow(
                AgentRunWorkflow.run,
                _plan(run_id, ("write", "commit_then_fail_early", {})),
                id=run_id,
                task_queue=settings.task_queue,
            )
        assert [(t.status, t.claim_generation) for t in result.tasks] == [("settled", 3)]
        probes = tools.PROBES[f"{run_id}/write"]
        assert [(p["previous_stage"], p["recovery"]) for p in probes] == [
            (None, RecoveryAction.RUN),
            (Stage.COMMIT, RecoveryAction.READ_BACK_FIRST),
            (Stage.COMMIT, RecoveryAction.READ_BACK_FIRST),
        ]


async def test_worker_counts_duplicate_deliveries_and_settlement_latency(
    client: Client, settings: AgentLeaseSettings
) -> None:
    """A step the ledger already settled does not run again and counts as a duplicate delivery; a
    step that passes through commit observes its settlement latency (agentlease.observability.metrics)."""
    run_id = f"metrics-{uuid.uuid4().hex[:8]}"
    done = TaskSpec(
        task_id=task_id_for(run_id, "done"),
        agent_run_id=run_id,
        step_id="done",
        tool="quick",
        side_effect_class=SideEffectClass.READ_ONLY,
        idempotency_key=idempotency_key_for(run_id, "done"),
        lease_ttl=timedelta(seconds=5),
    )
    unscoped = {"namespace": "", "task_queue": ""}  # a ledger opened outside a worker
    duplicates = ("agentlease_duplicate_deliveries_total", {**unscoped, "tool": "quick", "reason": "settled"})
    latency = ("agentlease_settlement_latency_seconds_count", {**unscoped, "tool": "held_write"})
    before = [METRICS.get_sample_value(*sample) or 0.0 for sample in (duplicates, latency)]
    async with opened_ledger(settings) as ledger:
        earlier = await ledger.claim(done, "earlier-worker")
        receipt = SettlementReceipt(
            external_system="earlier", external_id="1", status="ok", verified_at=datetime.now(UTC)
        )
        await ledger.settle(earlier, receipt)
        async with _worker(client, ledger, settings, "worker-metrics"):
            result = await client.execute_workflow(
                AgentRunWorkflow.run,
                _plan(run_id, ("done", "quick", {}), ("write", "held_write", {"hold_first_attempt": False})),
                id=run_id,
                task_queue=settings.task_queue,
            )
    after = [METRICS.get_sample_value(*sample) or 0.0 for sample in (duplicates, latency)]
    assert [(t.step_id, t.status, t.claim_generation) for t in result.tasks] == [
        ("done", "settled", 1),
        ("write", "settled", 1),
    ]
    assert result.tasks[0].receipt == receipt
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
