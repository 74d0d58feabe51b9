"""The benchmark's workflow: one chain of tool calls, shared by the plain and the leased side.

Both sides run this same workflow type with the same activity options (those of
:func:`agentlease.workflow._options.leased_activity_options` for the bench tool), so Temporal does the same
work for each call; only the activity behind ``batch.activity`` differs. Kept apart from the
activities so that the workflow sandbox imports nothing but records and options.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ConfigDict, Field

    from agentlease.enums import TaskStatus
    from agentlease.records import ToolCall, ToolInfo, ToolOutcome, idempotency_key_for, task_id_for
    from agentlease.workflow._options import leased_activity_options

BENCH_WORKFLOW = "agentlease.bench.ToolCalls"


class BenchBatch(BaseModel):
    """Input of :class:`ToolCallsWorkflow`.

    Attributes:
        activity: the activity type each call runs (the plain activity or the leased tool).
        tool: the declaration whose lease bounds give the activity options of both sides.
        calls: how many calls to make, one after the other, like the steps of an agent run.
    """

    model_config = ConfigDict(frozen=True)

    activity: str
    tool: ToolInfo
    calls: int = Field(ge=1)


@workflow.defn(name=BENCH_WORKFLOW)
class ToolCallsWorkflow:
    @workflow.run
    async def run(self, batch: BenchBatch) -> int:
        """Run ``batch.calls`` calls in order. Returns how many settled."""
        run_id = workflow.info().workflow_id
        options = leased_activity_options(batch.tool)
        settled = 0
        for index in range(batch.calls):
            step_id = f"call-{index}"
            call = ToolCall(
                task_id=task_id_for(run_id, step_id),
                agent_run_id=run_id,
                step_id=step_id,
                tool=batch.tool.name,
                arguments={"index": index},
                idempotency_key=idempotency_key_for(run_id, step_id),
            )
            outcome = await workflow.execute_activity(
                batch.activity,
                call,
                heartbeat_timeout=options.heartbeat_timeout,
                start_to_close_timeout=options.start_to_close_timeout,
                retry_policy=options.retry_policy,
                result_type=ToolOutcome,
            )
            settled += outcome.status is TaskStatus.SETTLED
        return settled
