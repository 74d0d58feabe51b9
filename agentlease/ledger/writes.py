"""The lease writes, each described once as a :class:`~agentlease.ledger.rendering.LeaseWrite` and rendered
for a dialect by :func:`lease_writes` (``docs/guarantees.md``, "One description per lease write"). ``now`` is
:func:`~agentlease.clock.bound_now_ms`; every value is a bound parameter, named where it is used."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Update,
    and_,
    bindparam,
    case,
    false,
    func,
    literal,
    not_,
    null,
    or_,
    tuple_,
    update,
)

from agentlease.clock import bound_now_ms, from_ms
from agentlease.decisions.table import DECISIONS
from agentlease.enums import DecisionKind, EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.rendering import (
    EVENT_DETAILS,
    RECEIPT,
    TRACE_COLUMNS,
    LeaseWrite,
    Made,
    Rendered,
    dialect_insert,
    evidence,
    json_with,
    receipt_from,
    render,
)
from agentlease.ledger.statements import new_task
from agentlease.ledger.tables import TASKS
from agentlease.ledger.trail import event_values
from agentlease.records import TraceLink

_T = TASKS.c

HELD_TASK = _T.task_id == bindparam("held_task_id", type_=_T.task_id.type)  # the held claim's task
HELD_OWNER = bindparam("held_owner", type_=_T.lease_owner.type)  # its owner (named also once a write cleared it)
KEY_TASK = _T.task_id == bindparam("key_task_id", type_=_T.task_id.type)  # a claim's or a decision's task


def one_of(column: Any, values: Any) -> ColumnElement[bool]:
    """``column IN (...)`` of constants (each one bound constant: no list parameter to expand)."""
    return column.in_([literal(value) for value in values])


def holds(now: ColumnElement[int]) -> ColumnElement[bool]:
    """The guard of every holder write (G2): the task runs under the held claim (owner, generation, the
    SHA-256 of its lease token) and its lease is valid at ``now``."""
    return and_(
        HELD_TASK,
        _T.status == TaskStatus.RUNNING.value,
        _T.lease_owner == HELD_OWNER,
        _T.claim_generation == bindparam("held_generation", type_=_T.claim_generation.type),
        _T.lease_token_sha256 == bindparam("held_token_sha256", type_=_T.lease_token_sha256.type),
        _T.lease_expires_at_ms > now,
    )


def furthest_stage(new_stage: ColumnElement[Any]) -> ColumnElement[Any]:
    """``new_stage`` if it lies beyond the recorded stage, else the recorded stage (G6: a later attempt that
    starts again at ``preflight`` does not erase an earlier ``commit``)."""

    def rank(expression: ColumnElement[Any]) -> ColumnElement[int]:
        return case({stage.value: stage.order for stage in Stage}, value=expression, else_=-1)

    return case((rank(new_stage) > rank(_T.stage), new_stage), else_=_T.stage)


def may_have_acted(row: Any) -> ColumnElement[bool]:
    """SQL of :meth:`SideEffectClass.may_have_acted` over ``row``'s side-effect class and stage."""
    pairs = [(c.value, s.value) for c in SideEffectClass for s in Stage if c.may_have_acted(s)]
    unstaged = [c.value for c in SideEffectClass if c.may_have_acted(None)]
    conditions: list[ColumnElement[bool]] = []
    if pairs:
        conditions.append(
            tuple_(row.c.side_effect_class, row.c.stage).in_([tuple_(literal(c), literal(s)) for c, s in pairs])
        )
    if unstaged:
        conditions.append(and_(row.c.stage.is_(None), one_of(row.c.side_effect_class, unstaged)))
    return or_(*conditions) if conditions else false()


def approval_needed() -> ColumnElement[bool]:
    """Whether a claim must consume an approval: one is required (``claim_needs_approval``), none was consumed,
    and no claim was ever granted (a task claimed before approvals were bound keeps going)."""
    return and_(
        bindparam("claim_needs_approval", type_=Boolean),
        _T.approval_consumed_generation.is_(None),
        _T.claim_generation == 0,
    )


