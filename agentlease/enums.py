"""The vocabulary of agentlease, defined once (``docs/vocabulary.md``, ``docs/state-machine.md``); every mapping
between two vocabularies is a property of one of them."""

from __future__ import annotations

from enum import StrEnum
from typing import Self


class _Parsed(StrEnum):
    @classmethod
    def parse(cls, value: str | None) -> Self | None:
        """The member whose value is ``value``; ``None`` for no value or one this version does not know."""
        try:
            return None if value is None else cls(value)
        except ValueError:
            return None


class TaskStatus(StrEnum):
    """Lifecycle of one task (one tool call of an agent run) in the ledger."""

    PENDING = "pending"
    """Not claimed yet (or approved): left by a claim, the run parking an approval-gated call, or a cancel."""
    AWAITING_APPROVAL = "awaiting_approval"
    """Waits for a person before its side effect: left by approve (-> pending), reject, or a cancel."""
    RUNNING = "running"
    """An attempt holds a lease: left by settle, release, dead-letter, park, cancel, or a new claim (or the
    sweeper) once the lease has lapsed on the ledger's clock."""
    RELEASED = "released"
    """An attempt gave the task back for a retry, with an error class: left by the next claim or a cancel."""
    BLOCKED = "blocked"
    """A credential is missing or revoked: left by a redrive once access is repaired, or a cancel."""
    NEEDS_RECONCILIATION = "needs_reconciliation"
    """An unsafe side effect may have happened: left by a reconcile decision, or a cancel."""
    SETTLED = "settled"
    """A settlement receipt exists: terminal, a settled task never runs again (G6)."""
    DEAD_LETTERED = "dead_lettered"
    """Out of circulation for inspection (a permanent error, too many real attempts): left by a redrive or a cancel."""
    CANCELLED = "cancelled"
    """An operator cancelled it: terminal, expiry never undoes it (G8)."""
    CANCELLED_EFFECT_UNKNOWN = "cancelled_effect_unknown"
    """Cancelled (terminal, G8) after its side effect may have happened, and listed by ``agentlease waiting``
    until a person records what happened (reconcile confirm or abandon -> cancelled)."""
    REJECTED = "rejected"
    """An operator rejected the call before its side effect: terminal."""
    ABANDONED = "abandoned"
    """An operator abandoned an ambiguous task, with a note: terminal."""

    @property
    def is_terminal(self) -> bool:
        """Settled, cancelled (effect unknown too), rejected or abandoned: no attempt runs it again."""
        return self in _TERMINAL

    @property
    def is_cancelled(self) -> bool:
        """Cancelled by an operator, whether or not its effect is known."""
        return self in (TaskStatus.CANCELLED, TaskStatus.CANCELLED_EFFECT_UNKNOWN)

    @property
    def awaits_decision(self) -> bool:
        """Awaiting approval, blocked, needing reconciliation or dead-lettered: the run waits for a person."""
        return self in _AWAITS_DECISION

    @property
    def waits_for_person(self) -> bool:
        """Listed by ``agentlease waiting``: a decision is awaited, or a cancelled task's effect is unknown."""
        return self.awaits_decision or self is TaskStatus.CANCELLED_EFFECT_UNKNOWN

    @property
    def claimable(self) -> bool:
        """Pending or released: a claim may take it without waiting for a lease to lapse."""
        return self in _CLAIMABLE

    @property
    def failure_type(self) -> FailureType | None:
        """The non-retryable activity failure that reports a task parked in this status, if any."""
        return _FAILURE_OF_STATUS.get(self)


_TERMINAL = frozenset(
    {
        TaskStatus.SETTLED,
        TaskStatus.CANCELLED,
        TaskStatus.CANCELLED_EFFECT_UNKNOWN,
        TaskStatus.REJECTED,
        TaskStatus.ABANDONED,
    }
)
_AWAITS_DECISION = frozenset(
    {TaskStatus.AWAITING_APPROVAL, TaskStatus.BLOCKED, TaskStatus.NEEDS_RECONCILIATION, TaskStatus.DEAD_LETTERED}
)
_CLAIMABLE = frozenset({TaskStatus.PENDING, TaskStatus.RELEASED})


class StepEnd(StrEnum):
    """How a step of a run ended when the ledger has no status for it (the workflow reports these only)."""

    FAILED = "failed"
    """The step failed in a way no decision can mend (a tool no worker serves): final."""
    SKIPPED = "skipped"
    """A later step of a run that failed, never started: final."""

    # Like TaskStatus's: nothing moves a failed or skipped step, no decision applies, a cancel is a ledger status.
    @property
    def is_terminal(self) -> bool:
        return True

    @property
    def awaits_decision(self) -> bool:
        return False

    @property
    def is_cancelled(self) -> bool:
        return False


