"""The ledger side of operator decisions: ``agentlease.apply_decision`` (after the binding and the signature are
checked: ``docs/decisions.md``, ``docs/security-operations.md``) and ``agentlease.record_refusal``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from agentlease.decisions.table import DECISIONS, LedgerDecision, LedgerRefusal
from agentlease.enums import DecisionKind, FailureType, TaskStatus
from agentlease.errors import (
    BindingRefusedError,
    LedgerUnavailableError,
    TaskClosedError,
    TaskMovedError,
    TaskNotFoundError,
)
from agentlease.ledger.decision_ids import DecisionUse, record_decision_id, record_replay
from agentlease.ledger.refusals import record_refusal as record_binding_refusal
from agentlease.ledger.store import Ledger
from agentlease.records import (
    SETTLED_BY_EARLIER_RECEIPT,
    SHARED_KEY_PREFIX,
    SettlementReceipt,
    TaskSpec,
    ToolOutcome,
    TraceLink,
)
from agentlease.runtime.names import APPLY_DECISION, RECORD_REFUSAL
from agentlease.runtime.payloads import activity_input
from agentlease.security.decision_auth import DecisionRefusedError, DecisionReplayedError, DecisionVerifier
from agentlease.security.redaction import redact
from agentlease.tools._binding import own_task, task_refusal

logger = logging.getLogger("agentlease.lease")


class DecisionActivities:
    """Registers ``agentlease.apply_decision`` over one ledger (``verifier`` default: the open mode, no keys)."""

    def __init__(
        self,
        ledger: Ledger,
        verifier: DecisionVerifier | None = None,
        *,
        approval_ttl: Callable[[str], timedelta] | None = None,
    ) -> None:
        self._ledger = ledger
        self._verifier = verifier or DecisionVerifier()
        self._approval_ttl = approval_ttl
        """How long an approval of a tool lasts (``None``: not known here; several approvals then never lapse
        before the claim checks them)."""

    def activities(self) -> list[Any]:
        ledger = self._ledger
        verifier = self._verifier

        @activity.defn(name=APPLY_DECISION)
        async def apply_decision(payload: dict[str, Any]) -> dict[str, Any]:
            decision = activity_input(LedgerDecision, payload, "malformed decision", FailureType.DECISION_REFUSED)
            if decision.kind is DecisionKind.APPROVE and self._approval_ttl is not None:
                ttl = self._approval_ttl(decision.task.tool)  # how long each of several approvals counts
                decision = decision.model_copy(update={"task": decision.task.model_copy(update={"approval_ttl": ttl})})
            await _bound(ledger, decision)
            try:
                signed_by = authenticate(verifier, decision)
            except DecisionRefusedError as exc:
                logger.warning("decision %s on %s refused: %s", decision.kind.value, decision.task.task_id, exc)
                raise _refused(f"decision refused: {exc}") from None
            try:
                outcome = await apply(ledger, decision, signed_by=signed_by)
                request = outcome.approval_request
                # The request goes back to the run only when it asks for several people (what it shows of them).
                several = request is not None and request.approvals_required > 1
                return outcome.model_dump(mode="json", exclude=None if several else {"approval_request"})
            except LedgerUnavailableError as exc:  # retried by the decision's retry policy
                logger.warning(
                    "ledger unavailable, decision %s on %s retried: %s", decision.kind.value, decision.task.task_id, exc
                )
                raise _unavailable(exc) from None

        @activity.defn(name=RECORD_REFUSAL)
        async def record_refusal(payload: dict[str, Any]) -> None:
            refusal = activity_input(LedgerRefusal, payload, "malformed refusal", FailureType.DECISION_REFUSED)
            if (unbound := _unbound(refusal.task)) is not None:  # another run's trail is not this workflow's
                raise _refused(str(unbound))
            try:
                await ledger.record_refused_decision(
                    refusal.task, decision=refusal.decision, by=refusal.by, refusal=refusal.refusal
                )
            except LedgerUnavailableError as exc:  # retried by the run's retry policy
                raise _unavailable(exc) from None

        return [apply_decision, record_refusal]


def _refused(message: str, details: Any = None) -> ApplicationError:
    """A non-retryable ``DecisionRefused`` failure (``details``: its one detail, if any)."""
    more = () if details is None else (details,)
    return ApplicationError(message, *more, type=FailureType.DECISION_REFUSED.value, non_retryable=True)


def _unavailable(exc: LedgerUnavailableError) -> ApplicationError:
    """A benign, retryable ``LedgerUnavailable`` failure: the decision's retry policy tries again."""
    return ApplicationError(str(exc), type=FailureType.LEDGER_UNAVAILABLE, category=ApplicationErrorCategory.BENIGN)


