"""``AgentRunWorkflow``: an agent run whose tool calls are leased activities.

Deterministic orchestration only: the tools, the ledger and every side effect live in
``activities/``. The run learns the worker's tools once (a local activity, recorded in history),
then runs its steps in order, each as a leased activity whose heartbeat timeout is the lease TTL.
A step that needs a person waits for one: approval before an ``unsafe`` tool (or any tool declared
``requires_approval``), reconciliation of an ambiguous side effect, a redrive of a dead-lettered
or blocked task.

Operators and agents talk to a run through:

- query ``status`` -> :class:`RunStatus`;
- update ``submit`` (:class:`PlanStep`) -> :class:`TaskView`: rejects an unknown tool, a duplicate
  step id or a closed run;
- updates ``approve`` / ``reject`` / ``redrive`` (:class:`DecisionRequest`), ``reconcile``
  (:class:`ReconcileRequest`), ``cancel`` (:class:`CancelRequest`) -> :class:`RunStatus`; their
  validators reject a decision the task is not waiting for, so a rejected update leaves no history;
- signal ``close``: no more steps; the run ends after its last task.

Every decision is written to the ledger's evidence trail with who made it and why.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from agentlease import search_attributes as sa
    from agentlease.decisions import (
        CancelRequest,
        DecisionKind,
        DecisionRequest,
        LedgerDecision,
        ReconcileRequest,
    )
    from agentlease.enums import FailureType, Stage, TaskStatus
    from agentlease.records import (
        AgentRunPlan,
        PlanStep,
        RunStatus,
        TaskSpec,
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
APPLY_DECISION = "agentlease.apply_decision"
"""Name of the activity that writes an operator decision to the ledger."""
DECISION_REFUSED = "DecisionRefused"

WORKFLOW_NAME = "AgentRunWorkflow"

_DECISION_TIMEOUT = timedelta(seconds=30)
_DECISION_RETRY = RetryPolicy(maximum_attempts=5, non_retryable_error_types=[DECISION_REFUSED])

_FAILURE_STATUS = {
    FailureType.DEAD_LETTERED.value: TaskStatus.DEAD_LETTERED.value,
    FailureType.TASK_CANCELLED.value: TaskStatus.CANCELLED.value,
    FailureType.BLOCKED.value: TaskStatus.BLOCKED.value,
    FailureType.NEEDS_RECONCILIATION.value: TaskStatus.NEEDS_RECONCILIATION.value,
}
_WAITING = frozenset(
    {
        TaskStatus.AWAITING_APPROVAL.value,
        TaskStatus.NEEDS_RECONCILIATION.value,
        TaskStatus.BLOCKED.value,
        TaskStatus.DEAD_LETTERED.value,
    }
)
_FINAL = frozenset(
    {
        TaskStatus.SETTLED.value,
        TaskStatus.CANCELLED.value,
        TaskStatus.REJECTED.value,
        TaskStatus.ABANDONED.value,
        "failed",
        "skipped",
    }
)


class RunState:
    """Run-level statuses reported by ``status`` and the ``AgentLeaseStatus`` search attribute."""

    STARTING = "starting"
    RUNNING = "running"
    WAITING = "waiting"
    """A task waits for a person (see ``AgentLeaseWaitingReason``)."""
    COMPLETED = "completed"
    """Every step reached a final status (settled, or decided: rejected, abandoned, cancelled)."""
    CANCELLED = "cancelled"
    FAILED = "failed"
    """A step failed in a way no decision can mend (an unknown tool)."""

    ENDED = frozenset({COMPLETED, CANCELLED, FAILED})


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
        self._run_cancelled = False
        self._running: dict[str, workflow.ActivityHandle[ToolOutcome]] = {}
        for step in plan.steps:
            self._add(step)

    # -- the run -----------------------------------------------------------------------------------

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
        self._set_state(RunState.RUNNING)
        index = 0
        while True:
            await workflow.wait_condition(
                lambda: index < len(self._steps) or self._closed or self._run_cancelled
            )
            if self._run_cancelled or index >= len(self._steps):
                break
            step = self._steps[index]
            index += 1
            if self._view(step.step_id).status in _FINAL:
                continue  # cancelled before it started
            final = await self._run_step(step)
            if final == "failed":
                self._set_state(RunState.FAILED)
                for rest in self._steps[index:]:
                    self._update(rest.step_id, status="skipped")
                break
        if self._state != RunState.FAILED:
            self._set_state(RunState.CANCELLED if self._run_cancelled else RunState.COMPLETED)
        self._closed = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _run_step(self, step: PlanStep) -> str:
        """Run one step until it reaches a final status; wait for people where the policy says so."""
        assert self._catalog is not None
        info = self._catalog[step.tool]
        sid = step.step_id
        self._set_state(self._state, tool=step.tool, stage=None)
        if info.requires_approval:
            await self._apply(step, DecisionKind.AWAIT_APPROVAL, "agentlease", f"{step.tool} requires approval")
            await self._wait_for_person(sid)
            if self._view(sid).status in _FINAL:
                return self._view(sid).status
        while True:
            status = await self._attempt(step, info)
            if status in _WAITING:
                await self._wait_for_person(sid)
                status = self._view(sid).status
            if status not in (TaskStatus.PENDING.value, TaskStatus.RELEASED.value):
                return status

    async def _wait_for_person(self, step_id: str) -> None:
        waiting = self._view(step_id).status
        self._set_state(RunState.WAITING, waiting_reason=f"{step_id}: {waiting}")
        await workflow.wait_condition(lambda: self._view(step_id).status != waiting)
        self._set_state(RunState.RUNNING, waiting_reason="")

    async def _attempt(self, step: PlanStep, info: ToolInfo) -> str:
        """Execute the leased activity once (Temporal retries inside); returns the view's status."""
        sid = step.step_id
        self._update(sid, status=TaskStatus.RUNNING.value)
        options = leased_activity_options(info)
        call = self._call(step)
        handle = workflow.start_activity(
            step.tool,
            call,
            heartbeat_timeout=options.heartbeat_timeout,
            start_to_close_timeout=options.start_to_close_timeout,
            retry_policy=options.retry_policy,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            result_type=ToolOutcome,
        )
        self._running[sid] = handle
        try:
            outcome = await handle
        except ActivityError as err:
            if self._view(sid).status == TaskStatus.CANCELLED.value:
                return TaskStatus.CANCELLED.value
            cause = err.cause
            if isinstance(cause, CancelledError):
                return self._update(sid, status=TaskStatus.CANCELLED.value, error=cause.message).status
            kind = cause.type if isinstance(cause, ApplicationError) else None
            facts: dict[str, Any] = {}
            if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
                facts = cause.details[0]
            message = cause.message if isinstance(cause, ApplicationError) else str(err)
            return self._update(
                sid,
                status=_FAILURE_STATUS.get(kind or "", "failed"),
                error=message,
                stage=facts.get("stage"),
                claim_generation=facts.get("claim_generation"),
                attempts=facts.get("attempts"),
            ).status
        finally:
            self._running.pop(sid, None)
        if self._view(sid).status == TaskStatus.CANCELLED.value:
            return TaskStatus.CANCELLED.value
        self._set_state(self._state, stage=outcome.stage)
        return self._update(
            sid,
            status=outcome.status.value,
            stage=outcome.stage,
            claim_generation=outcome.claim_generation,
            attempts=outcome.attempts,
            receipt=outcome.receipt,
            error=None,
        ).status

    # -- state -------------------------------------------------------------------------------------

    def _view(self, step_id: str) -> TaskView:
        return self._views[step_id]

    def _update(self, step_id: str, **changes: Any) -> TaskView:
        view = self._views[step_id].model_copy(update=changes)
        self._views[step_id] = view
        return view

    def _set_state(
        self, state: str, *, waiting_reason: str | None = None, tool: str | None = None, stage: Any = ...
    ) -> None:
        self._state = state
        updates = [sa.RUN_STATUS.value_set(state)]
        if waiting_reason is not None:
            updates.append(sa.WAITING_REASON.value_set(waiting_reason))
        if tool is not None:
            updates.append(sa.CURRENT_TOOL.value_set(tool))
        if stage is not ...:
            updates.append(sa.CURRENT_STAGE.value_set(stage.value if isinstance(stage, Stage) else (stage or "")))
        workflow.upsert_search_attributes(updates)

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

    def _call(self, step: PlanStep) -> ToolCall:
        """The leased activity's input for ``step``: its task, arguments and idempotency key (G4)."""
        view = self._view(step.step_id)
        return ToolCall(
            task_id=view.task_id,
            agent_run_id=self._run_id,
            step_id=step.step_id,
            tool=step.tool,
            arguments=step.arguments,
            idempotency_key=view.idempotency_key,
        )

    def _step(self, step_id: str) -> PlanStep:
        return next(step for step in self._steps if step.step_id == step_id)

    async def _apply(
        self, step: PlanStep, kind: DecisionKind, by: str, reason: str, **extra: Any
    ) -> TaskView:
        """Write a decision to the ledger (evidence: who and why), then show its result."""
        assert self._catalog is not None
        info = self._catalog[step.tool]
        view = self._view(step.step_id)
        task = TaskSpec.of(self._call(step), info.side_effect_class, info.lease_ttl)
        outcome = await workflow.execute_activity(
            APPLY_DECISION,
            LedgerDecision(kind=kind, task=task, by=by, reason=reason, **extra),
            start_to_close_timeout=_DECISION_TIMEOUT,
            retry_policy=_DECISION_RETRY,
            result_type=ToolOutcome,
        )
        shown = TaskStatus.PENDING.value if outcome.status is TaskStatus.RELEASED else outcome.status.value
        return self._update(
            step.step_id,
            status=shown,
            stage=outcome.stage,
            claim_generation=outcome.claim_generation or view.claim_generation,
            attempts=outcome.attempts if outcome.attempts else view.attempts,
            receipt=outcome.receipt,
            error=None if outcome.status is not TaskStatus.CANCELLED else view.error,
        )

    # -- queries, updates, signals -----------------------------------------------------------------

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
        if self._closed or self._state in RunState.ENDED or self._run_cancelled:
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

    def _require(self, step_id: str, allowed: frozenset[str] | set[str], decision: str) -> None:
        if step_id not in self._views:
            raise ValueError(f"run {self._run_id} has no step {step_id!r}")
        status = self._views[step_id].status
        if status not in allowed:
            raise ValueError(
                f"cannot {decision} step {step_id!r}: it is {status}, not {' or '.join(sorted(allowed))}"
            )

    @workflow.update(name="approve")
    async def approve(self, request: DecisionRequest) -> RunStatus:
        await self._apply(self._step(request.step_id), DecisionKind.APPROVE, request.by, request.reason)
        return self.status()

    @approve.validator
    def _validate_approve(self, request: DecisionRequest) -> None:
        self._require(request.step_id, {TaskStatus.AWAITING_APPROVAL.value}, "approve")

    @workflow.update(name="reject")
    async def reject(self, request: DecisionRequest) -> RunStatus:
        await self._apply(self._step(request.step_id), DecisionKind.REJECT, request.by, request.reason)
        return self.status()

    @reject.validator
    def _validate_reject(self, request: DecisionRequest) -> None:
        self._require(request.step_id, {TaskStatus.AWAITING_APPROVAL.value}, "reject")

    @workflow.update(name="reconcile")
    async def reconcile(self, request: ReconcileRequest) -> RunStatus:
        extra: dict[str, Any] = {}
        if request.action == "confirm":
            extra = {"external_id": request.external_id, "observed": request.observed}
        await self._apply(
            self._step(request.step_id), DecisionKind(request.action), request.by, request.reason, **extra
        )
        return self.status()

    @reconcile.validator
    def _validate_reconcile(self, request: ReconcileRequest) -> None:
        self._require(request.step_id, {TaskStatus.NEEDS_RECONCILIATION.value}, "reconcile")

    @workflow.update(name="redrive")
    async def redrive(self, request: DecisionRequest) -> RunStatus:
        await self._apply(self._step(request.step_id), DecisionKind.REDRIVE, request.by, request.reason)
        return self.status()

    @redrive.validator
    def _validate_redrive(self, request: DecisionRequest) -> None:
        self._require(request.step_id, {TaskStatus.DEAD_LETTERED.value, TaskStatus.BLOCKED.value}, "redrive")

    @workflow.update(name="cancel")
    async def cancel(self, request: CancelRequest) -> RunStatus:
        if request.step_id is None:
            self._run_cancelled = True
            targets = [s.step_id for s in self._steps if self._views[s.step_id].status not in _FINAL]
        else:
            targets = [request.step_id]
        for step_id in targets:
            # The ledger ends the claim first, so the old generation cannot settle (G8).
            await self._apply(self._step(step_id), DecisionKind.CANCEL, request.by, request.reason)
            handle = self._running.get(step_id)
            if handle is not None:
                handle.cancel()
        # Wait for the cancelled activities to acknowledge.
        await workflow.wait_condition(lambda: not any(step_id in self._running for step_id in targets))
        return self.status()

    @cancel.validator
    def _validate_cancel(self, request: CancelRequest) -> None:
        if self._state in RunState.ENDED:
            raise ValueError(f"run {self._run_id} has ended ({self._state}); there is nothing to cancel")
        if request.step_id is not None:
            open_statuses = {s.value for s in TaskStatus} - _FINAL
            self._require(request.step_id, open_statuses, "cancel")
