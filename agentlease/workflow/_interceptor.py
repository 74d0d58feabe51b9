"""The workflow interceptor ``AgentLeasePlugin`` adds: every workflow of the worker answers the ``status``
query and the decision updates from its start, and ends its leased calls' state when its run ends."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import CancelledError
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

with workflow.unsafe.imports_passed_through():
    from agentlease.enums import RunState
    from agentlease.records import RunStatus
    from agentlease.runtime.names import DECIDE_SIGNAL, LEASE_PROGRESS_SIGNAL, STATUS_QUERY
    from agentlease.workflow._calls import attached_calls
    from agentlease.workflow._decisions import DECISION_UPDATES
    from agentlease.workflow._handlers import resolved


class LeasedCallsInterceptor(Interceptor):
    """Answers the ``status`` query and refuses the decision updates on every workflow until its first leased call."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _LeasedCallsInbound


class _LeasedCallsInbound(WorkflowInboundInterceptor):
    def init(self, outbound: Any) -> None:
        super().init(outbound)
        if _defines_own_handlers():
            return
        workflow.set_query_handler(STATUS_QUERY, resolved(_status_before_calls))
        for command in DECISION_UPDATES:  # the validator refuses: the handler never runs
            refuse = _no_step_yet(command)
            workflow.set_update_handler(command, resolved(refuse), validator=refuse)

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        """Run the workflow; when it returns or raises, end its leased calls' state if nothing did."""
        calls = attached_calls(workflow.instance())
        if calls is not None:  # made in @workflow.init
            calls.check_replay_floor()
        try:
            result = await super().execute_workflow(input)
        except workflow.ContinueAsNewError:
            raise
        except (asyncio.CancelledError, CancelledError):
            calls = attached_calls(workflow.instance())
            if calls is not None and not calls.state.ended:
                await calls.stop_calls()
            _end_attached(RunState.CANCELLED)
            raise
        except Exception:  # not GeneratorExit nor an eviction: the run did not end, its coroutine was closed
            _end_attached(RunState.FAILED)
            raise
        _end_attached(RunState.COMPLETED)
        return result


def _end_attached(state: RunState) -> None:
    calls = attached_calls(workflow.instance())
    if calls is None or calls.state.ended:
        return
    calls.end(RunState.CANCELLED if state is RunState.COMPLETED and calls.cancelled else state)


def _defines_own_handlers() -> bool:
    return (
        workflow.get_query_handler(STATUS_QUERY) is not None
        or any(workflow.get_update_handler(command) is not None for command in DECISION_UPDATES)
        or any(workflow.get_signal_handler(name) is not None for name in (DECIDE_SIGNAL, LEASE_PROGRESS_SIGNAL))
        or workflow.get_dynamic_query_handler() is not None
        or workflow.get_dynamic_update_handler() is not None
    )


def _status_before_calls() -> dict[str, Any]:
    calls = attached_calls(workflow.instance())
    if calls is not None:
        return calls.status().model_dump(mode="json")
    status = RunStatus(agent_run_id=workflow.info().workflow_id, status=RunState.STARTING, closed=False, tasks=[])
    return status.model_dump(mode="json")


def _no_step_yet(command: str) -> Any:
    def validator(payload: Any) -> None:
        raise ValueError(
            f"cannot {command}: run {workflow.info().workflow_id} has made no leased call yet, so it has no step to "
            "decide on"
        )

    return validator


__all__ = ["LeasedCallsInterceptor"]
