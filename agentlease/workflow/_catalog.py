"""The tools a run may call: declared by its workflow (an adapter's tools), or learnt once from the worker
that runs its first workflow task (``docs/limits.md``, "A worker that does not serve a run's tools")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from agentlease.enums import FailureType, RunState
    from agentlease.records import PlanStep, ToolInfo
    from agentlease.runtime.names import DESCRIBE_RUN, DESCRIBE_TOOLS
    from agentlease.workflow._status import RunView

CATALOG_PATIENCE = timedelta(seconds=30)
"""How long after its start a run waits for a worker that serves its tools. Default 30s."""
_DESCRIBE_TIMEOUT = timedelta(seconds=30)


class ToolsNotServedHereError(RuntimeError):
    """This worker does not serve a tool of the run: the workflow task fails, unrecorded, and is retried."""


class RunCatalog:
    """The run's tools by name, declared by the workflow or learnt from the worker."""

    def __init__(self, run: RunView, declared: Iterable[ToolInfo] | None) -> None:
        self._run = run
        self.tools: dict[str, ToolInfo] | None = None if declared is None else {i.name: i for i in declared}
        """The tools known so far, by name; ``None`` until the workflow declares one or :meth:`load` ran."""
        self._learnt = False  # the worker's catalog was learnt, not only the declared tools
        if self.tools is not None:
            run.set_state(RunState.RUNNING)

    async def load(self, steps: Mapping[str, PlanStep]) -> dict[str, ToolInfo]:
        """Learn the worker's tools and start running; a tool this worker does not serve fails (see the module)."""
        if self.tools is None:
            self.tools = await self._describe()
        unknown = sorted({step.tool for step in steps.values()} - set(self.tools))
        patient = bool(unknown) and workflow.now() - workflow.info().workflow_start_time < CATALOG_PATIENCE
        # Never in a replay: a task that completed while the catalog was on its way replays it.
        if patient and not workflow.unsafe.is_replaying():
            raise ToolsNotServedHereError(
                f"this worker does not serve tool(s) {', '.join(unknown)} of run {self._run.run_id}; the run waits "
                f"up to {CATALOG_PATIENCE.total_seconds():g}s for a worker of its task queue that does"
            )
        if unknown:
            self._run.set_state(RunState.FAILED)
            raise ApplicationError(
                f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(sorted(self.tools))} (the tools of "
                "the worker that started the run: every worker of a task queue must serve the same "
                "AGENTLEASE_TOOL_MODULES)",
                type=FailureType.UNKNOWN_TOOL.value,
                non_retryable=True,
            )
        self._run.set_state(RunState.RUNNING)
        return self.tools

    async def find(self, tool: str, steps: Mapping[str, PlanStep]) -> ToolInfo | None:
        """``tool``'s info, or ``None`` when neither the workflow nor the worker (asked once) has it."""
        catalog = self.tools if self.tools is not None else await self.load(steps)
        if tool not in catalog and not self._learnt:
            catalog.update({name: info for name, info in (await self._describe()).items() if name not in catalog})
        return catalog.get(tool)

    async def _describe(self) -> dict[str, ToolInfo]:
        self._learnt = True
        proofs = self._run.proofs
        if proofs.wanted:  # one local activity for the catalog and the progress secret
            described = await workflow.execute_local_activity(
                DESCRIBE_RUN, start_to_close_timeout=_DESCRIBE_TIMEOUT, result_type=dict[str, Any]
            )
            proofs.learn(described["progress_secret"])
            catalog = described["tools"]
        else:
            catalog = await workflow.execute_local_activity(
                DESCRIBE_TOOLS, start_to_close_timeout=_DESCRIBE_TIMEOUT, result_type=list[dict[str, Any]]
            )
        return {info.name: info for info in map(ToolInfo.model_validate, catalog)}

    def register(self, info: ToolInfo) -> None:
        """Make a tool the workflow declares itself callable (a framework adapter's tool)."""
        if self.tools is None:
            self.tools = {}
            self._run.set_state(RunState.RUNNING)
        self.tools[info.name] = info


__all__ = ["CATALOG_PATIENCE", "RunCatalog", "ToolsNotServedHereError"]
