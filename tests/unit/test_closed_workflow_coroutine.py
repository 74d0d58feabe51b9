"""A workflow coroutine closed without ending (an evicted run, garbage-collected) ends nothing: the code
that ends a run's leased calls runs for its return or failure only, never for ``GeneratorExit``, where
no workflow event loop is current and any workflow call raises (an "Exception ignored" at collection)."""

from __future__ import annotations

import inspect
from collections.abc import Generator
from typing import Any

import pytest
from temporalio import workflow
from temporalio.worker import ExecuteWorkflowInput, WorkflowInboundInterceptor

from agentlease.workflow._interceptor import _LeasedCallsInbound


class _Suspended:
    """An awaitable that suspends its coroutine once (no event loop needed)."""

    def __await__(self) -> Generator[None, None, None]:
        yield None


class _Pending(WorkflowInboundInterceptor):
    """A workflow that has not returned yet."""

    def __init__(self) -> None:
        pass

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        await _Suspended()


def test_closing_a_running_workflow_coroutine_calls_no_workflow_api(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[bool] = []

    def instance() -> None:
        """The run's start looks for its leased calls once (the replay floor's check); after that, this test
        is outside any workflow, where a workflow call raises."""
        if started:
            raise RuntimeError("Not in workflow event loop")
        started.append(True)

    monkeypatch.setattr(workflow, "instance", instance)
    inbound = _LeasedCallsInbound(_Pending())
    running = inbound.execute_workflow(None)  # type: ignore[arg-type]
    running.send(None)  # suspended inside the workflow, as an evicted run's coroutine is
    assert started == [True]
    running.close()  # GeneratorExit: raised here if it reached a workflow call
    assert inspect.getcoroutinestate(running) == inspect.CORO_CLOSED  # closed cleanly
