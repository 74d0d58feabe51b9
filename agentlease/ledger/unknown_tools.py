"""A run that names a tool no worker serves: each such step recorded ``cancelled`` before the run fails, so that
the listings know it (``docs/operator-views.md``, "A run that names a tool no worker serves")."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from agentlease.decisions.table import RUN_DECIDER
from agentlease.enums import EventKind, FailureType, SideEffectClass, TaskStatus
from agentlease.errors import LedgerUnavailableError
from agentlease.ledger.listing import UNKNOWN_TOOL_ERROR
from agentlease.ledger.refusals import end_own_task
from agentlease.ledger.store import Ledger
from agentlease.records import STEP_ID_PATTERN, TaskRecord, TaskSpec, TraceLink, idempotency_key_for, task_id_for
from agentlease.runtime.payloads import activity_input
from agentlease.security.redaction import redact

logger = logging.getLogger("agentlease.lease")

RECORD_UNKNOWN_TOOLS = "agentlease.record_unknown_tools"
"""Activity that records the steps of a failing run whose tool no worker serves."""

_MAX_NAMED_TOOLS = 20  # how many of the served tools a reason lists


class UnknownToolStep(BaseModel):
    """One step whose tool no worker serves."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_id: str = Field(min_length=1, max_length=128, pattern=STEP_ID_PATTERN)
    tool: str = Field(min_length=1, max_length=128)


class UnknownTools(BaseModel):
    """Input of :data:`RECORD_UNKNOWN_TOOLS`: the steps, and the tools the worker that failed the run serves
    (only the scheduling workflow's own tasks are written)."""

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


async def record_unknown_tool(
    ledger: Ledger,
    own: TaskSpec,
    reason: str,
    *,
    details: dict[str, Any] | None = None,
    trace: TraceLink | None = None,
    now: datetime | None = None,
) -> TaskRecord:
    """Record ``own``, a step whose tool no worker serves, as ``cancelled`` by the run if still claimable (error
    class :data:`UNKNOWN_TOOL_ERROR`, ``reason``, a ``cancelled`` entry), in one transaction; returns the task
    afterwards.

    Raises:
        LedgerUnavailableError: the ledger could not be reached.
    """
    return await end_own_task(
        ledger,
        own,
        redact(reason),
        status=TaskStatus.CANCELLED,
        error_class=UNKNOWN_TOOL_ERROR,
        kind=EventKind.CANCELLED,
        details={"by": RUN_DECIDER, "unknown_tool": own.tool, **(details or {})},
        always_recorded=False,
        trace=trace,
        now=now,
    )


RECORDED_LEASE_TTL = timedelta(seconds=30)
"""The lease TTL the ledger's row carries (the tool is unknown, so is its TTL; no lease is ever granted)."""


class UnknownToolActivities:
    """Registers ``agentlease.record_unknown_tools`` over one ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def activities(self) -> list[Any]:
        ledger = self._ledger

        @activity.defn(name=RECORD_UNKNOWN_TOOLS)
        async def record_unknown_tools(payload: dict[str, Any]) -> None:
            request = activity_input(UnknownTools, payload, "malformed unknown-tools record", FailureType.UNKNOWN_TOOL)
            info = activity.info()
            run = info.workflow_id
            if run is None:
                raise ApplicationError(
                    "agentlease.record_unknown_tools runs only when a workflow schedules it",
                    type=FailureType.UNKNOWN_TOOL.value,
                    non_retryable=True,
                )
            trace = TraceLink(
                workflow_id=run, run_id=info.workflow_run_id, activity_id=info.activity_id, attempt=info.attempt
            )
            for step in request.steps:
                own = TaskSpec(
                    task_id=task_id_for(run, step.step_id),
                    agent_run_id=run,
                    step_id=step.step_id,
                    tool=step.tool,
                    # Nothing is known of a tool no worker serves: the most careful class.
                    side_effect_class=SideEffectClass.UNSAFE,
                    idempotency_key=idempotency_key_for(run, step.step_id),
                    lease_ttl=RECORDED_LEASE_TTL,
                )
                try:
                    await record_unknown_tool(ledger, own, request.reason_for(step), trace=trace)
                except LedgerUnavailableError as exc:  # retried by the run's retry policy
                    logger.warning("ledger unavailable, unknown tool of %s not recorded yet: %s", own.task_id, exc)
                    raise ApplicationError(
                        str(exc), type=FailureType.LEDGER_UNAVAILABLE, category=ApplicationErrorCategory.BENIGN
                    ) from None

        return [record_unknown_tools]
