"""A worker that does not serve a run's tools fails only its own workflow task, with a clear error;
a worker of the queue that serves them then runs the run (``docs/limits.md``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.runtime import Runtime, TelemetryConfig

from agentlease.enums import RunState, TaskStatus
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker
from tests.eventually import assert_eventually
from tests.integration.conftest import client, settings  # noqa: F401
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(120)

RUN_TIMEOUT_S = 60.0


@asynccontextmanager
async def builtins_only_worker(client: Client, settings: AgentLeaseSettings) -> AsyncIterator[None]:  # noqa: F811
    """A worker of the queue that serves the built-in tools only (not the test tools)."""
    own = await Client.connect(
        client.service_client.config.target_host,
        data_converter=pydantic_data_converter,
        runtime=Runtime(telemetry=TelemetryConfig()),
        identity="worker-builtins-only",
    )
    async with opened_ledger(settings) as ledger:
        worker = build_worker(own, ledger, load_registry(), settings, identity="worker-builtins-only")
        async with worker:
            yield


async def _failed_tasks(handle: WorkflowHandle[object, RunStatus]) -> list[str]:
    history = await handle.fetch_history()
    return [
        event.workflow_task_failed_event_attributes.failure.message
        for event in history.events
        if event.HasField("workflow_task_failed_event_attributes")
    ]


async def test_a_worker_without_the_run_tools_fails_only_its_workflow_task(
    client: Client,  # noqa: F811
    settings: AgentLeaseSettings,  # noqa: F811
) -> None:
    from tests.integration.test_builtin_tools import serving

    run_id = f"tools-{uuid.uuid4().hex[:10]}"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="s", tool="quick")])
    async with builtins_only_worker(client, settings):
        handle = await client.start_workflow(
            "AgentRunWorkflow", plan, id=run_id, task_queue=settings.task_queue, result_type=RunStatus
        )
        await assert_eventually(
            lambda: _failed_tasks(handle), timeout=RUN_TIMEOUT_S, message="the worker fails its workflow task"
        )
    [message, *_] = await _failed_tasks(handle)
    assert "this worker does not serve tool(s) quick" in message, message
    assert "waits up to 30s for a worker of its task queue that does" in message, message
    async with serving(client, settings, "worker-with-tools"):
        result = await asyncio.wait_for(handle.result(), timeout=RUN_TIMEOUT_S)
    assert result.status == RunState.COMPLETED, result
    assert [t.status for t in result.tasks] == [TaskStatus.SETTLED]


async def test_a_run_no_worker_serves_fails_after_the_patience(
    client: Client,  # noqa: F811
    settings: AgentLeaseSettings,  # noqa: F811
) -> None:
    run_id = f"tools-{uuid.uuid4().hex[:10]}"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="s", tool="quick")])
    async with builtins_only_worker(client, settings):
        handle = await client.start_workflow(
            "AgentRunWorkflow", plan, id=run_id, task_queue=settings.task_queue, result_type=RunStatus
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=RUN_TIMEOUT_S)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "UnknownTool", cause
    assert "every worker of a task queue must serve the same AGENTLEASE_TOOL_MODULES" in cause.message