def _approval_valid(now: ColumnElement[int]) -> ColumnElement[bool]:
    """An approval of this tool and these arguments, younger than the tool's approval TTL."""
    return and_(
        _T.approval_tool == bindparam("claim_tool", type_=_T.approval_tool.type),
        _T.approval_arguments_sha256 == bindparam("claim_arguments_sha256", type_=_T.approval_arguments_sha256.type),
        _T.approved_at_ms + bindparam("claim_approval_ttl_ms", type_=BigInteger) > now,
    )


def _lease_from(now: ColumnElement[int], ttl: ColumnElement[int]) -> dict[str, Any]:
    """The lease a claim grants, from ``now`` for ``ttl``."""
    return {
        "status": TaskStatus.RUNNING.value,
        "lease_owner": bindparam("lease_owner", type_=_T.lease_owner.type),
        "lease_token_sha256": bindparam("lease_token_sha256", type_=_T.lease_token_sha256.type),
        "lease_acquired_at_ms": now,
        "lease_expires_at_ms": now + ttl,
        **{column: bindparam(column, type_=_T[column].type) for column in TRACE_COLUMNS},
    }


def _ttl() -> ColumnElement[int]:
    """The task's lease TTL, or a shorter one the call gives (``lease_ttl_override_ms``)."""
    return func.coalesce(bindparam("lease_ttl_override_ms", type_=BigInteger), _T.lease_ttl_ms)


def _with_expiry(dialect: str, kind: EventKind, owner: Any = None) -> Made:
    """An entry of ``kind`` with the lease's new expiry in its details; ``owner``: default the row's."""

    def made(changed: Any) -> Any:
        details = json_with(dialect, EVENT_DETAILS, lease_expires_at_ms=changed.c.lease_expires_at_ms)
        return evidence(
            dialect, changed, kind, owner=changed.c.lease_owner if owner is None else owner, details=details
        )

    return made


def claim_new(dialect: str, now: ColumnElement[int]) -> LeaseWrite:
    """The claim of a task the ledger has not seen (G1, G3): its row inserted claimed (generation 1, attempt 1)
    unless it exists; the ``claimed`` entry; the row and its key's receipt come back."""
    change = (
        dialect_insert(dialect)(TASKS)
        .values(**new_task(now), **_lease_from(now, bindparam("lease_ttl_ms")), claim_generation=1, attempts=1)
        .on_conflict_do_nothing(index_elements=["task_id"])
        .returning(*TASKS.c)
    )
    key = _T.task_id == bindparam("task_id", type_=_T.task_id.type)
    return LeaseWrite(change, key, made=(_with_expiry(dialect, EventKind.CLAIMED),), reads_receipt=True)


def claim(dialect: str, now: ColumnElement[int]) -> LeaseWrite:
    """The claim of a task that exists (G1, G3) if claimable or its lease lapsed at ``now``: the next generation,
    an attempt counted, an approval consumed (:func:`approval_needed`). The caller reads the row first (locked)
    and records a lapsed lease's ``expired`` entry (:func:`expired_entry`) before the ``claimed`` one."""
    claimable = [status.value for status in TaskStatus if status.claimable]
    lapsed = and_(_T.status == TaskStatus.RUNNING.value, _T.lease_expires_at_ms <= now)
    consumed = case((approval_needed(), _T.claim_generation + 1), else_=_T.approval_consumed_generation)
    change = (
        update(TASKS)
        .where(KEY_TASK, or_(one_of(_T.status, claimable), lapsed), or_(not_(approval_needed()), _approval_valid(now)))
        .values(
            **_lease_from(now, _ttl()),
            approval_consumed_generation=consumed,
            claim_generation=_T.claim_generation + 1,
            attempts=_T.attempts + 1,
            error_class=None,
            updated_at_ms=now,
        )
        .returning(*TASKS.c)
    )
    return LeaseWrite(change, KEY_TASK, made=(_with_expiry(dialect, EventKind.CLAIMED),), reads_receipt=True)


