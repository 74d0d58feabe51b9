"""``AgentRunWorkflow``: an agent run whose tool calls are leased activities.

Deterministic orchestration only: the tools, the ledger and every side effect live in
``activities/``. The run learns the worker's tools once (a local activity, recorded in history),
then runs its steps in order, each as a leased activity whose heartbeat timeout is the lease TTL.

Operators and agents talk to a run through:

- query ``status`` -> :class:`RunStatus`;
- update ``submit`` (a :class:`PlanStep`) -> :class:`TaskView`; the validator rejects an unknown tool,
  a duplicate step id or a closed run;
- signal ``close``: no more steps; the run ends after its last task.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from agentlease.enums import FailureType, TaskStatus
    from agentlease.records import (
        AgentRunPlan,
        PlanStep,
        RunStatus,
        TaskView,
        ToolCall,
        ToolInfo,
        ToolOutcome,
        idempotency_key_for,
        task_id_for,
    )
    from workflows.options import leased_activity_options

DESCRIBE_TOOLS = "agentlease.describe_tools"
"""Name of the local activity that returns the worker's tool catalog."""

WORKFLOW_NAME = "AgentRunWorkflow"


class RunState:
    """Run-level statuses reported by ``status``."""

    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


@workflow.defn(name=WORKFLOW_NAME)
class AgentRunWorkflow:
    @workflow.init
    def __init__(self, plan: AgentRunPlan) -> None:
        self._run_id = workflow.info().workflow_id
        self._steps: list[PlanStep] = []
        self._views: dict[str, TaskView] = {}
        self._catalog: dict[str, ToolInfo] | None = None
        self._closed = not plan.keep_open
        self._state = RunState.STARTING
        for step in plan.steps:
            self._add(step)

    @workflow.run
    async def run(self, plan: AgentRunPlan) -> RunStatus:
        catalog = await workflow.execute_local_activity(
            DESCRIBE_TOOLS, start_to_close_timeout=timedelta(seconds=30), result_type=list[ToolInfo]
        )
        self._catalog = {info.name: info for info in catalog}
        unknown = sorted({step.tool for step in self._steps} - set(self._catalog))
        if unknown:
            raise ApplicationError(
                f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(sorted(self._catalog))}",
                type="UnknownTool",
                non_retryable=True,
            )
        self._state = RunState.RUNNING
        index = 0
        while True:
            await workflow.wait_condition(lambda: index < len(self._steps) or self._closed)
            if index >= len(self._steps):
                break
            step = self._steps[index]
            index += 1
            if not await self._execute(step):
                self._state = RunState.FAILED
                self._closed = True
                for rest in self._steps[index:]:
                    self._views[rest.step_id] = self._views[rest.step_id].model_copy(update={"status": "skipped"})
                return self.status()
        self._state = RunState.COMPLETED
        self._closed = True
        return self.status()

    async def _execute(self, step: PlanStep) -> bool:
        """Run one step as a leased activity. Returns whether it settled."""
        assert self._catalog is not None
        info = self._catalog[step.tool]
        view = self._views[step.step_id]
        options = leased_activity_options(info)
        self._views[step.step_id] = view.model_copy(update={"status": TaskStatus.RUNNING.value})
        call = ToolCall(
            task_id=view.task_id,
            agent_run_id=self._run_id,
            step_id=step.step_id,
            tool=step.tool,
            arguments=step.arguments,
            idempotency_key=view.idempotency_key,
        )
        try:
            outcome = await workflow.execute_activity(
                step.tool,
                call,
                heartbeat_timeout=options.heartbeat_timeout,
                start_to_close_timeout=options.start_to_close_timeout,
                retry_policy=options.retry_policy,
                result_type=ToolOutcome,
            )
        except ActivityError as err:
            cause = err.cause
            kind = cause.type if isinstance(cause, ApplicationError) else None
            status = {
                FailureType.DEAD_LETTERED.value: TaskStatus.DEAD_LETTERED.value,
                FailureType.TASK_CANCELLED.value: TaskStatus.CANCELLED.value,
                FailureType.BLOCKED.value: TaskStatus.BLOCKED.value,
                FailureType.NEEDS_RECONCILIATION.value: TaskStatus.NEEDS_RECONCILIATION.value,
            }.get(kind or "", "failed")
            message = cause.message if isinstance(cause, ApplicationError) else str(err)
            self._views[step.step_id] = view.model_copy(update={"status": status, "error": message})
            return False
        self._views[step.step_id] = view.model_copy(
            update={
                "status": outcome.status.value,
                "stage": outcome.stage,
                "claim_generation": outcome.claim_generation,
                "attempts": outcome.attempts,
                "receipt": outcome.receipt,
            }
        )
        return outcome.status is TaskStatus.SETTLED

    def _add(self, step: PlanStep) -> TaskView:
        view = TaskView(
            task_id=task_id_for(self._run_id, step.step_id),
            step_id=step.step_id,
            tool=step.tool,
            status=TaskStatus.PENDING.value,
            idempotency_key=step.idempotency_key or idempotency_key_for(self._run_id, step.step_id),
        )
        self._steps.append(step)
        self._views[step.step_id] = view
        return view

    @workflow.query(name="status")
    def status(self) -> RunStatus:
        return RunStatus(
            agent_run_id=self._run_id,
            status=self._state,
            closed=self._closed,
            tasks=[self._views[step.step_id] for step in self._steps],
        )

    @workflow.update(name="submit")
    def submit(self, step: PlanStep) -> TaskView:
        return self._add(step)

    @submit.validator
    def _validate_submit(self, step: PlanStep) -> None:
        if self._closed or self._state in (RunState.COMPLETED, RunState.FAILED):
            raise ValueError(f"run {self._run_id} is closed; it takes no more tool calls")
        if self._catalog is None:
            raise ValueError(f"run {self._run_id} is still starting; submit again in a moment")
        if step.tool not in self._catalog:
            raise ValueError(f"unknown tool {step.tool!r}; known tools: {', '.join(sorted(self._catalog))}")
        if step.step_id in self._views:
            raise ValueError(f"step id {step.step_id!r} is already used in run {self._run_id}")

    @workflow.signal(name="close")
    def close(self) -> None:
        self._closed = True
