"""Running one built-in tool step on a real worker and reading how its task ended (security tests)."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client, WorkflowHandle

from agentlease.enums import StepStatus
from agentlease.records import AgentRunPlan, PlanStep, RunStatus, TaskView
from agentlease.settings import AgentLeaseSettings
from tests.eventually import assert_eventually

RUN_TIMEOUT_S = 30.0


async def start_step(
    client: Client, settings: AgentLeaseSettings, tool: str, arguments: dict[str, Any]
) -> WorkflowHandle[Any, RunStatus]:
    """Start a run of one step ``s`` of ``tool`` with ``arguments`` on ``settings``' queue."""
    run_id = f"sec-{uuid.uuid4().hex[:10]}"
    plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id="s", tool=tool, arguments=arguments)])
    return await client.start_workflow(
        "AgentRunWorkflow", plan, id=run_id, task_queue=settings.task_queue, result_type=RunStatus
    )


async def step_ends(handle: WorkflowHandle[Any, RunStatus], *statuses: StepStatus | str) -> TaskView:
    """Poll the run's ``status`` query until its step ``s`` is in one of ``statuses``; the step's view."""
    seen: list[TaskView] = []

    async def ended() -> bool:
        status = await handle.query("status", result_type=RunStatus)
        seen[:] = status.tasks
        return bool(status.tasks) and status.tasks[0].status in statuses

    await assert_eventually(ended, timeout=RUN_TIMEOUT_S, message=f"step s ends {statuses}: {seen}")
    return seen[0]
