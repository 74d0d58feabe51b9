"""Operator decisions: the payloads of ``AgentRunWorkflow``'s decision updates, and what the
ledger is asked to do with each (seed 1, "Recovery needs a policy": reconciliation, block, dead
letter, human cancellation).

Every decision names who made it (``by``) and why (``reason``); both go into the evidence trail.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentlease.records import TaskSpec

_Who = Field(min_length=1, max_length=200)
_Why = Field(min_length=1, max_length=2000)


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DecisionRequest(_Request):
    """``approve``, ``reject`` and ``redrive`` of one step.

    Attributes:
        step_id: the step decided on.
        by: who decides (operator name).
        reason: why.
    """

    step_id: str = Field(min_length=1)
    by: str = _Who
    reason: str = _Why


class ReconcileRequest(DecisionRequest):
    """``reconcile`` a step that needs a decision.

    Attributes:
        action: ``confirm`` (the side effect happened: a receipt is written from ``external_id``
            and ``observed``), ``retry`` (once more, with the same idempotency key), or
            ``abandon`` (it stays undone; ``reason`` is the note).
        external_id: required with ``confirm``: the external system's id of the outcome.
        observed: with ``confirm``: what the operator saw (JSON object).
    """

    action: Literal["confirm", "retry", "abandon"]
    external_id: str | None = Field(default=None, min_length=1)
    observed: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _confirm_needs_external_id(self) -> ReconcileRequest:
        if self.action == "confirm" and not self.external_id:
            raise ValueError("confirm needs the external_id of the outcome")
        return self


class CancelRequest(_Request):
    """``cancel`` one step, or the whole run when ``step_id`` is omitted."""

    step_id: str | None = Field(default=None, min_length=1)
    by: str = _Who
    reason: str = _Why


class DecisionKind(StrEnum):
    """What the ledger does for a decision (see ``activities/decisions.py``)."""

    AWAIT_APPROVAL = "await_approval"
    APPROVE = "approve"
    REJECT = "reject"
    CONFIRM = "confirm"
    RETRY = "retry"
    ABANDON = "abandon"
    REDRIVE = "redrive"
    CANCEL = "cancel"


class LedgerDecision(_Request):
    """Input of the ``agentlease.apply_decision`` activity."""

    kind: DecisionKind
    task: TaskSpec
    by: str
    reason: str
    external_id: str | None = None
    observed: dict[str, Any] = Field(default_factory=dict)
