"""A long agent run continues as new without losing its steps, its decisions or its status query.

The plan's ``continue_as_new_after`` makes the run continue as new every 10 steps, so 30 steps run in
3 Temporal runs of one workflow id (an open run then continues once more, to wait for more steps);
``docs/limits.md``, "Steps per run and history".
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError

from agentlease.enums import RunState, TaskStatus
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.settings import AgentLeaseSettings
from tests.eventually import assert_eventually
from tests.integration.conftest import client, settings  # noqa: F401
from tests.integration.test_builtin_tools import serving

pytestmark = pytest.mark.timeout(180)

RUN_TIMEOUT_S = 120.0


async def test_thirty_steps_across_three_runs(client: Client, settings: AgentLeaseSettings) -> None:  # noqa: F811
    run_id = f"can-{uuid.uuid4().hex[:10]}"
    steps = [PlanStep(step_id=f"s{i:02d}", tool="quick") for i in range(30)]
    # Step 25 waits for approval in the third Temporal run: a decision after continue-as-new.
    steps[25] = PlanStep(step_id="s25", tool="send_once", arguments={"hold_first_attempt": False})
    plan = AgentRunPlan(agent_run_id=run_id, steps=steps, keep_open=True, continue_as_new_after=10)
    async with serving(client, settings, "worker-can"):
        handle = await client.start_workflow(
            "AgentRunWorkflow", plan, id=run_id, task_queue=settings.task_queue, result_type=RunStatus
        )

        async def awaits_approval() -> bool:
            status = await handle.query("status", result_type=RunStatus)
            return {t.step_id: t.status for t in status.tasks}.get("s25") == TaskStatus.AWAITING_APPROVAL

        await assert_eventually(awaits_approval, timeout=RUN_TIMEOUT_S, message="s25 awaits approval")
        await handle.execute_update("approve", {"step_id": "s25", "by": "sam", "reason": "after two runs"})

        async def thirty_settled() -> bool:
            status = await handle.query("status", result_type=RunStatus)
            return [t.status for t in status.tasks] == [TaskStatus.SETTLED] * 30

        await assert_eventually(thirty_settled, timeout=RUN_TIMEOUT_S, message="all 30 settle")

        # Still open, in the Temporal run after the third: a submitted step runs, then close ends the run.
        # The new run refuses a step (its validator, nothing recorded) until it has loaded its tools.
        async def submit_extra() -> None:
            try:
                await handle.execute_update("submit", {"step_id": "extra", "tool": "quick", "arguments": {}})
            except WorkflowUpdateFailedError as refused:
                if "is still starting; submit again in a moment" in str(refused.cause):
                    raise AssertionError(f"not yet: {refused.cause}") from refused
                raise

        await assert_eventually(submit_extra, timeout=RUN_TIMEOUT_S, message="the open run takes a submitted step")
        await handle.signal("close")
        result = await asyncio.wait_for(handle.result(), timeout=RUN_TIMEOUT_S)
        runs = [execution async for execution in client.list_workflows(f"WorkflowId = '{run_id}'")]
    assert result.status == RunState.COMPLETED, result
    assert [t.step_id for t in result.tasks] == [s.step_id for s in steps] + ["extra"]
    assert all(t.status == TaskStatus.SETTLED and t.receipt is not None for t in result.tasks), result
    assert {t.step_id: t.claim_generation for t in result.tasks}["s05"] == 1
    # Three Temporal runs of 10 steps each, and a fourth in which the open run waited for more steps.
    assert len(runs) == 4, [(r.run_id, r.status) for r in runs]
