"""The ledger side of operator decisions: one activity, ``agentlease.apply_decision``.

Each decision is one conditional ledger transition (``Ledger.transition``) with an evidence entry
naming who decided and why. Applying a decision twice (a Temporal retry) is harmless: when the
task already has the decision's status, the activity reports it as applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from agentlease.decisions import DecisionKind, LedgerDecision
from agentlease.enums import EventKind, TaskStatus
from agentlease.errors import TaskClosedError, TaskNotFoundError
from agentlease.ledger.store import Ledger
from agentlease.records import SettlementReceipt, ToolOutcome
from reconciliation.policy import ErrorClass
from workflows.agent_run import APPLY_DECISION, DECISION_REFUSED



@dataclass(frozen=True)
class _Rule:
    allowed: frozenset[TaskStatus]
    to: TaskStatus
    kind: EventKind
    values: dict[str, Any]


_RULES: dict[DecisionKind, _Rule] = {
    DecisionKind.AWAIT_APPROVAL: _Rule(
        frozenset({TaskStatus.PENDING}), TaskStatus.AWAITING_APPROVAL, EventKind.AWAITING_APPROVAL, {}
    ),
    DecisionKind.APPROVE: _Rule(
        frozenset({TaskStatus.AWAITING_APPROVAL}), TaskStatus.PENDING, EventKind.APPROVED, {}
    ),
    DecisionKind.REJECT: _Rule(
        frozenset({TaskStatus.AWAITING_APPROVAL}), TaskStatus.REJECTED, EventKind.REJECTED, {}
    ),
    DecisionKind.CONFIRM: _Rule(
        frozenset({TaskStatus.NEEDS_RECONCILIATION}), TaskStatus.SETTLED, EventKind.RECONCILED, {}
    ),
    DecisionKind.RETRY: _Rule(
        frozenset({TaskStatus.NEEDS_RECONCILIATION}),
        TaskStatus.RELEASED,
        EventKind.RECONCILED,
        {"error_class": ErrorClass.OPERATOR_RETRY.value},
    ),
    DecisionKind.ABANDON: _Rule(
        frozenset({TaskStatus.NEEDS_RECONCILIATION}), TaskStatus.ABANDONED, EventKind.RECONCILED, {}
    ),
    DecisionKind.REDRIVE: _Rule(
        frozenset({TaskStatus.DEAD_LETTERED, TaskStatus.BLOCKED}),
        TaskStatus.RELEASED,
        EventKind.REDRIVEN,
        {"error_class": ErrorClass.REDRIVEN.value, "attempts": 0},
    ),
    DecisionKind.CANCEL: _Rule(
        frozenset(s for s in TaskStatus if not s.is_terminal), TaskStatus.CANCELLED, EventKind.CANCELLED, {}
    ),
}


class DecisionActivities:
    """Registers ``agentlease.apply_decision`` over one ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def activities(self) -> list[Any]:
        ledger = self._ledger

        @activity.defn(name=APPLY_DECISION)
        async def apply_decision(decision: LedgerDecision) -> ToolOutcome:
            return await apply(ledger, decision)

        return [apply_decision]


async def apply(ledger: Ledger, decision: LedgerDecision) -> ToolOutcome:
    """Apply one decision to the ledger.

    Raises:
        ApplicationError: non-retryable ``DecisionRefused`` when the ledger's task is not in a
            status the decision applies to (say, the sweeper or another operator got there first).
    """
    rule = _RULES[decision.kind]
    receipt = None
    if decision.kind is DecisionKind.CONFIRM:
        receipt = SettlementReceipt(
            external_system="reconciliation",
            external_id=decision.external_id or "",
            status="confirmed",
            details={"by": decision.by, "observed": decision.observed},
            verified_at=datetime.now(UTC),
        )
    try:
        record = await ledger.transition(
            decision.task.task_id,
            allowed=rule.allowed,
            to=rule.to,
            kind=rule.kind,
            by=decision.by,
            reason=decision.reason,
            values=rule.values,
            details={"decision": decision.kind.value, **({"observed": decision.observed} if decision.observed else {})},
            receipt=receipt,
            spec=decision.task,
        )
    except TaskClosedError as exc:
        record = await ledger.get_task(decision.task.task_id)
        if record.status is not rule.to:
            raise ApplicationError(str(exc), type=DECISION_REFUSED, non_retryable=True) from None
    except TaskNotFoundError as exc:
        raise ApplicationError(str(exc), type=DECISION_REFUSED, non_retryable=True) from None
    return ToolOutcome.of(record)