StepStatus = TaskStatus | StepEnd
"""The status of one step as a run reports it: the ledger's status, or how the step ended outside it."""


class RunState(StrEnum):
    """Status of one agent run, reported by the ``status`` query and the ``AgentLeaseStatus`` search attribute."""

    STARTING = "starting"
    """Learning the worker's tools: left once it knows them (-> running) or names an unknown one (-> failed)."""
    RUNNING = "running"
    """Working on its steps: left when a step waits for a person, or every step is final."""
    WAITING = "waiting"
    """A step waits for a person (``AgentLeaseWaitingReason``): left by that person's decision."""
    COMPLETED = "completed"
    """Every step reached a final status (settled, or decided: rejected, abandoned, cancelled): final."""
    CANCELLED = "cancelled"
    """An operator cancelled the whole run: final."""
    FAILED = "failed"
    """A step failed in a way no decision can mend (an unknown tool): final."""

    @property
    def ended(self) -> bool:
        """Completed, cancelled or failed: the run takes no more steps or decisions."""
        return self in (RunState.COMPLETED, RunState.CANCELLED, RunState.FAILED)


class LedgerRunState(StrEnum):
    """What the ledger can tell of an agent run from its tasks (``agentlease runs``, the web view). It knows the
    run's tool calls, not its workflow: whether the run itself goes on is :class:`RunState` (``agentlease status``).
    """

    RUNNING = "running"
    """A task of the run is not final yet."""
    WAITING = "waiting"
    """A task of the run waits for a person."""
    TASKS_FINAL = "tasks_final"
    """Every task the ledger holds of the run is final; the run may still be going (an agent between tool calls,
    a plan before its next step) or have ended."""
    FAILED = "failed"
    """A step of the run names a tool no worker serves: the run failed before calling it."""

    @classmethod
    def of(cls, *, failed: bool, waiting: int, unfinished: int) -> LedgerRunState:
        """The state of a run whose tasks: a step ``failed`` before its call, ``waiting`` wait for a person,
        ``unfinished`` are not final."""
        if failed:
            return cls.FAILED
        return cls.WAITING if waiting else cls.RUNNING if unfinished else cls.TASKS_FINAL


class Stage(StrEnum):
    """Stages of one tool call, in order (``docs/recovery.md``, "Stage-aware retry")."""

    PREFLIGHT = "preflight"
    """Checking inputs, no external side effect started: left by ``advance(external_call)``."""
    EXTERNAL_CALL = "external_call"
    """The request to the external system may be in flight: left by ``advance(commit)``."""
    COMMIT = "commit"
    """The external target may already exist: left by ``advance(verify)``."""
    VERIFY = "verify"
    """Reading the outcome back to build the receipt: left by settling."""
    SETTLED = "settled"
    """The receipt is recorded: final."""

    @property
    def order(self) -> int:
        """Position in the stage order, 0 (``preflight``) to 4 (``settled``)."""
        return _STAGE_ORDER[self]

    @property
    def crossed_external_call(self) -> bool:
        """Whether a side effect may have started: ``external_call`` or later."""
        return self.order >= _STAGE_ORDER[Stage.EXTERNAL_CALL]


_STAGE_ORDER = {stage: index for index, stage in enumerate(Stage)}


class SideEffectClass(StrEnum):
    """What a tool does to the outside world (``docs/vocabulary.md``, "side-effect class")."""

    READ_ONLY = "read_only"
    """No side effect: always safe to reclaim."""
    IDEMPOTENT = "idempotent"
    """The provider honours the idempotency key, or the target is deterministic."""
    FENCED = "fenced"
    """The downstream rejects writes that carry an older claim generation."""
    UNSAFE = "unsafe"
    """Neither, so a repeat may duplicate the effect: never retried past ``external_call`` without a
    reconciliation decision (G7)."""

    def effect_unknown(self, stage: Stage | None) -> bool:
        """Whether only a person can say if the side effect happened: ``unsafe``, past ``external_call`` (G7)."""
        return self is SideEffectClass.UNSAFE and stage is not None and stage.crossed_external_call

    def may_have_acted(self, stage: Stage | None) -> bool:
        """Whether a tool of this class at recorded ``stage`` may have acted at the downstream: it writes, past
        ``external_call`` (a cancel then leaves ``cancelled_effect_unknown``; the ledger's cancel renders it as SQL)."""
        return self is not SideEffectClass.READ_ONLY and stage is not None and stage.crossed_external_call


