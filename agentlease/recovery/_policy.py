"""The recovery policy: what happens after an attempt ended badly (pure functions, no I/O). The two tables of
``docs/recovery.md`` (stage-aware retry, recovery classification) become one decision, taken at the start of
every attempt from the ledger's record of the previous one (``docs/recovery.md``, "How decide() combines them").
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from agentlease.enums import ErrorClass, RecoveryAction, SideEffectClass, Stage
from agentlease.errors import (
    AmbiguousSideEffectError,
    CredentialToolError,
    EffectInDoubtError,
    PermanentToolError,
)


@dataclass(frozen=True)
class RecoveryDecision:
    """A decision (``action``) and the ``rule``, the table row that decided, quoted for the evidence trail."""

    action: RecoveryAction
    rule: str

    @property
    def read_back_first(self) -> bool:
        """Whether the tool must read its target back before writing: an earlier attempt reached ``commit``."""
        return self.action.reads_back_first


def decide(
    side_effect_class: SideEffectClass,
    last_stage: Stage | None,
    *,
    receipt_present: bool,
    error_class: ErrorClass | None,
    real_attempts: int,
    max_attempts: int,
) -> RecoveryDecision:
    """Decide how the next attempt proceeds. Never retries an ``unsafe`` tool whose previous attempt may have
    crossed ``external_call`` (G7); never reruns a settled task (G6).

    Args:
        last_stage: the last durable stage of the previous attempt (``None``: never started).
        receipt_present: a settlement receipt exists for the idempotency key.
        error_class: how the previous attempt ended (``None``: not cleanly, its lease lapsed, or none ran).
        real_attempts: attempts that really ran the tool before this one (capacity releases excluded).
        max_attempts: the tool's limit of real attempts.

    Raises:
        ValueError: ``max_attempts`` < 1 or ``real_attempts`` < 0.
    """
    if max_attempts < 1 or real_attempts < 0:
        raise ValueError("max_attempts must be >= 1 and real_attempts >= 0")
    if receipt_present or last_stage is Stage.SETTLED:
        return RecoveryDecision(RecoveryAction.NEVER_RERUN, "settled: do not rerun, receipt exists")
    if error_class is ErrorClass.CANCELLED:
        return RecoveryDecision(RecoveryAction.STAY_CANCELLED, "human cancellation: keep cancelled")
    if error_class is ErrorClass.CREDENTIAL:
        return RecoveryDecision(RecoveryAction.BLOCK, "missing or revoked credential: block until access is repaired")
    if error_class is ErrorClass.OPERATOR_RETRY:
        return RecoveryDecision(
            RecoveryAction.RETRY_SAME_KEY, "reconciled by a person: retry with the same idempotency key"
        )
    if error_class is ErrorClass.IN_DOUBT:
        return RecoveryDecision(
            RecoveryAction.RECONCILE,
            "the downstream holds the call's key in doubt: it may have taken effect; pause for reconciliation",
        )
    if side_effect_class.effect_unknown(last_stage):
        return RecoveryDecision(
            RecoveryAction.RECONCILE, "ambiguous non-idempotent side effect: pause for reconciliation"
        )
    if error_class is ErrorClass.PERMANENT:
        return RecoveryDecision(RecoveryAction.DEAD_LETTER, "deterministic failure: dead-letter for inspection")
    if real_attempts >= max_attempts:
        if side_effect_class.may_have_acted(last_stage):
            return RecoveryDecision(
                RecoveryAction.RECONCILE,
                f"repeated failure after the call may have reached the downstream: {real_attempts} real attempts "
                f"reached the limit of {max_attempts}; its effect may be in place, pause for reconciliation",
            )
        return RecoveryDecision(
            RecoveryAction.DEAD_LETTER,
            f"repeated failure: {real_attempts} real attempts reached the limit of {max_attempts}",
        )
    if last_stage is None and real_attempts == 0:
        return RecoveryDecision(RecoveryAction.RUN, "first attempt")
    if side_effect_class is SideEffectClass.READ_ONLY:
        return RecoveryDecision(RecoveryAction.RETRY, "read-only work: reclaim automatically")
    if last_stage in (None, Stage.PREFLIGHT):
        return RecoveryDecision(RecoveryAction.RETRY, "preflight: no external side effect started")
    if last_stage is Stage.EXTERNAL_CALL:
        return RecoveryDecision(RecoveryAction.RETRY_SAME_KEY, "external_call: retry with the same idempotency key")
    if last_stage is Stage.COMMIT:
        return RecoveryDecision(RecoveryAction.READ_BACK_FIRST, "commit: the target may already exist, read back first")
    return RecoveryDecision(
        RecoveryAction.RETRY_READBACK, "verify: the side effect likely completed, retry the readback"
    )


def decide_after_probe(error_class: ErrorClass | None, *, real_attempts: int, max_attempts: int) -> RecoveryDecision:
    """How an attempt goes on when the tool's readback probe found that the action did NOT happen: the rest of
    the policy applies (G7 withheld the retry only because nobody could say), ``docs/recovery.md``. The arguments
    as for :func:`decide`."""
    if error_class is ErrorClass.IN_DOUBT:
        return RecoveryDecision(
            RecoveryAction.RECONCILE,
            "the probe says the action did not happen, but the downstream holds its key in doubt: "
            "resolve the key there, then reconcile",
        )
    if error_class is ErrorClass.PERMANENT:
        return RecoveryDecision(RecoveryAction.DEAD_LETTER, "deterministic failure: dead-letter for inspection")
    if real_attempts >= max_attempts:
        return RecoveryDecision(
            RecoveryAction.DEAD_LETTER,
            f"repeated failure: {real_attempts} real attempts reached the limit of {max_attempts}",
        )
    return RecoveryDecision(
        RecoveryAction.RETRY_SAME_KEY, "probe: the action did not happen; retry with the same idempotency key"
    )


def classify(exc: BaseException) -> ErrorClass:
    """The error class of an exception a tool raised: permanent (``PermanentToolError``, invalid arguments),
    credential, in doubt, ambiguous, or else retryable."""
    if isinstance(exc, PermanentToolError | ValidationError):
        return ErrorClass.PERMANENT
    if isinstance(exc, CredentialToolError):
        return ErrorClass.CREDENTIAL
    if isinstance(exc, EffectInDoubtError):
        return ErrorClass.IN_DOUBT
    if isinstance(exc, AmbiguousSideEffectError):
        return ErrorClass.AMBIGUOUS
    return ErrorClass.RETRYABLE
