"""The ledger side of operator decisions: one activity, ``agentlease.apply_decision``.

Each decision is one row of the decision table (:data:`agentlease.decisions.DECISIONS`), applied
by :meth:`Ledger.decide` as one conditional ledger write with an evidence entry naming who decided
and why. Applying a decision twice (a Temporal retry) is harmless: when the task already has the
decision's resulting status, the activity reports it as applied.

A decision is bound to the workflow that scheduled it, like a tool call (:mod:`activities.binding`):
one naming a task of another run is refused, non-retryably, and recorded on the scheduling workflow's
own task.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.binding import own_task, task_refusal
from agentlease.decisions import DECISIONS, LedgerDecision
from agentlease.enums import FailureType
from agentlease.errors import (
    BindingRefusedError,
    LedgerUnavailableError,
    TaskClosedError,
    TaskNotFoundError,
    describe_validation_error,
)
from agentlease.ledger.refusals import record_refusal
from agentlease.ledger.store import Ledger
from agentlease.names import APPLY_DECISION
from agentlease.records import SHARED_KEY_PREFIX, SettlementReceipt, ToolOutcome, TraceLink

logger = logging.getLogger("agentlease.lease")


class DecisionActivities:
    """Registers ``agentlease.apply_decision`` over one ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def activities(self) -> list[Any]:
        ledger = self._ledger

        @activity.defn(name=APPLY_DECISION)
        async def apply_decision(payload: dict[str, Any]) -> dict[str, Any]:
            try:
                decision = LedgerDecision.model_validate(payload)
            except ValidationError as exc:
                raise ApplicationError(
                    f"malformed decision: {describe_validation_error(exc)}",
                    type=FailureType.DECISION_REFUSED.value,
                    non_retryable=True,
                ) from None
            await _bound(ledger, decision)
            try:
                return (await apply(ledger, decision)).model_dump(mode="json")
            except LedgerUnavailableError as exc:  # retried by the decision's retry policy
                logger.warning(
                    "ledger unavailable, decision %s on %s retried: %s", decision.kind.value, decision.task.task_id, exc
                )
                raise ApplicationError(
                    str(exc), type=FailureType.LEDGER_UNAVAILABLE, category=ApplicationErrorCategory.BENIGN
                ) from None

        return [apply_decision]


async def _bound(ledger: Ledger, decision: LedgerDecision) -> None:
    """Refuse (and record) a decision on a task that is not of the scheduling workflow's run.

    Raises:
        ApplicationError: non-retryable ``DecisionRefused``.
    """
    info = activity.info()
    task = decision.task
    why = task_refusal(info.workflow_id, task, shared_key=task.idempotency_key.startswith(SHARED_KEY_PREFIX))
    if why is None:
        return
    exc = BindingRefusedError(task.task_id, info.workflow_id, why)
    logger.warning("%s (decision %s)", exc, decision.kind.value)
    own = None if info.workflow_id is None else own_task(info.workflow_id, task)
    if own is not None:
        trace = TraceLink(
            workflow_id=info.workflow_id,
            run_id=info.workflow_run_id,
            activity_id=info.activity_id,
            attempt=info.attempt,
        )
        await record_refusal(
            ledger,
            own,
            f"{exc} (decision {decision.kind.value} by {decision.by})",
            details={"named_task_id": task.task_id, "decision": decision.kind.value},
            trace=trace,
        )
    raise ApplicationError(str(exc), type=FailureType.DECISION_REFUSED, non_retryable=True)


def _confirmed_receipt(decision: LedgerDecision) -> SettlementReceipt:
    """The receipt of a ``confirm``: what the operator observed, in their name."""
    return SettlementReceipt(
        external_system="reconciliation",
        external_id=decision.external_id or "",
        status="confirmed",
        details={"by": decision.by, "observed": decision.observed},
        verified_at=datetime.now(UTC),
    )


async def apply(ledger: Ledger, decision: LedgerDecision) -> ToolOutcome:
    """Apply one decision to the ledger.

    Raises:
        ApplicationError: non-retryable ``DecisionRefused`` when the ledger's task is not in a
            status the decision applies to (say, the sweeper or another operator got there first).
    """
    rule = DECISIONS[decision.kind]
    try:
        record = await ledger.decide(
            decision.task.task_id,
            decision.kind,
            by=decision.by,
            reason=decision.reason,
            details={"observed": decision.observed} if decision.observed else None,
            receipt=_confirmed_receipt(decision) if rule.settles else None,
            spec=decision.task,
        )
    except TaskClosedError as exc:
        record = await ledger.get_task(decision.task.task_id)
        if record.status is not rule.to:
            raise ApplicationError(str(exc), type=FailureType.DECISION_REFUSED, non_retryable=True) from None
    except TaskNotFoundError as exc:
        raise ApplicationError(str(exc), type=FailureType.DECISION_REFUSED, non_retryable=True) from None
    return ToolOutcome.of(record)