class EventKind(StrEnum):
    """Kinds of entries in the evidence trail (``lease_events``)."""

    CLAIMED = "claimed"
    """An attempt was granted a lease with a new generation."""
    RENEWED = "renewed"
    """The holder extended its lease, with its stage and a reason."""
    RELEASED = "released"
    """The holder gave the task back for a retry, with an error class."""
    SETTLED = "settled"
    """The holder settled with a receipt."""
    DEAD_LETTERED = "dead_lettered"
    """The task left circulation for inspection."""
    CANCELLED = "cancelled"
    """An operator cancelled the task; its claim ended."""
    BLOCKED = "blocked"
    """The task waits until access is repaired."""
    NEEDS_RECONCILIATION = "needs_reconciliation"
    """The task waits for a person to decide an ambiguous side effect."""
    AWAITING_APPROVAL = "awaiting_approval"
    """The task waits for an operator's approval before it runs."""
    APPROVED = "approved"
    """An operator approved the call."""
    REJECTED = "rejected"
    """An operator rejected the call; it never runs."""
    RECONCILED = "reconciled"
    """A person decided an ambiguous task: confirm (with a receipt), retry, or abandon."""
    REDRIVEN = "redriven"
    """A person sent a dead-lettered or blocked task back to work."""
    EXPIRED = "expired"
    """A lease lapsed without renewal; written for the old generation when it is superseded or swept."""
    LEASE_LOST = "lease_lost"
    """A renewal or release was refused: the holder's lease lapsed or was superseded."""
    LATE_UNAPPLIED = "late_unapplied"
    """A result arrived from a superseded attempt; recorded, never applied (G10)."""
    DECISION_REFUSED = "decision_refused"
    """A decision sent as a signal was refused (the decision table does not allow it); nothing changed."""
    APPROVAL_REFUSED = "approval_refused"
    """A claim of an approval-gated task found no approval it may consume (none, expired, for other
    arguments or another tool), so the task went back to ``awaiting_approval`` and nothing ran."""
    APPROVAL_EXPIRING = "approval_expiring"
    """An approval not yet consumed (given, or the first of several still being gathered) lapses soon: the
    sweeper's warning, once per approval, while there is time to act on it; nothing else changes."""


class ErrorClass(_Parsed):
    """How the previous attempt ended, as the ledger records it (``tasks.error_class``)."""

    RETRYABLE = "retryable"
    """A transient failure (timeout, 5xx): the next attempt follows the stage table."""
    PERMANENT = "permanent"
    """Deterministic, so retrying cannot help: the task is dead-lettered."""
    CREDENTIAL = "credential"
    """Missing or revoked credential: the task is blocked."""
    AMBIGUOUS = "ambiguous"
    """The tool could not tell whether its side effect happened."""
    IN_DOUBT = "in_doubt"
    """The downstream holds the call's key in doubt (it may have taken effect): the task waits for its probe
    or a person, whatever its class (``docs/edge.md``)."""
    SHUTDOWN = "shutdown"
    """Released because its worker shut down: a release for lack of capacity, not a real attempt."""
    EXPIRED = "expired"
    """The lease lapsed without renewal (found by a takeover or the sweeper)."""
    CANCELLED = "cancelled"
    """An operator cancelled the task."""
    OPERATOR_RETRY = "operator_retry"
    """A person reconciled an ambiguous task with ``retry``: one more attempt with the same key."""
    REDRIVEN = "redriven"
    """A person sent a dead-lettered or blocked task back to work (its attempt budget restarts)."""
    PAUSED = "paused"
    """Released because an operator paused the activity in Temporal: not a real attempt."""
    RESET = "reset"
    """Released because an operator reset the activity in Temporal: not a real attempt."""
    TIMED_OUT = "timed_out"
    """Released because Temporal timed the attempt out while its tool still ran (it did not renew in time)."""
    LEDGER_UNAVAILABLE = "ledger_unavailable"
    """Released because the ledger could not be reached mid-attempt (no new side effect started): not a real attempt."""
    HEARTBEAT_TIMEOUT_CHANGED = "heartbeat_timeout_changed"
    """Released because Temporal timed the attempt out on a heartbeat timeout an operator changed to one its
    heartbeats could not keep: not a real attempt (``docs/ttl.md``)."""

    @property
    def counts_as_attempt(self) -> bool:
        """Whether a release with this class used up one of the tool's real attempts (not one below)."""
        return self not in _GIVES_ATTEMPT_BACK


