"""``AgentRunWorkflow``: an agent run made from a plan, its steps run in order as leased calls (``docs/plans.md``),
more taken by the update ``submit`` (a ``PlanStep``, answered with its view) until the signal ``close``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from agentlease.enums import FailureType, RunState, StepEnd
    from agentlease.ledger.unknown_tools import RECORD_UNKNOWN_TOOLS, UnknownTools, UnknownToolStep
    from agentlease.limits import MAX_STEPS_PER_RUN, check_run_id
    from agentlease.records import AgentRunPlan, PlanStep, RunStatus
    from agentlease.runtime.names import AGENT_RUN_WORKFLOW, CLOSE_SIGNAL, SUBMIT_UPDATE
    from agentlease.workflow._calls import LeasedToolCalls
    from agentlease.workflow._handlers import parse_payload


_RECORD_TIMEOUT = timedelta(seconds=30)
_RECORD_PATIENCE = timedelta(minutes=2)  # how long a failing run tries to record its unknown tools
_RECORD_RETRY = RetryPolicy(
    maximum_interval=timedelta(seconds=10), non_retryable_error_types=[FailureType.UNKNOWN_TOOL.value]
)


@workflow.defn(name=AGENT_RUN_WORKFLOW, failure_exception_types=[ValidationError, RecursionError])
class AgentRunWorkflow:
    """Runs an :class:`~agentlease.records.AgentRunPlan`; a plan that does not validate fails the run at once."""

    @workflow.init
    def __init__(self, plan: AgentRunPlan | dict[str, Any]) -> None:
        self._calls = LeasedToolCalls()
        self._bad_plan: str | None = None
        self._plan = AgentRunPlan()
        try:
            parsed = parse_payload(AgentRunPlan, plan, "plan")
            check_run_id(workflow.info().workflow_id)
        except ValueError as exc:
            self._bad_plan = str(exc)
            return
        self._plan = parsed
        self._calls.closed = not parsed.keep_open
        if parsed.carried is not None:
            try:
                self._calls.restore(parsed.steps, parsed.carried)
            except ValueError as exc:
                self._bad_plan = str(exc)
            return
        for step in parsed.steps:
            self._calls.add(step)

    @workflow.run
    async def run(self, plan: AgentRunPlan | dict[str, Any]) -> RunStatus:
        calls = self._calls
        if self._bad_plan is not None:
            calls.end(RunState.FAILED)
            raise ApplicationError(self._bad_plan, type=FailureType.INVALID_PLAN.value, non_retryable=True)
        try:
            await calls.load_catalog()
        except ApplicationError as exc:
            if exc.type == FailureType.UNKNOWN_TOOL.value:
                await self._record_unknown_tools()
            raise
        plan = self._plan
        index = 0 if plan.carried is None else plan.carried.next_step
        ran = 0
        failed = False
        while True:

            def more_to_do(index: int = index) -> bool:
                return index < len(calls.step_ids()) or calls.closed or calls.cancelled

            if not more_to_do():
                calls.show_search_attributes()  # about to wait for more steps: show where the run is
            await workflow.wait_condition(more_to_do)
            steps = calls.step_ids()
            if calls.cancelled or index >= len(steps):
                break
            step_id = steps[index]
            index += 1
            outcome = await calls.run_step(step_id)
            ran += 1
            if outcome.view.status is StepEnd.FAILED:
                failed = True
                for rest in calls.step_ids()[index:]:
                    calls.skip(rest)
                break
            more = index < len(calls.step_ids()) or not calls.closed
            if more and self._history_is_full(ran):
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not calls.cancelled:
                    kept, carried = calls.carry(index)
                    update = {"steps": kept, "carried": carried, "keep_open": not calls.closed}
                    workflow.continue_as_new(plan.model_copy(update=update))
        calls.end(RunState.FAILED if failed else RunState.CANCELLED if calls.cancelled else RunState.COMPLETED)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return calls.status()

    async def _record_unknown_tools(self) -> None:
        """Record the steps whose tool no worker serves in the ledger before the run fails (best effort)."""
        calls = self._calls
        known = calls.known_tools() or []
        try:
            steps = [
                UnknownToolStep(step_id=sid, tool=calls.view(sid).tool)
                for sid in calls.step_ids()
                if calls.view(sid).tool not in known
            ]
            record = UnknownTools(steps=steps[:1000], known=known[:1000]) if steps else None
        except ValueError as exc:  # never the run's failure: it fails with UnknownTool all the same
            workflow.logger.warning("the run's unknown tools cannot be recorded: %s", exc)
            return
        if record is None:
            return
        try:
            await workflow.execute_activity(
                RECORD_UNKNOWN_TOOLS,
                record.model_dump(mode="json"),
                start_to_close_timeout=_RECORD_TIMEOUT,
                schedule_to_close_timeout=_RECORD_PATIENCE,
                retry_policy=_RECORD_RETRY,
                summary=f"{steps[0].step_id}: unknown tool {steps[0].tool}",
            )
        except ActivityError as exc:
            workflow.logger.warning("the run's unknown tools were not recorded in the ledger: %s", exc.cause or exc)

    def _history_is_full(self, ran: int) -> bool:
        """Whether to continue as new now: after ``continue_as_new_after`` steps, or when Temporal suggests it."""
        limit = self._plan.continue_as_new_after
        return (limit is not None and ran >= limit) or workflow.info().is_continue_as_new_suggested()

    @workflow.update(name=SUBMIT_UPDATE)
    def submit(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self._calls.add(parse_payload(PlanStep, payload, "submit")).model_dump(mode="json")

    @submit.validator
    def _validate_submit(self, payload: dict[str, Any]) -> None:
        step = parse_payload(PlanStep, payload, "submit")
        calls = self._calls
        if calls.closed or calls.state.ended or calls.cancelled:
            raise ValueError(f"run {calls.run_id} is closed; it takes no more tool calls")
        known = calls.known_tools()
        if known is None:
            raise ValueError(f"run {calls.run_id} is still starting; submit again in a moment")
        if step.tool not in known:
            raise ValueError(f"unknown tool {step.tool!r}; known tools: {', '.join(known)}")
        if calls.has_step(step.step_id):
            raise ValueError(f"step id {step.step_id!r} is already used in run {calls.run_id}")
        if len(calls.step_ids()) >= MAX_STEPS_PER_RUN:
            raise ValueError(f"run {calls.run_id} has {MAX_STEPS_PER_RUN} steps, the most one run takes")

    @workflow.signal(name=CLOSE_SIGNAL)
    def close(self) -> None:
        self._calls.closed = True