def _unbound(task: TaskSpec) -> BindingRefusedError | None:
    """Why ``task`` is not of the scheduling workflow's run (``docs/security-review.md``); ``None`` when it is."""
    workflow_id = activity.info().workflow_id
    why = task_refusal(workflow_id, task, shared_key=task.idempotency_key.startswith(SHARED_KEY_PREFIX))
    return None if why is None else BindingRefusedError(task.task_id, workflow_id, why)


async def _bound(ledger: Ledger, decision: LedgerDecision) -> None:
    """Refuse (and record) a decision on a task that is not of the scheduling workflow's run (``DecisionRefused``)."""
    task, workflow_id = decision.task, activity.info().workflow_id
    exc = _unbound(task)
    if exc is None:
        return
    logger.warning("%s (decision %s)", exc, decision.kind.value)
    own = None if workflow_id is None else own_task(workflow_id, task)
    if own is not None:
        await record_binding_refusal(
            ledger,
            own,
            f"{exc} (decision {decision.kind.value} by {decision.by})",
            details={"named_task_id": task.task_id, "decision": decision.kind.value},
            trace=_trace(),
        )
    raise _refused(str(exc))


def _trace() -> TraceLink:
    """The running activity's attempt, as the evidence trail links it."""
    info = activity.info()
    return TraceLink(
        workflow_id=info.workflow_id, run_id=info.workflow_run_id, activity_id=info.activity_id, attempt=info.attempt
    )


def _confirmed_receipt(decision: LedgerDecision) -> SettlementReceipt:
    """The receipt of a ``confirm``: what the operator observed, in their name."""
    return SettlementReceipt(
        external_system="reconciliation",
        external_id=decision.external_id or "",
        status="confirmed",
        details={"by": decision.by, "observed": decision.observed},
        verified_at=datetime.now(UTC),
    )


def authenticate(verifier: DecisionVerifier, decision: LedgerDecision) -> str | None:
    """The operator whose signature ``decision`` carries, checked (``None``: unsigned, open mode, or the run's
    own decisions: parking a call for approval, cancelling with its cancelled workflow); ``DecisionRefusedError``
    as :meth:`DecisionVerifier.verify` raises it."""
    if decision.kind is DecisionKind.AWAIT_APPROVAL or (decision.kind is DecisionKind.CANCEL and decision.run_own):
        return None
    rule = DECISIONS[decision.kind]
    expect: dict[str, Any] = {
        "command": rule.command,
        "step_id": decision.task.step_id,
        "by": decision.by,
        "reason": decision.reason,
    }
    if rule.action is not None:
        expect["action"] = rule.action
    if rule.settles:
        expect.update(external_id=decision.external_id, observed=decision.observed)
    at = activity.info().scheduled_time if activity.in_activity() else datetime.now(UTC)
    return verifier.verify(decision.task.agent_run_id, decision.signed, expect=expect, at=at)


async def apply(ledger: Ledger, decision: LedgerDecision, *, signed_by: str | None = None) -> ToolOutcome:
    """Apply one decision to the ledger, ``signed_by`` (the verified operator) recorded in the evidence trail.

    Raises:
        ApplicationError: non-retryable ``DecisionRefused``: the task is not in a status the decision applies
            to (the sweeper or another operator got there first), a signed decision's id was applied already by
            another activity (a replay, recorded once), or it was signed for a generation the task has left.
    """
    rule = DECISIONS[decision.kind]
    decision_id = decision.decision_id if signed_by else None
    if decision_id is not None:
        await _once(ledger, decision, decision_id, signed_by or "")
    try:
        record = await ledger.decide(
            decision.task.task_id,
            decision.kind,
            by=decision.by,
            reason=decision.reason,
            details={
                **({"observed": decision.observed} if decision.observed else {}),
                **(
                    {"rule": decision.rule.model_dump(mode="json", exclude_defaults=True)}
                    if decision.rule is not None
                    else {}
                ),
                # The signed request beside the name: the ledger's guard wants it, and anyone with the
                # operator's public key can check the entry again (decisions.verify_recorded).
                **(
                    {"signed_by": signed_by, "signed": decision.signed.model_dump(mode="json")}
                    if signed_by and decision.signed is not None
                    else {}
                ),
            }
            or None,
            receipt=_confirmed_receipt(decision) if rule.settles else None,
            spec=decision.task,
            expected_generation=decision.generation if decision_id is not None else None,
            approval_request=decision.request,
        )
    except TaskMovedError as exc:  # between the id's record and now (or a retry after it applied)
        if not await _in_trail(ledger, decision.task.task_id, decision_id or ""):
            logger.warning("decision %s %s refused: %s", decision.kind.value, decision_id, exc)
            raise _refused(f"decision refused: {exc}") from None
        record = await ledger.get_task(decision.task.task_id)
    except TaskClosedError as exc:
        record = await ledger.get_task(decision.task.task_id)
        if decision.kind is DecisionKind.AWAIT_APPROVAL and record.status is TaskStatus.SETTLED:
            # Its approved call settled before (a reset run asks again): the run settles the step from its receipt.
            return ToolOutcome.of(record).model_copy(update={"settled_by": SETTLED_BY_EARLIER_RECEIPT})
        if decision_id is not None and await _in_trail(ledger, decision.task.task_id, decision_id):
            return ToolOutcome.of(record)  # a retry of the activity that applied it
        if record.status not in (rule.to, rule.to_if_effect_unknown):
            raise _refused(str(exc)) from None
        if not (decision.run_own or decision.kind is DecisionKind.AWAIT_APPROVAL):
            # The status this decision leads to, but another's: a person who lost the race is told so, not "done".
            earlier = await _applied_decision(ledger, decision, verified=decision_id is not None)
            if earlier is not None:
                logger.warning("decision %s on %s refused: %s", decision.kind.value, decision.task.task_id, earlier)
                raise _refused(f"decision refused: {earlier}") from None
    except TaskNotFoundError as exc:
        raise _refused(str(exc)) from None
    return ToolOutcome.of(record)