_GIVES_ATTEMPT_BACK = frozenset(
    {
        ErrorClass.SHUTDOWN,
        ErrorClass.PAUSED,
        ErrorClass.RESET,
        ErrorClass.LEDGER_UNAVAILABLE,
        ErrorClass.HEARTBEAT_TIMEOUT_CHANGED,
    }
)


class Interruption(StrEnum):
    """Why Temporal cancelled a running attempt, recorded with the release it causes (``details.cause``)."""

    PAUSED = "paused"
    """``temporal activity pause``: the attempt is given back; the next one starts on unpause."""
    RESET = "reset"
    """``temporal activity reset``: the attempt is given back, the claim generation goes on growing (G3)."""
    SHUTDOWN = "shutdown"
    """The worker shuts down (SIGTERM past the grace): the attempt is given back."""
    TIMED_OUT = "timed_out"
    """Temporal timed the attempt out (heartbeat or start-to-close) while the tool still ran."""
    HEARTBEAT_TIMEOUT_CHANGED = "heartbeat_timeout_changed"
    """Temporal timed the attempt out on a heartbeat timeout an operator shortened: the attempt is given back."""
    CANCELLED = "cancelled"
    """Anything else: the workflow cancelled the activity, or Temporal no longer knows the attempt."""

    @property
    def error_class(self) -> ErrorClass:
        """The error class the release records: the one of the same name, ``retryable`` for ``cancelled``."""
        return ErrorClass.RETRYABLE if self is Interruption.CANCELLED else ErrorClass(self.value)


class RecoveryAction(StrEnum):
    """The recovery decision for the next attempt (``docs/recovery.md``)."""

    RUN = "run"
    """Nothing happened before: run normally."""
    RETRY = "retry"
    """No external side effect started (or the tool only reads): run again."""
    RETRY_SAME_KEY = "retry_same_key"
    """Run again with the same idempotency key."""
    READ_BACK_FIRST = "read_back_first"
    """The target may already exist: read back, and write only if it does not."""
    RETRY_READBACK = "retry_readback"
    """The side effect likely completed: only read back."""
    RECONCILE = "reconcile"
    """Ambiguous side effect of an unsafe tool: wait for a human decision (G7)."""
    DEAD_LETTER = "dead_letter"
    """Out of circulation for inspection."""
    BLOCK = "block"
    """Wait until access is repaired."""
    STAY_CANCELLED = "stay_cancelled"
    """An operator's decision; never undone by expiry (G8)."""
    NEVER_RERUN = "never_rerun"
    """A receipt exists: settle from it (G6)."""

    @property
    def runs_tool(self) -> bool:
        """Whether the tool's code runs in this attempt."""
        return self in _RUNS_TOOL

    @property
    def reads_back_first(self) -> bool:
        """Whether the tool must read the target back before it writes (an earlier attempt reached ``commit``)."""
        return self in (RecoveryAction.READ_BACK_FIRST, RecoveryAction.RETRY_READBACK)

    @property
    def parks_as(self) -> TaskStatus | None:
        """The status a task is parked in until a person decides; ``None`` for actions that do not park."""
        return _PARKED_STATUS.get(self)


_RUNS_TOOL = frozenset(
    {
        RecoveryAction.RUN,
        RecoveryAction.RETRY,
        RecoveryAction.RETRY_SAME_KEY,
        RecoveryAction.READ_BACK_FIRST,
        RecoveryAction.RETRY_READBACK,
    }
)
_PARKED_STATUS = {
    RecoveryAction.RECONCILE: TaskStatus.NEEDS_RECONCILIATION,
    RecoveryAction.DEAD_LETTER: TaskStatus.DEAD_LETTERED,
    RecoveryAction.BLOCK: TaskStatus.BLOCKED,
}


