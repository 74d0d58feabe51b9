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
"""How long after its start a run waits for a worker that serves its tools (see :meth:`RunCatalog.load`).
Default 30s."""
_DESCRIBE_TIMEOUT = timedelta(seconds=30)


class ToolsNotServedHereError(RuntimeError):
    """This worker does not serve a tool of the run: the workflow task fails (Temporal retries it,
    on any worker of the queue); nothing is recorded in the run's history."""


class RunCatalog:
    """The run's tools by name (see the module docstring).

    Args:
        run: the run's view: the run is ``running`` once its tools are known.
        declared: the tools the workflow declares; default none, learnt with :meth:`load`.
    """

    def __init__(self, run: RunView, declared: Iterable[ToolInfo] | None) -> None:
        self._run = run
        self.tools: dict[str, ToolInfo] | None = None if declared is None else {i.name: i for i in declared}
        """The tools known so far, by name; ``None`` until the workflow declares one or :meth:`load` ran."""
        self._learnt = False
        """The worker's catalog was learnt, not only the tools the workflow declared."""
        if self.tools is not None:
            run.set_state(RunState.RUNNING)

    async def load(self, steps: Mapping[str, PlanStep]) -> dict[str, ToolInfo]:
        """Learn the worker's tools (a local activity, recorded in history) and start running.

        A worker that does not serve a tool of the run's ``steps`` (those added meanwhile included) fails
        only this workflow task (:class:`ToolsNotServedHereError`, nothing recorded), for up to :data:`CATALOG_PATIENCE`
        after the run started, so that a worker of the queue that serves them takes the run up.

        Raises:
            ToolsNotServedHereError: as said, within :data:`CATALOG_PATIENCE`.
            ApplicationError: non-retryable ``UnknownTool`` when a step names a tool the worker
                does not serve after that; the workflow fails with it.
        """
        if self.tools is None:
            self.tools = await self._describe()
        unknown = sorted({step.tool for step in steps.values()} - set(self.tools))
        patient = bool(unknown) and workflow.now() - workflow.info().workflow_start_time < CATALOG_PATIENCE
        # Never in a replay: a workflow task that completed while the catalog was on its way (to answer a
        # query) replays it, and failing there would fail every task of the run.
        if patient and not workflow.unsafe.is_replaying():
            # Not recorded: the workflow task fails, and the next one (on another worker of the
            # queue, perhaps) learns that worker's tools.
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
        """``tool``'s info, or ``None`` when neither the workflow nor the worker has it: the catalog is
        loaded first (:meth:`load`), and a tool the workflow did not declare is looked for once among
        the worker's (beside the declared ones)."""
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