def _use_of(decision: LedgerDecision, decision_id: str, operator: str) -> DecisionUse:
    """This use of a signed decision's id: its task, and the activity using it (``None`` outside one)."""
    info = activity.info() if activity.in_activity() else None
    return DecisionUse(
        decision_id=decision_id,
        task_id=decision.task.task_id,
        kind=decision.kind.value,
        operator=operator,
        generation=decision.generation,
        workflow_id=None if info is None else info.workflow_id,
        run_id=None if info is None else info.workflow_run_id,
        activity_id=None if info is None else info.activity_id,
    )


async def _once(ledger: Ledger, decision: LedgerDecision, decision_id: str, operator: str) -> None:
    """Record a signed decision's id before it is applied; refuse (``DecisionRefused``) a replay (recorded once
    in the trail) and a decision signed for a generation the task has left."""
    use = _use_of(decision, decision_id, operator)
    recorded = await record_decision_id(ledger, use)
    task_id = decision.task.task_id
    if recorded.moved:
        why = (
            f"the task moved on: this {decision.kind.value} was signed for generation {decision.generation} "
            f"of {task_id}, which is at generation {recorded.generation} now; look again and sign a new decision"
        )
        logger.warning("decision %s %s refused: %s", decision.kind.value, decision_id, why)
        raise _refused(f"decision refused: {why}")
    earlier = recorded.earlier
    if earlier is None or earlier.same_activity(use):
        return  # recorded now, or a Temporal retry of the activity that recorded it
    exc = DecisionReplayedError(decision_id, decision.kind.value, task_id, earlier.described())
    trace = _trace() if activity.in_activity() else None
    if await record_replay(ledger, decision.task, use, earlier, str(exc), trace=trace):
        logger.warning("%s", exc)
    raise _refused(f"decision refused: {exc}", {"refused": "replayed", "decision_id": decision_id})


async def _applied_decision(ledger: Ledger, decision: LedgerDecision, *, verified: bool) -> str | None:
    """Why ``decision`` is not among those that left its task where it is: the task's entries of its kind are
    others' (other operators, other reasons, other signed decisions); ``None`` when one is this decision's, a
    retry of the activity that applied it (``verified``: a signed decision, found by its id in ``apply``; else by
    its name and reason: an approval counted with others is one of several)."""
    kind = DECISIONS[decision.kind].event
    made = [e for e in await ledger.events(decision.task.task_id) if e.kind is kind]
    if not made:
        return None
    ours = (decision.by, redact(decision.reason))
    last = made[-1]
    # This round's entries only (the generation of the one that left the task where it is), not an earlier one's.
    this_round = [e for e in made if e.claim_generation == last.claim_generation]
    if not verified and any(((e.details or {}).get("by"), e.reason) == ours for e in this_round):
        return None
    return (
        f"another decision got there first: {decision.task.task_id} was {kind.value} by "
        f"{(last.details or {}).get('by')!r} ({last.reason}); this one changed nothing"
    )


async def _in_trail(ledger: Ledger, task_id: str, decision_id: str) -> bool:
    """Whether the task's trail holds the decision of ``decision_id`` as applied (a retry of the activity
    that applied it, after the task moved on)."""
    for event in await ledger.events(task_id):
        signed = (event.details or {}).get("signed")
        proof = signed.get("request", {}).get("proof") if isinstance(signed, dict) else None
        if isinstance(proof, dict) and proof.get("decision_id") == decision_id:
            return True
    return False
