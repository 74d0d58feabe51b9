"""The ledger side of operator decisions: ``agentlease.apply_decision`` and ``agentlease.record_refusal``.

Each decision is one row of the decision table (:data:`agentlease.decisions.DECISIONS`), applied
by :meth:`Ledger.decide` as one conditional ledger write with an evidence entry naming who decided
and why. Applying a decision twice (a Temporal retry) is harmless: when the task already has the
decision's resulting status, the activity reports it as applied. A ``decide`` signal the run
refused is written as a ``decision_refused`` entry by ``agentlease.record_refusal``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from agentlease.decisions import DECISIONS, LedgerDecision, LedgerRefusal
from agentlease.enums import FailureType
from agentlease.errors import LedgerUnavailableError, TaskClosedError, TaskNotFoundError, describe_validation_error
from agentlease.ledger.store import Ledger
from agentlease.names import APPLY_DECISION, RECORD_REFUSAL
from agentlease.records import SettlementReceipt, ToolOutcome

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
            try:
                return (await apply(ledger, decision)).model_dump(mode="json")
            except LedgerUnavailableError as exc:  # retried by the decision's retry policy
                logger.warning(
                    "ledger unavailable, decision %s on %s retried: %s", decision.kind.value, decision.task.task_id, exc
                )
                raise ApplicationError(
                    str(exc), type=FailureType.LEDGER_UNAVAILABLE, category=ApplicationErrorCategory.BENIGN
                ) from None

        @activity.defn(name=RECORD_REFUSAL)
        async def record_refusal(payload: dict[str, Any]) -> None:
            try:
                refusal = LedgerRefusal.model_validate(payload)
            except ValidationError as exc:
                raise ApplicationError(
                    f"malformed refusal: {describe_validation_error(exc)}",
                    type=FailureType.DECISION_REFUSED.value,
                    non_retryable=True,
                ) from None
            try:
                await ledger.record_refused_decision(
                    refusal.task, decision=refusal.decision, by=refusal.by, refusal=refusal.refusal
                )
            except LedgerUnavailableError as exc:  # retried by the run's retry policy
                raise ApplicationError(
                    str(exc), type=FailureType.LEDGER_UNAVAILABLE, category=ApplicationErrorCategory.BENIGN
                ) from None

        return [apply_decision, record_refusal]


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
