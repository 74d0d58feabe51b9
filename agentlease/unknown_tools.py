"""A run that names a tool no worker serves: what its workflow asks the ledger to record before it fails.

A plan run checks its steps against the worker's tool catalog before its first call
(:meth:`~agentlease.workflow._catalog.RunCatalog.load`). When a step names a tool that no
worker of its task queue serves, the run fails with ``UnknownTool`` and no call of it ever reaches the
ledger. So that the ledger's listings (``agentlease runs``, ``agentlease tasks --run``, ``agentlease
ui``) know the run, the workflow first schedules the activity :data:`RECORD_UNKNOWN_TOOLS` with the
steps whose tool is unknown (:class:`UnknownTools`): each is recorded as a task ``cancelled`` by
``agentlease`` (it will never run), its error class :data:`UNKNOWN_TOOL_ERROR` and the reason naming the tool
(:func:`agentlease.ledger.refusals.record_unknown_tool`). Listings show such a run as ``failed``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agentlease.records import STEP_ID_PATTERN

RECORD_UNKNOWN_TOOLS = "agentlease.record_unknown_tools"
"""Activity that records the steps of a failing run whose tool no worker serves."""

UNKNOWN_TOOL_ERROR = "unknown_tool"
"""``tasks.error_class`` of a step recorded so: the listings show its run as ``failed``."""

RUN_DECIDER = "agentlease"
"""Who the evidence trail names for the refusal (the run itself, as for its other own decisions)."""

_MAX_NAMED_TOOLS = 20
"""How many of the served tools a reason lists."""


class UnknownToolStep(BaseModel):
    """One step whose tool no worker serves."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_id: str = Field(min_length=1, max_length=128, pattern=STEP_ID_PATTERN)
    tool: str = Field(min_length=1, max_length=128)


class UnknownTools(BaseModel):
    """Input of :data:`RECORD_UNKNOWN_TOOLS`: the steps, and the tools the worker that failed the run serves.

    The activity records the steps of the workflow that scheduled it only (its task ids and keys are made
    from ``activity.info().workflow_id``), so no input can make it write another run's tasks.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: list[UnknownToolStep] = Field(min_length=1, max_length=1000)
    known: list[str] = Field(default_factory=list, max_length=1000)

    def reason_for(self, step: UnknownToolStep) -> str:
        """One line: ``unknown tool 'x' (step fetch): no worker of the run's task queue serves it, ...``."""
        served = ", ".join(self.known[:_MAX_NAMED_TOOLS]) or "none"
        if len(self.known) > _MAX_NAMED_TOOLS:
            served += f" and {len(self.known) - _MAX_NAMED_TOOLS} more"
        return (
            f"unknown tool {step.tool!r} (step {step.step_id}): no worker of the run's task queue serves it, so "
            f"the run failed without making this call; the worker that checked the plan serves {served} (every "
            "worker of a task queue must serve the same AGENTLEASE_TOOL_MODULES)"
        )


__all__ = ["RECORD_UNKNOWN_TOOLS", "RUN_DECIDER", "UNKNOWN_TOOL_ERROR", "UnknownToolStep", "UnknownTools"]