class FailureType(_Parsed):
    """``ApplicationError.type`` values of agentlease's own failures, raised by activities and workflows."""

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
    """Retryable: an earlier attempt's lease is still valid, ``next_retry_delay`` the time left."""
    LEASE_LOST = "LeaseLost"
    """Retryable: this attempt's lease lapsed or was superseded (a refused settle is ``late_unapplied``)."""
    LEDGER_UNAVAILABLE = "LedgerUnavailable"
    """Retryable: the ledger could not be reached; what could not be written is recorded once it is back."""
    CLOCK_BEHIND = "ClockBehind"
    """Retryable: a SQLite ledger refused the claim: this process's clock runs behind its latest time (G1)."""
    INTERRUPTED = "Interrupted"
    """Retryable: Temporal paused, reset or timed out the attempt, and its lease was released with the cause."""
    TASK_CLOSED = "TaskClosed"
    """Non-retryable: the task is rejected or abandoned, or waits for approval, as the failure's details say."""
    INVALID_PLAN = "InvalidPlan"
    """Non-retryable: a run's input is not a valid plan; the run fails at once with what is wrong."""
    INVALID_TOOL_CALL = "InvalidToolCall"
    """Non-retryable: a leased activity's input is not a valid tool call; nothing was recorded."""
    DECISION_REFUSED = "DecisionRefused"
    """Non-retryable: the ledger's task is not in a status the operator's decision applies to."""
    UNKNOWN_TOOL = "UnknownTool"
    """Non-retryable: a run names a tool no worker on its task queue serves."""
    LEDGER_REFUSED_VALUE = "LedgerRefusedValue"
    """Non-retryable: the ledger database refused a value of the call (too long for its column...)."""

    @property
    def status(self) -> TaskStatus | None:
        """The ledger status a task has when an attempt fails with this type; ``None`` if it says no status."""
        return _STATUS_OF_FAILURE.get(self)

    @classmethod
    def non_retryable(cls) -> list[str]:
        """The types a leased activity's retry policy never retries."""
        return [
            cls.MISSING_HEARTBEAT_TIMEOUT.value,
            cls.TASK_CLOSED.value,
            cls.INVALID_TOOL_CALL.value,
            cls.LEDGER_REFUSED_VALUE.value,
            *(failure.value for failure in _STATUS_OF_FAILURE),
        ]


_STATUS_OF_FAILURE = {
    FailureType.DEAD_LETTERED: TaskStatus.DEAD_LETTERED,
    FailureType.TASK_CANCELLED: TaskStatus.CANCELLED,
    FailureType.BLOCKED: TaskStatus.BLOCKED,
    FailureType.NEEDS_RECONCILIATION: TaskStatus.NEEDS_RECONCILIATION,
}
_FAILURE_OF_STATUS = {status: failure for failure, status in _STATUS_OF_FAILURE.items()}


class ProbeAnswer(StrEnum):
    """What a tool's readback probe says of an action that may have happened (``docs/action-keys-and-probes.md``):
    confirmed, not applied, inconclusive, or a conflict."""

    HAPPENED = "happened"
    """Confirmed: the downstream shows the action; the task settles from the probe's receipt, no person involved."""
    NOT_HAPPENED = "not_happened"
    """Not applied: the downstream shows no such action. Asked again while the tool's settle window since the
    write lasts; after it, the attempt runs the tool again with the same key."""
    CANNOT_TELL = "cannot_tell"
    """Inconclusive: the downstream cannot say (or the probe failed); the task waits for a person."""
    CONFLICT = "conflict"
    """The downstream holds the key with other arguments: never run again; the task waits for a person, with the
    probe's evidence."""


class DecisionKind(StrEnum):
    """What a person (or the run, for ``await_approval``) decides about one task (``decisions.table.DECISIONS``)."""

    AWAIT_APPROVAL = "await_approval"
    """The run parks an approval-gated call before it runs (pending -> awaiting_approval)."""
    APPROVE = "approve"
    """Let an approval-gated call run (awaiting_approval -> pending)."""
    REJECT = "reject"
    """Refuse an approval-gated call; it never runs (awaiting_approval -> rejected)."""
    CONFIRM = "confirm"
    """Reconcile: the side effect happened; a receipt is written from what was observed (-> settled)."""
    RETRY = "retry"
    """Reconcile: run once more with the same idempotency key (-> released)."""
    ABANDON = "abandon"
    """Reconcile: leave it undone, with a note (-> abandoned)."""
    REDRIVE = "redrive"
    """Send a dead-lettered or blocked task back to work; its attempt budget restarts (-> released)."""
    CANCEL = "cancel"
    """Cancel a task that is not final, ending its claim (-> cancelled, or cancelled_effect_unknown when its
    side effect may have happened)."""
    CONFIRM_EFFECT = "confirm_effect"
    """Reconcile a cancelled task whose effect was unknown as happened, with a receipt of what was observed
    (cancelled_effect_unknown -> cancelled)."""
    ABANDON_EFFECT = "abandon_effect"
    """Reconcile a cancelled task whose effect was unknown as not happened, with a note
    (cancelled_effect_unknown -> cancelled)."""