def renew(dialect: str, now: ColumnElement[int]) -> LeaseWrite:
    """The holder's renewal (G2, G5): the lease extended by its TTL (or a shorter one), ``new_stage`` recorded
    unless an attempt reached further (G6); the ``renewed`` entry with the new expiry."""
    change = (
        update(TASKS)
        .where(holds(now))
        .values(
            lease_expires_at_ms=now + _ttl(),
            renewal_count=_T.renewal_count + 1,
            updated_at_ms=now,
            stage=furthest_stage(bindparam("new_stage", type_=_T.stage.type)),
        )
        .returning(_T.task_id, _T.claim_generation, _T.lease_expires_at_ms, _T.updated_at_ms, _T.stage)
    )
    return LeaseWrite(change, HELD_TASK, made=(_with_expiry(dialect, EventKind.RENEWED, HELD_OWNER),))


def settle(dialect: str, now: ColumnElement[int]) -> LeaseWrite:
    """The holder's settle (G2, G6): the receipt stored unless one stands for the key, the task settled with
    the one that stands, its lease ended; the ``settled`` entry."""
    change = (
        update(TASKS)
        .where(holds(now))
        .values(status=TaskStatus.SETTLED.value, stage=Stage.SETTLED.value, lease_expires_at_ms=None, updated_at_ms=now)
        .returning(_T.task_id, _T.claim_generation, _T.stage, _T.updated_at_ms, _T.renewal_count)
    )
    settled = partial(evidence, dialect, kind=EventKind.SETTLED, owner=HELD_OWNER)
    return LeaseWrite(change, HELD_TASK, made=(settled,), receipt_first=holds(now))


def end_lease(dialect: str, now: ColumnElement[int]) -> LeaseWrite:
    """The holder's release, dead-letter or park (G2): to ``status`` with ``error_class`` and ``last_error``,
    the lease ended, the attempt given back when ``attempts_returned`` is 1; an entry named like the status."""
    change = (
        update(TASKS)
        .where(holds(now))
        .values(
            status=bindparam("status", type_=_T.status.type),
            lease_owner=None,
            lease_expires_at_ms=None,
            error_class=bindparam("error_class", type_=_T.error_class.type),
            last_error=bindparam("last_error", type_=_T.last_error.type),
            updated_at_ms=now,
            attempts=_T.attempts - bindparam("attempts_returned", type_=_T.attempts.type),
        )
        .returning(_T.task_id, _T.claim_generation, _T.stage, _T.updated_at_ms, _T.status)
    )

    def ended(changed: Any) -> Any:
        return evidence(dialect, changed, changed.c.status, owner=HELD_OWNER)

    return LeaseWrite(change, HELD_TASK, made=(ended,))


def decision(dialect: str, now: ColumnElement[int], kind: DecisionKind) -> LeaseWrite:
    """A decision of :data:`~agentlease.decisions.table.DECISIONS` (G8), ending any claim; a settling one stores
    ``receipt`` unless one stands; its entry (``effect: unknown`` when it leaves the effect unknown)."""
    rule = DECISIONS[kind]

    def receipt(changed: Any) -> Any:
        stored: Any = receipt_from(
            dialect, changed, generation=changed.c.claim_generation, at_ms=changed.c.updated_at_ms
        )
        return stored.on_conflict_do_nothing(index_elements=["idempotency_key"])

    def decided(changed: Any) -> Any:
        details: Any = EVENT_DETAILS
        if rule.to_if_effect_unknown is not None:  # only a person can say whether the side effect happened
            details = case((may_have_acted(changed), json_with(dialect, details, effect="unknown")), else_=details)
        return evidence(dialect, changed, rule.event, owner=null(), details=details)

    return LeaseWrite(_decision_change(kind, now), KEY_TASK, made=(receipt, decided) if rule.settles else (decided,))


