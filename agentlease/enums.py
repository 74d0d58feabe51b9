"""The vocabulary of agentlease, defined once (DESIGN.md, "Vocabulary").

Every member says, in a short comment, what moves a task out of that state.
"""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    """Lifecycle of one task (one tool call of an agent run) in the ledger."""

    PENDING = "pending"
    """Known to the ledger, never claimed. Left by a claim (-> running) or a cancel."""
    AWAITING_APPROVAL = "awaiting_approval"
    """Waits for a person before its side effect. Left by approve (-> pending), reject, or a cancel."""
    RUNNING = "running"
    """An attempt holds a lease. Left by settle, release, dead-letter, cancel, or by a
    new claim once the lease has lapsed on the ledger's clock."""
    RELEASED = "released"
    """An attempt gave the task back for a retry (with an error class). Left by the next claim or a cancel."""
    BLOCKED = "blocked"
    """A credential is missing or revoked. Left by a redrive once access is repaired, or a cancel."""
    NEEDS_RECONCILIATION = "needs_reconciliation"
    """An unsafe side effect may have happened. Left by a human reconcile decision, or a cancel."""
    SETTLED = "settled"
    """A settlement receipt exists. Terminal: a settled task never runs again (G6)."""
    DEAD_LETTERED = "dead_lettered"
    """Moved out of circulation after a permanent error or too many real attempts, for inspection.
    Left by a redrive (-> released) or a cancel."""
    CANCELLED = "cancelled"
    """An operator cancelled it. Terminal: expiry never undoes it (G8)."""
    REJECTED = "rejected"
    """An operator rejected the call before its side effect. Terminal."""
    ABANDONED = "abandoned"
    """An operator reconciled an ambiguous task by abandoning it, with a note. Terminal."""

    @property
    def is_terminal(self) -> bool:
        """Settled, cancelled, rejected or abandoned: nothing moves it any more."""
        return self in _TERMINAL

    @property
    def awaits_decision(self) -> bool:
        """Awaiting approval, blocked, needing reconciliation or dead-lettered: no claim until a person decides."""
        return self in _AWAITS_DECISION


_TERMINAL = frozenset({TaskStatus.SETTLED, TaskStatus.CANCELLED, TaskStatus.REJECTED, TaskStatus.ABANDONED})
_AWAITS_DECISION = frozenset(
    {
        TaskStatus.AWAITING_APPROVAL,
        TaskStatus.BLOCKED,
        TaskStatus.NEEDS_RECONCILIATION,
        TaskStatus.DEAD_LETTERED,
    }
)


class Stage(StrEnum):
    """Stages of one tool call, in order (seed: "Retry policy belongs to the stage")."""

    PREFLIGHT = "preflight"
    """Checking inputs; no external side effect has started. Left by ``advance(external_call)``."""
    EXTERNAL_CALL = "external_call"
    """The request to the external system may be in flight. Left by ``advance(commit)``."""
    COMMIT = "commit"
    """The external target may already exist. Left by ``advance(verify)``."""
    VERIFY = "verify"
    """Reading the outcome back to build the receipt. Left by settling."""
    SETTLED = "settled"
    """The receipt is recorded. Final."""

    @property
    def order(self) -> int:
        return _STAGE_ORDER[self]


_STAGE_ORDER = {stage: index for index, stage in enumerate(Stage)}


class SideEffectClass(StrEnum):
    """What a tool does to the outside world (DESIGN.md, "side-effect class")."""

    READ_ONLY = "read_only"
    """No side effect: always safe to reclaim."""
    IDEMPOTENT = "idempotent"
    """The provider honours the idempotency key, or the target is deterministic."""
    FENCED = "fenced"
    """The downstream rejects writes that carry an older claim generation."""
    UNSAFE = "unsafe"
    """Neither: a repeat may duplicate the effect."""


class EventKind(StrEnum):
    """Kinds of entries in the evidence trail (``lease_events``)."""

    CLAIMED = "claimed"
    RENEWED = "renewed"
    RELEASED = "released"
    SETTLED = "settled"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"
    NEEDS_RECONCILIATION = "needs_reconciliation"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    REJECTED = "rejected"
    RECONCILED = "reconciled"
    """A person decided an ambiguous task: confirm (with a receipt), retry, or abandon."""
    REDRIVEN = "redriven"
    """A person sent a dead-lettered or blocked task back to work."""
    EXPIRED = "expired"
    """A lease lapsed without renewal; written for the old generation when it is superseded."""
    LEASE_LOST = "lease_lost"
    """A renewal or settle was refused: the holder's lease lapsed or was superseded."""
    LATE_UNAPPLIED = "late_unapplied"
    """A result arrived from a superseded attempt; recorded, never applied (G10)."""


class FailureType(StrEnum):
    """``ApplicationError.type`` values a leased activity raises and the workflow reads."""

    DEAD_LETTERED = "DeadLettered"
    """Non-retryable: the task was dead-lettered (permanent error or too many real attempts)."""
    TASK_CANCELLED = "TaskCancelled"
    """Non-retryable: an operator cancelled the task."""
    MISSING_HEARTBEAT_TIMEOUT = "MissingHeartbeatTimeout"
    """Non-retryable: the call was scheduled without a heartbeat timeout (G9)."""
    BLOCKED = "Blocked"
    """Non-retryable: a credential is missing or revoked; the task waits for access to be repaired."""
    NEEDS_RECONCILIATION = "NeedsReconciliation"
    """Non-retryable: an unsafe side effect may have happened; the task waits for a human decision."""
    LEASE_HELD = "LeaseHeld"
    """Retryable: an earlier attempt's lease is still valid; ``next_retry_delay`` is the time left."""
    LEASE_LOST = "LeaseLost"
    """Retryable: this attempt's lease lapsed or was superseded."""

    @classmethod
    def non_retryable(cls) -> list[str]:
        return [
            cls.DEAD_LETTERED.value,
            cls.TASK_CANCELLED.value,
            cls.MISSING_HEARTBEAT_TIMEOUT.value,
            cls.BLOCKED.value,
            cls.NEEDS_RECONCILIATION.value,
        ]
