"""Operator decisions: the one decision table (:data:`DECISIONS`, ``docs/decisions.md``), which the ledger applies,
the update validators check and ``agentlease waiting`` offers, and the payloads that carry a decision.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentlease import limits
from agentlease.enums import DecisionKind, ErrorClass, EventKind, TaskStatus
from agentlease.records import ApprovalRequest, ApprovalRule, TaskSpec
from agentlease.security.decision_auth import DecisionProof, SignedDecision, verify_recorded_signature

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

_Who = Field(min_length=1, max_length=limits.MAX_WHO_CHARS)
_Why = Field(min_length=1, max_length=limits.MAX_WHY_CHARS)
_StepRef = Field(min_length=1, max_length=limits.MAX_STEP_ID_CHARS)


@dataclass(frozen=True)
class DecisionRule:
    """One row of the decision table.

    Attributes:
        command: the workflow update and ``agentlease`` command that makes it (``None``: the run makes it).
        applies_to / to / event: the ledger statuses it applies to (any other is refused), the status it leaves,
            the evidence-trail entry it writes.
        error_class: recorded with it, read by the next attempt's recovery policy (``None``: cleared).
        restarts_attempts: the task's real-attempt count goes back to 0.
        settles: it writes a receipt from what the operator observed (stage ``settled`` only if ``to`` is).
        action: the ``--action`` of ``agentlease reconcile`` that makes it (``None`` for other commands).
        to_if_effect_unknown: the status it leaves instead when the side effect may have happened
            (:meth:`SideEffectClass.may_have_acted`).
    """

    kind: DecisionKind
    command: str | None
    applies_to: frozenset[TaskStatus]
    to: TaskStatus
    event: EventKind
    error_class: ErrorClass | None = None
    restarts_attempts: bool = False
    settles: bool = False
    action: str | None = None
    to_if_effect_unknown: TaskStatus | None = None

    def allows(self, status: object) -> bool:
        """Whether a task (or a run's view of a step) in ``status`` may take this decision."""
        return status in self.applies_to


RUN_DECIDER = "agentlease"
"""Who the evidence trail names for what a run decides itself: parking an approval-gated call, cancelling its
calls when its workflow is cancelled, recording a step whose tool no worker serves."""


def _rule(
    kind: DecisionKind,
    command: str | None,
    applies_to: Iterable[TaskStatus],
    to: TaskStatus,
    event: EventKind,
    **more: Any,
) -> tuple[DecisionKind, DecisionRule]:
    return kind, DecisionRule(kind, command, frozenset(applies_to), to, event, **more)


_OPEN = [status for status in TaskStatus if not status.is_terminal]
_RECONCILE = "reconcile"

DECISIONS: dict[DecisionKind, DecisionRule] = dict(
    [
        _rule(
            DecisionKind.AWAIT_APPROVAL,
            None,
            [TaskStatus.PENDING],
            TaskStatus.AWAITING_APPROVAL,
            EventKind.AWAITING_APPROVAL,
        ),
        _rule(DecisionKind.APPROVE, "approve", [TaskStatus.AWAITING_APPROVAL], TaskStatus.PENDING, EventKind.APPROVED),
        _rule(DecisionKind.REJECT, "reject", [TaskStatus.AWAITING_APPROVAL], TaskStatus.REJECTED, EventKind.REJECTED),
        _rule(
            DecisionKind.CONFIRM,
            _RECONCILE,
            [TaskStatus.NEEDS_RECONCILIATION],
            TaskStatus.SETTLED,
            EventKind.RECONCILED,
            settles=True,
            action="confirm",
        ),
        _rule(
            DecisionKind.RETRY,
            _RECONCILE,
            [TaskStatus.NEEDS_RECONCILIATION],
            TaskStatus.RELEASED,
            EventKind.RECONCILED,
            error_class=ErrorClass.OPERATOR_RETRY,
            action="retry",
        ),
        _rule(
            DecisionKind.ABANDON,
            _RECONCILE,
            [TaskStatus.NEEDS_RECONCILIATION],
            TaskStatus.ABANDONED,
            EventKind.RECONCILED,
            action="abandon",
        ),
        _rule(
            DecisionKind.REDRIVE,
            "redrive",
            [TaskStatus.DEAD_LETTERED, TaskStatus.BLOCKED],
            TaskStatus.RELEASED,
            EventKind.REDRIVEN,
            error_class=ErrorClass.REDRIVEN,
            restarts_attempts=True,
        ),
        _rule(
            DecisionKind.CANCEL,
            "cancel",
            _OPEN,
            TaskStatus.CANCELLED,
            EventKind.CANCELLED,
            error_class=ErrorClass.CANCELLED,
            to_if_effect_unknown=TaskStatus.CANCELLED_EFFECT_UNKNOWN,
        ),
        # After a cancel of a write that may have acted (past external_call): record what happened; it stays cancelled.
        _rule(
            DecisionKind.CONFIRM_EFFECT,
            _RECONCILE,
            [TaskStatus.CANCELLED_EFFECT_UNKNOWN],
            TaskStatus.CANCELLED,
            EventKind.RECONCILED,
            error_class=ErrorClass.CANCELLED,
            settles=True,
            action="confirm",
        ),
        _rule(
            DecisionKind.ABANDON_EFFECT,
            _RECONCILE,
            [TaskStatus.CANCELLED_EFFECT_UNKNOWN],
            TaskStatus.CANCELLED,
            EventKind.RECONCILED,
            error_class=ErrorClass.CANCELLED,
            action="abandon",
        ),
    ]
)
"""The decision table: every decision, what it applies to and what it does."""

RECONCILE_ACTIONS: tuple[str, ...] = tuple(
    dict.fromkeys(r.action for r in DECISIONS.values() if r.command == _RECONCILE and r.action is not None)
)
"""The ``--action`` values of ``reconcile``: confirm, retry, abandon."""

WAITING_NOTES = {TaskStatus.BLOCKED: "repair access, then"}
"""What must happen before a decision helps, per status (shown by ``agentlease waiting``)."""

WAITING_WHY = {
    TaskStatus.CANCELLED_EFFECT_UNKNOWN: "cancelled, but its side effect may have happened (effect unknown); "
    "record what happened, the cancel stands"
}
"""Why a task in this status is listed by ``agentlease waiting``, when its last error does not say it."""


def reconcile_kind(action: str, status: object) -> DecisionKind | None:
    """The decision ``reconcile --action <action>`` makes on a task (or a run's step) in ``status``;
    ``None`` when the table has none for that status."""
    for rule in DECISIONS.values():
        if rule.command == _RECONCILE and rule.action == action and rule.allows(status):
            return rule.kind
    return None


def offered(status: TaskStatus) -> list[DecisionRule]:
    """The operator decisions that apply to a task in ``status``, one per command, in table order."""
    seen: dict[str, DecisionRule] = {}
    for rule in DECISIONS.values():
        if rule.command is not None and rule.allows(status):
            seen.setdefault(rule.command, rule)
    return list(seen.values())


def suggested_commands(
    status: TaskStatus, agent_run_id: str, step_id: str, request: ApprovalRequest | None = None
) -> list[str]:
    """The ``agentlease`` command lines that decide a task waiting in ``status`` (cancel last); ``approve`` names
    the fingerprint of the arguments of ``request``, the call the person was asked to approve. Each argument is
    quoted for a POSIX shell, and a run id beginning with ``-`` follows ``--`` (``docs/decisions.md``)."""
    actions = [a for a in RECONCILE_ACTIONS if reconcile_kind(a, status) is not None]
    lines = []
    for rule in sorted(offered(status), key=lambda r: r.kind is DecisionKind.CANCEL):
        action = f" --action {shlex.quote('|'.join(actions))}" if rule.command == _RECONCILE else ""
        if rule.kind is DecisionKind.APPROVE and request is not None:
            action = f" --arguments-sha256 {request.arguments_sha256}"
        note = f"{WAITING_NOTES[status]} " if status in WAITING_NOTES and rule.kind is not DecisionKind.CANCEL else ""
        options = f"{action} --by WHO --reason WHY"
        lines.append(note + command_line(str(rule.command), agent_run_id, shlex.quote(step_id), options))
    return lines


def command_line(command: str, agent_run_id: str, step: str, options: str) -> str:
    """``agentlease COMMAND RUN STEP OPTIONS`` for a POSIX shell: the run id quoted (it may hold anything; ``step``
    and ``options``, each option after a space, as given), after ``--`` when it begins with ``-``, which would be
    read as an option."""
    run = shlex.quote(agent_run_id)
    if agent_run_id.startswith("-"):
        return f"agentlease {command}{options} -- {run} {step}"
    return f"agentlease {command} {run} {step}{options}"


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("step_id", "by", "reason", check_fields=False)
    @classmethod
    def _clean_text(cls, value: str | None) -> str | None:  # no NUL byte, no lone surrogate (docs/limits.md)
        return None if value is None else limits.check_text(value)


class DecisionRequest(_Request):
    """Payload of ``approve``, ``reject`` and ``redrive`` of one step.

    Attributes:
        by / reason: who decides (1 to 200 characters) and why (1 to 2000).
        proof: the operator's signature (:mod:`agentlease.security.decision_auth`); required when authenticated.
        arguments_sha256: with ``approve``: the fingerprint of the arguments the person saw
            (:func:`~agentlease.records.arguments_fingerprint`), refused when the step's are other; omitted: the
            step's as the run holds them. The approval is bound to it; the ledger checks it at the claim.
    """

    step_id: str = _StepRef
    by: str = _Who
    reason: str = _Why
    proof: DecisionProof | None = None
    arguments_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class ReconcileRequest(DecisionRequest):
    """Payload of ``reconcile`` of a step: ``action`` ``confirm`` (it happened: a receipt is written from
    ``external_id``, required, at most 1024 characters, and ``observed``, a JSON object of at most 16 KiB and 32
    levels), ``retry`` (once more, same key) or ``abandon`` (it stays undone; ``reason`` is the note)."""

    action: Literal["confirm", "retry", "abandon"]
    external_id: str | None = Field(default=None, min_length=1, max_length=limits.MAX_EXTERNAL_ID_CHARS)
    observed: dict[str, Any] = Field(default_factory=dict)

    @field_validator("external_id")
    @classmethod
    def _clean_external_id(cls, value: str | None) -> str | None:
        return None if value is None else limits.check_text(value)

    @field_validator("observed")
    @classmethod
    def _bounded_observed(cls, value: dict[str, Any]) -> dict[str, Any]:
        return limits.check_json(value, max_bytes=limits.MAX_OBSERVED_BYTES)

    @model_validator(mode="after")
    def _confirm_needs_external_id(self) -> ReconcileRequest:
        if self.action == DecisionKind.CONFIRM.value and not self.external_id:
            raise ValueError("confirm needs the external_id of the outcome")
        return self

    def kind_for(self, status: object) -> DecisionKind | None:
        """The decision this reconcile makes on a step in ``status`` (``None``: none applies)."""
        return reconcile_kind(self.action, status)


class CancelRequest(_Request):
    """Payload of ``cancel`` of one step, or of the whole run when ``step_id`` is omitted."""

    step_id: str | None = Field(default=None, min_length=1, max_length=limits.MAX_STEP_ID_CHARS)
    by: str = _Who
    reason: str = _Why
    proof: DecisionProof | None = None


class LedgerDecision(_Request):
    """Input of the ``agentlease.apply_decision`` activity: a decision (:data:`DECISIONS`) on one task.

    Attributes:
        task: the task's identity, to create it in the ledger if it is not there yet.
        signed: the operator's signed request, checked by the activity (``None``: unsigned); its proof
            carries the decision's id and the generation the operator saw.
        run_own: a ``cancel`` the run makes itself because Temporal cancelled its workflow (workflow code
            only, so no signature needed). Default false.
        request: with ``await_approval``: the call the person is asked to approve. Default ``None``.
        rule: for ``await_approval``, the tool's :class:`~agentlease.records.ApprovalRule` that asked for a
            person, written to the trail (``details.rule``). Default ``None``: none, or the tool always asks.
    """

    kind: DecisionKind
    task: TaskSpec
    by: str
    reason: str
    external_id: str | None = None
    observed: dict[str, Any] = Field(default_factory=dict)
    signed: SignedDecision | None = None
    run_own: bool = False
    request: ApprovalRequest | None = None
    rule: ApprovalRule | None = None

    @property
    def decision_id(self) -> str | None:
        """The id the operator signed with the decision, recorded once in the ledger; ``None``: unsigned."""
        return None if self.signed is None else self.signed.decision_id

    @property
    def generation(self) -> int | None:
        """The task's claim generation the operator saw when signing (``None``: unsigned, or not bound)."""
        proof = None if self.signed is None else self.signed.proof
        return None if proof is None else proof.generation


class LedgerRefusal(BaseModel):
    """A refused ``decide`` signal (its ``task``, the ``decision`` as sent, ``by`` if it said, and the run's
    ``refusal``), as the ``agentlease.record_refusal`` activity takes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: TaskSpec
    decision: str = Field(max_length=50)
    by: str | None = Field(default=None, max_length=200)
    refusal: str = Field(min_length=1, max_length=2000)


def verify_recorded(
    agent_run_id: str,
    details: Mapping[str, Any],
    keys: Mapping[str, Ed25519PublicKey],
    *,
    step_id: str,
    kind: EventKind | str,
) -> bool:
    """Whether an evidence entry of step ``step_id`` and kind ``kind`` is an operator's signed decision: the
    signature beside it verifies for ``agent_run_id``, the signed request names this step (or none: a whole-run
    cancel), and its command makes an entry of this kind (``docs/security-review.md``). ``keys``: operator public
    keys by name (:func:`~agentlease.security.decision_auth.load_public_keys`).
    """
    signed = details.get("signed")
    request = signed.get("request") if isinstance(signed, Mapping) else None
    if not isinstance(signed, Mapping) or not isinstance(request, Mapping):
        return False
    named = request.get("step_id")
    if named is not None and named != step_id:
        return False
    made = {rule.event.value for rule in DECISIONS.values() if rule.command == signed.get("command")}
    if str(getattr(kind, "value", kind)) not in made:
        return False
    return verify_recorded_signature(agent_run_id, details, keys)