def _decision_change(kind: DecisionKind, now: ColumnElement[int]) -> Update:
    rule = DECISIONS[kind]
    status: Any = rule.to.value
    if rule.to_if_effect_unknown is not None:
        status = case((may_have_acted(TASKS), rule.to_if_effect_unknown.value), else_=rule.to.value)
    values: dict[str, Any] = {
        "status": status,
        "lease_owner": None,
        "lease_expires_at_ms": None,
        "error_class": None if rule.error_class is None else rule.error_class.value,
        "updated_at_ms": now,
    }
    if rule.restarts_attempts:
        values["attempts"] = 0
    if kind is DecisionKind.APPROVE:  # the approval of one execution: this tool, these arguments, now
        bound = {name: bindparam(name, type_=_T[name].type) for name in ("approval_tool", "approval_arguments_sha256")}
        counted = {name: bindparam(name, type_=_T[name].type) for name in ("approvals", "approval_expires_at_ms")}
        # Several approvers: the approval lasts as long as the first of them (``first_approved_at_ms``).
        first = func.coalesce(bindparam("first_approved_at_ms", type_=BigInteger), now)
        values.update(approved_at_ms=first, approval_consumed_generation=None, **bound, **counted)
    if kind is DecisionKind.AWAIT_APPROVAL:  # asked again: an earlier approval no longer counts
        values.update(
            approved_at_ms=None,
            approval_tool=None,
            approval_arguments_sha256=None,
            approval_consumed_generation=None,
            approvals=None,
            approval_expires_at_ms=None,
            approval_request=bindparam("approval_request", type_=_T.approval_request.type),
        )
    if rule.settles:
        values["receipt"] = RECEIPT
    if rule.to is TaskStatus.SETTLED:
        values["stage"] = Stage.SETTLED.value
    applies_to = sorted(status.value for status in rule.applies_to)
    return update(TASKS).where(KEY_TASK, one_of(_T.status, applies_to)).values(**values).returning(*TASKS.c)


def expired_entry(
    *,
    task_id: str,
    generation: int,
    owner: str | None,
    stage: str | None,
    expires_at_ms: int,
    at_ms: int,
    trace: TraceLink,
    by: str,
    outcome: str,
    **details: Any,
) -> dict[str, Any]:
    """The ``expired`` entry of a lapsed lease's generation, found ``by`` a takeover or the sweeper; ``outcome``:
    what became of it (``; sweeper: reclaim -> released``); ``details``: more facts."""
    return event_values(
        task_id=task_id,
        kind=EventKind.EXPIRED,
        generation=generation,
        at_ms=at_ms,
        owner=owner,
        stage=stage,
        reason=f"lease lapsed at {from_ms(expires_at_ms).isoformat()}{outcome}",
        details={"lease_expires_at_ms": expires_at_ms, "by": by, **details},
        trace=trace,
    )


@dataclass(frozen=True)
class LeaseWrites:
    """The lease writes of one dialect, rendered.

    Attributes:
        dialect: ``sqlite`` or ``postgresql``.
        claim_new / claim / renew / settle / end_lease: see the functions of the same names.
    """

    dialect: str
    claim_new: Rendered
    claim: Rendered
    renew: Rendered
    settle: Rendered
    end_lease: Rendered

    def decision(self, kind: DecisionKind) -> Rendered:
        """The write of :func:`decision` ``kind``, rendered on first use (most processes make none)."""
        return _rendered_decision(self.dialect, kind)


@cache
def lease_writes(dialect: str) -> LeaseWrites:
    """The lease writes for ``sqlite`` or ``postgresql``, built and rendered on first use.

    Raises:
        ValueError: unsupported dialect.
    """
    now = bound_now_ms(dialect)
    return LeaseWrites(
        dialect=dialect,
        claim_new=render(claim_new(dialect, now), dialect),
        claim=render(claim(dialect, now), dialect, alone=False),
        renew=render(renew(dialect, now), dialect),
        settle=render(settle(dialect, now), dialect),
        end_lease=render(end_lease(dialect, now), dialect),
    )


@cache
def _rendered_decision(dialect: str, kind: DecisionKind) -> Rendered:
    return render(decision(dialect, bound_now_ms(dialect), kind), dialect, alone=False)
