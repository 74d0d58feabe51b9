"""``agentlease.record_unknown_tools``: the steps of a failing run whose tool no worker serves, in the ledger.

Scheduled by a plan run just before it fails with ``UnknownTool`` (:mod:`agentlease.unknown_tools`).
Each step is recorded on the scheduling workflow's own task, ``task_id_for(<workflow id>, <step id>)``
(never a task the input names), as ``cancelled`` by ``agentlease`` with the reason
(:func:`~agentlease.ledger.refusals.record_unknown_tool`); recording it again changes nothing.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from agentlease.enums import FailureType, SideEffectClass
from agentlease.errors import LedgerUnavailableError
from agentlease.ledger.refusals import record_unknown_tool
from agentlease.ledger.store import Ledger
from agentlease.records import TaskSpec, TraceLink, idempotency_key_for, task_id_for
from agentlease.tools._payloads import activity_input
from agentlease.unknown_tools import RECORD_UNKNOWN_TOOLS, UnknownTools

logger = logging.getLogger("agentlease.lease")

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


__all__ = ["RECORDED_LEASE_TTL", "UnknownToolActivities"]
