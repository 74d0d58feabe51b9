"""Every statement of the ledger, built once per dialect with bound parameters.

A lease write runs on every claim, stage change and settle, so its statement is built once and
executed with a parameter dict: SQLAlchemy then neither rebuilds the expression nor recomputes its
cache key per call. The SQL is what :mod:`agentlease.ledger.store` documents: each lease write is
one conditional statement judged on the database's clock, and its row count is checked.

Parameter names (bound, never chosen by SQL text):

- ``now_ms``: the injected time (:func:`agentlease.clock.now_param`); ``None`` = database clock.
- ``held_task_id``, ``held_owner``, ``held_generation``, ``held_token_sha256``: the claim a holder
  write is guarded by (G2), its lease token's hash among them (``docs/security.md``, "Lease tokens").
- ``key_task_id``: the task a claim, decision or read is about.
- ``task_id`` and column names: values written.
- ``claim_needs_approval``, ``claim_tool``, ``claim_arguments_sha256``, ``claim_approval_ttl_ms``: what the
  claim of an approval-gated task must find (:func:`approval_needed`, ``docs/recovery.md``, "Approvals").
- ``lease_ttl_override_ms``: a renewal's shorter TTL (Temporal's changed heartbeat timeout); ``None``:
  the task's own.
- ``approval_arguments_sha256``, ``approval_tool``: what an ``approve`` decision binds the approval to.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Insert,
    Select,
    Update,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    not_,
    null,
    or_,
    select,
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite

from agentlease.clock import bound_now_ms
from agentlease.decisions import DECISIONS
from agentlease.enums import DecisionKind, EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.tables import EVENTS, RECEIPTS, TASKS, WAITING_PREDICATE
from agentlease.records import TraceLink

_T = TASKS.c
_E = EVENTS.c

_TRACE_COLUMNS = tuple(TraceLink().columns())


def token_sha256(token: str) -> str:
    """The SHA-256 (hex) of a lease token: what the ledger stores and compares; ``""`` for no token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest() if token else ""


def held(claim_task_id: str, owner: str, generation: int, token_sha256: str = "") -> dict[str, Any]:
    """The guard parameters of a holder write for the claim (task, owner, generation, lease token hash)."""
    return {
        "held_task_id": claim_task_id,
        "held_owner": owner,
        "held_generation": generation,
        "held_token_sha256": token_sha256,
    }


def _stage_rank(expression: ColumnElement[Any]) -> ColumnElement[int]:
    """The stage order of ``expression`` in SQL; -1 for ``NULL`` (no stage recorded yet)."""
    return case({stage.value: stage.order for stage in Stage}, value=expression, else_=-1)


def furthest_stage(new_stage: ColumnElement[Any]) -> ColumnElement[Any]:
    """``new_stage`` if it lies beyond the recorded stage, else the recorded stage (G6).

    The ledger keeps the furthest stage any attempt reached: a later attempt that starts again at
    ``preflight`` must not erase an earlier ``commit``, whoever calls the renewal.
    """
    return case((_stage_rank(new_stage) > _stage_rank(_T.stage), new_stage), else_=_T.stage)


@dataclass(frozen=True)
class LeaseStatements:
    """The prebuilt statements of one dialect.

    Attributes:
        now: the current time expression (bound ``now_ms`` or the database clock).
        insert_task: create a task row on first sight (``ON CONFLICT DO NOTHING``).
        current_task: the task row of ``key_task_id`` (locked ``FOR UPDATE`` on PostgreSQL).
        claim: the claim UPDATE minting ``claim_generation + 1`` (G1, G3), and consuming the approval of
            an approval-gated task (:func:`approval_needed`); RETURNING the row.
        renew: the holder's renewal; ``new_stage`` (``None`` keeps the stage) never lowers the
            recorded stage (G6); RETURNING expiry.
        settle: the holder's settle with ``receipt``; RETURNING ``updated_at_ms``, ``renewal_count``.
        end_lease: release / dead-letter / park with ``status``, ``error_class``, ``last_error``
            and ``attempts_returned`` (0 or 1).
        refused: why a holder write touched no row: ``now_ms``, ``claim_generation``, ``status``,
            ``lease_owner``, ``lease_token_sha256``.
        insert_event: one evidence-trail entry (every column as a parameter).
        insert_receipt: store a receipt unless one stands for the key; RETURNING the key if stored.
        select_receipt: the receipt of ``key_idempotency_key``.
        select_task: the row of ``key_task_id``.
        set_receipt: the ``receipt`` column of ``key_task_id`` (the receipt that stands for its key).
        decisions: per decision kind, the conditional UPDATE of :data:`~agentlease.decisions.DECISIONS`
            (``receipt`` bound for a decision that settles); RETURNING the row.
        latest_event_at: ``at_ms`` of the newest evidence entry (the ledger's latest recorded time).
        select_now: the current time (``now_ms``) alone.
        clock_check: ``clock_ms`` (the current time) and ``latest_ms`` (:attr:`latest_event_at`) in one
            row: a SQLite claim's clock check (:func:`~agentlease.ledger.outages.check_claim_clock`).
        expired_first: running tasks whose lease lapsed, oldest lapse first, ``limit`` rows.
        expired_after: the same after the keyset cursor ``after_expires_at_ms`` / ``after_task_id``.
        claim_new: the claim of a task the ledger has not seen: its row inserted already claimed
            (generation 1, attempt 1), ``ON CONFLICT DO NOTHING`` (a task that exists is claimed
            by ``claim``); RETURNING the row.
        refuse_approval: an approval-gated task whose claim found no approval it may consume goes back
            to ``awaiting_approval`` (from ``pending``); RETURNING ``updated_at_ms``.
        claim_new_evidenced, renew_evidenced, settle_evidenced: PostgreSQL only (``None`` on
            SQLite): ``claim_new``, ``renew`` and ``settle`` with their evidence entry (and for a
            claim the stored receipt, for a settle the receipt row) in the same statement, through
            data-modifying CTEs; one round trip instead of three or four. See :func:`_evidenced`.
    """

    now: ColumnElement[int]
    insert_task: Insert
    current_task: Select[Any]
    claim: Update
    renew: Update
    settle: Update
    end_lease: Update
    refused: Select[Any]
    insert_event: Insert
    insert_receipt: Insert
    select_receipt: Select[Any]
    select_task: Select[Any]
    set_receipt: Update
    decisions: dict[DecisionKind, Update]
    latest_event_at: Select[Any]
    select_now: Select[Any]
    clock_check: Select[Any]
    expired_first: Select[Any]
    expired_after: Select[Any]
    claim_new: Insert
    refuse_approval: Update
    claim_new_evidenced: Select[Any] | None
    renew_evidenced: Select[Any] | None
    settle_evidenced: Select[Any] | None


def _new_task(now: ColumnElement[int]) -> dict[str, Any]:
    """The values of a task row the ledger sees for the first time (identity, TTL, times)."""
    return {
        **{name: bindparam(name, type_=_T[name].type) for name in ("task_id", "agent_run_id", "step_id", "tool")},
        "side_effect_class": bindparam("side_effect_class", type_=_T.side_effect_class.type),
        "idempotency_key": bindparam("idempotency_key", type_=_T.idempotency_key.type),
        "arguments_sha256": bindparam("arguments_sha256", type_=_T.arguments_sha256.type),
        "lease_ttl_ms": bindparam("lease_ttl_ms", type_=_T.lease_ttl_ms.type),
        "renewal_count": 0,
        "created_at_ms": now,
        "updated_at_ms": now,
    }


def approval_needed() -> ColumnElement[bool]:
    """Whether a claim must consume an approval: the task requires one (bound ``claim_needs_approval``),
    none was consumed, and no claim was ever granted (a task claimed before approvals were bound to one
    execution keeps going, as it did)."""
    return and_(
        bindparam("claim_needs_approval", type_=Boolean),
        _T.approval_consumed_generation.is_(None),
        _T.claim_generation == 0,
    )


def _approval_valid(now: ColumnElement[int]) -> ColumnElement[bool]:
    """An approval the claim may consume: of this tool, these arguments, younger than the tool's approval TTL."""
    return and_(
        _T.approval_tool == bindparam("claim_tool", type_=_T.approval_tool.type),
        _T.approval_arguments_sha256 == bindparam("claim_arguments_sha256", type_=_T.approval_arguments_sha256.type),
        _T.approved_at_ms + bindparam("claim_approval_ttl_ms", type_=BigInteger) > now,
    )


def _column_of_task(column: Any) -> Any:
    return select(column).where(_T.task_id == bindparam("held_task_id")).scalar_subquery()


def _decision(kind: DecisionKind, now: ColumnElement[int]) -> Update:
    """The conditional UPDATE of one decision: from one of its statuses to its result, ending any claim."""
    rule = DECISIONS[kind]
    status: Any = rule.to.value
    if rule.to_if_effect_unknown is not None:
        # One expression for SideEffectClass.effect_unknown(stage): an unsafe tool past external_call.
        may_have_acted = and_(
            _T.side_effect_class == SideEffectClass.UNSAFE.value,
            _T.stage.in_([stage.value for stage in Stage if SideEffectClass.UNSAFE.effect_unknown(stage)]),
        )
        status = case((may_have_acted, rule.to_if_effect_unknown.value), else_=rule.to.value)
    values: dict[str, Any] = {
        "status": status,
        "lease_owner": None,
        "lease_expires_at_ms": None,
        "error_class": None if rule.error_class is None else rule.error_class.value,
        "updated_at_ms": now,
    }
    if rule.restarts_attempts:
        values["attempts"] = 0
    if kind is DecisionKind.APPROVE:
        # The approval of one execution: of this tool and these arguments, now; consumed by one claim.
        values["approved_at_ms"] = now
        values["approval_tool"] = bindparam("approval_tool", type_=_T.approval_tool.type)
        values["approval_arguments_sha256"] = bindparam(
            "approval_arguments_sha256", type_=_T.approval_arguments_sha256.type
        )
        values["approval_consumed_generation"] = None
    if kind is DecisionKind.AWAIT_APPROVAL:  # asked again: an earlier approval no longer counts
        values.update(
            approved_at_ms=None, approval_tool=None, approval_arguments_sha256=None, approval_consumed_generation=None
        )
    if rule.settles:
        values["receipt"] = bindparam("receipt", type_=_T.receipt.type)
    if rule.to is TaskStatus.SETTLED:
        values["stage"] = Stage.SETTLED.value
    return (
        update(TASKS)
        .where(_T.task_id == bindparam("key_task_id"), _T.status.in_([s.value for s in rule.applies_to]))
        .values(**values)
        .returning(*TASKS.c)
    )


def _lapsed(now: ColumnElement[int]) -> ColumnElement[bool]:
    return and_(_T.status == TaskStatus.RUNNING.value, _T.lease_expires_at_ms <= now)


def _expiry_reads(now: ColumnElement[int]) -> tuple[Select[Any], Select[Any]]:
    first = select(TASKS).where(_lapsed(now)).order_by(_T.lease_expires_at_ms, _T.task_id).limit(bindparam("limit"))
    cursor = tuple_(bindparam("after_expires_at_ms", type_=_T.lease_expires_at_ms.type), bindparam("after_task_id"))
    return first, first.where(tuple_(_T.lease_expires_at_ms, _T.task_id) > cursor)


def event_params(reason: str, details: dict[str, Any], trace: TraceLink) -> dict[str, Any]:
    """Parameters of the evidence entry of an evidenced statement (besides the holder's ``held_*``):
    its reason, its details (a JSON object; the lease's expiry is added in SQL) and its trace.

    Named apart from the ``tasks`` columns: an UPDATE takes a parameter named like a column as a
    value to SET.
    """
    columns = {f"event_{name}": value for name, value in trace.columns().items()}
    return {"event_reason": reason, "event_details": details, **columns}


def _event_from(
    source: Any, kind: EventKind, *, generation: Any, owner: Any, stage: Any, at_ms: Any, details: Any
) -> Insert:
    """INSERT of one evidence entry whose values come from the CTE ``source`` and bound parameters."""
    trace = [bindparam(f"event_{column}", type_=_E[column].type) for column in _TRACE_COLUMNS]
    columns = ["task_id", "kind", "claim_generation", "lease_owner", "stage", "reason", "details", "at_ms"]
    return insert(EVENTS).from_select(
        [*columns, *_TRACE_COLUMNS, "authenticated_as"],
        select(
            source.c.task_id,
            literal(kind.value, _E.kind.type),
            generation,
            owner,
            stage,
            bindparam("event_reason", type_=_E.reason.type),
            details,
            at_ms,
            *trace,
            _authenticated_as("postgresql"),
        ).select_from(source),
    )


def _authenticated_as(dialect_name: str) -> Any:
    """The role the writer authenticated as: ``session_user`` on PostgreSQL, ``NULL`` on SQLite."""
    if dialect_name == "postgresql":
        return sql_cast(func.session_user(), _E.authenticated_as.type)
    return null()


def _with_expiry(source: Any) -> Any:
    """``event_details`` (a JSON object) with the lease's new expiry added, as PostgreSQL ``jsonb``."""
    details = sql_cast(bindparam("event_details", type_=postgresql.JSONB), postgresql.JSONB)
    return sql_cast(
        details.op("||")(func.jsonb_build_object("lease_expires_at_ms", source.c.lease_expires_at_ms)), JSON
    )


def _evidenced(
    claim_new: Insert, renew: Update, settle: Update, holds: ColumnElement[bool], now: ColumnElement[int]
) -> tuple[Select[Any], Select[Any], Select[Any]]:
    """The PostgreSQL statements that write a lease change and its evidence in one round trip.

    Each is ``WITH change AS (<the same conditional write> RETURNING ...), evidence AS (INSERT INTO
    lease_events SELECT ... FROM change) SELECT ... FROM change``: the evidence entry is inserted
    for exactly the rows the write changed, in the same statement and transaction, so a refused
    write (no row) leaves no entry and returns no row; its row count is checked as before.
    """
    holder = {
        "generation": bindparam("held_generation", type_=_E.claim_generation.type),
        "owner": bindparam("held_owner", type_=_E.lease_owner.type),
    }
    claimed = claim_new.cte("claimed")
    claim_event = _event_from(
        claimed,
        EventKind.CLAIMED,
        generation=claimed.c.claim_generation,
        owner=claimed.c.lease_owner,
        stage=claimed.c.stage,
        at_ms=claimed.c.lease_acquired_at_ms,
        details=_with_expiry(claimed),
    ).cte("claim_evidence")
    stored = RECEIPTS.alias("stored")
    receipt_columns = [
        select(column).where(stored.c.idempotency_key == claimed.c.idempotency_key).scalar_subquery().label(label)
        for column, label in (
            (stored.c.task_id, "receipt_task_id"),
            (stored.c.claim_generation, "receipt_generation"),
            (stored.c.receipt, "stored_receipt"),
            (stored.c.tool, "receipt_tool"),
            (stored.c.arguments_sha256, "receipt_arguments_sha256"),
        )
    ]
    claim = select(claimed, *receipt_columns).add_cte(claim_event)

    renewed = renew.returning(_T.task_id).cte("renewed")
    renew_event = _event_from(
        renewed,
        EventKind.RENEWED,
        stage=renewed.c.stage,
        at_ms=renewed.c.updated_at_ms,
        details=_with_expiry(renewed),
        **holder,
    ).cte("renew_evidence")
    renewed_row = select(renewed.c.lease_expires_at_ms, renewed.c.updated_at_ms, renewed.c.stage).add_cte(renew_event)

    # The settle: lock the holder's row (the guard), store the receipt unless one stands for the key
    # (ON CONFLICT DO UPDATE returns the standing one, after waiting for a concurrent writer of the
    # same key), settle the task with the receipt that stands, and record the entry.
    guarded = (
        select(_T.task_id, _T.idempotency_key, _T.tool, _T.arguments_sha256)
        .where(holds)
        .with_for_update(of=TASKS)
        .cte("guarded")
    )
    new_receipt = postgresql.insert(RECEIPTS).from_select(
        ["idempotency_key", "task_id", "claim_generation", "receipt", "created_at_ms", "tool", "arguments_sha256"],
        select(
            guarded.c.idempotency_key,
            guarded.c.task_id,
            holder["generation"],
            bindparam("receipt", type_=RECEIPTS.c.receipt.type),
            now,
            guarded.c.tool,
            guarded.c.arguments_sha256,
        ).select_from(guarded),
    )
    standing = (
        new_receipt.on_conflict_do_update(
            index_elements=["idempotency_key"], set_={"idempotency_key": new_receipt.excluded.idempotency_key}
        )
        .returning(RECEIPTS.c.task_id, RECEIPTS.c.claim_generation, RECEIPTS.c.receipt)
        .cte("standing")
    )
    settled = settle.values(receipt=select(standing.c.receipt).scalar_subquery()).returning(_T.task_id).cte("settled")
    settle_event = _event_from(
        settled,
        EventKind.SETTLED,
        stage=literal(Stage.SETTLED.value, _E.stage.type),
        at_ms=settled.c.updated_at_ms,
        details=bindparam("event_details", type_=_E.details.type),
        **holder,
    ).cte("settle_evidence")
    settled_row = (
        select(
            settled.c.updated_at_ms,
            settled.c.renewal_count,
            standing.c.task_id.label("receipt_task_id"),
            standing.c.claim_generation.label("receipt_generation"),
            standing.c.receipt.label("stored_receipt"),
        )
        .select_from(settled.join(standing, true()))
        .add_cte(settle_event)
    )
    return claim, renewed_row, settled_row


@cache
def lease_statements(dialect_name: str) -> LeaseStatements:
    """The statements for ``sqlite`` or ``postgresql``, built on first use.

    Raises:
        ValueError: unsupported dialect.
    """
    now = bound_now_ms(dialect_name)
    dialect_insert = postgresql.insert if dialect_name == "postgresql" else sqlite.insert
    holds = and_(
        _T.task_id == bindparam("held_task_id"),
        _T.status == TaskStatus.RUNNING.value,
        _T.lease_owner == bindparam("held_owner"),
        _T.claim_generation == bindparam("held_generation"),
        _T.lease_token_sha256 == bindparam("held_token_sha256", type_=_T.lease_token_sha256.type),
        _T.lease_expires_at_ms > now,
    )
    latest_event_at = select(_E.at_ms).order_by(_E.event_id.desc()).limit(1)
    current_task = select(TASKS).where(_T.task_id == bindparam("key_task_id"))
    if dialect_name == "postgresql":
        current_task = current_task.with_for_update(of=TASKS)
    claimable = [status.value for status in TaskStatus if status.claimable]
    expired_first, expired_after = _expiry_reads(now)
    claim_new = (
        dialect_insert(TASKS)
        .values(
            **_new_task(now),
            status=TaskStatus.RUNNING.value,
            lease_owner=bindparam("lease_owner", type_=_T.lease_owner.type),
            lease_token_sha256=bindparam("lease_token_sha256", type_=_T.lease_token_sha256.type),
            lease_acquired_at_ms=now,
            lease_expires_at_ms=now + bindparam("lease_ttl_ms", type_=_T.lease_ttl_ms.type),
            claim_generation=1,
            attempts=1,
            **{column: bindparam(column, type_=_T[column].type) for column in _TRACE_COLUMNS},
        )
        .on_conflict_do_nothing(index_elements=["task_id"])
        .returning(*TASKS.c)
    )
    renew = (
        update(TASKS)
        .where(holds)
        .values(
            lease_expires_at_ms=now
            + func.coalesce(bindparam("lease_ttl_override_ms", type_=BigInteger), _T.lease_ttl_ms),
            renewal_count=_T.renewal_count + 1,
            updated_at_ms=now,
            stage=furthest_stage(bindparam("new_stage", type_=_T.stage.type)),
        )
        .returning(_T.lease_expires_at_ms, _T.updated_at_ms, _T.stage)
    )
    settle = (
        update(TASKS)
        .where(holds)
        .values(
            status=TaskStatus.SETTLED.value,
            stage=Stage.SETTLED.value,
            receipt=bindparam("receipt", type_=_T.receipt.type),
            lease_expires_at_ms=None,
            updated_at_ms=now,
        )
        .returning(_T.updated_at_ms, _T.renewal_count, _T.tool, _T.arguments_sha256)
    )
    evidenced = _evidenced(claim_new, renew, settle, holds, now) if dialect_name == "postgresql" else (None, None, None)
    return LeaseStatements(
        now=now,
        insert_task=dialect_insert(TASKS)
        .values(**_new_task(now), status=TaskStatus.PENDING.value, claim_generation=0, attempts=0)
        .on_conflict_do_nothing(index_elements=["task_id"]),
        current_task=current_task,
        claim=update(TASKS)
        .where(
            _T.task_id == bindparam("key_task_id"),
            or_(
                _T.status.in_(claimable),
                and_(_T.status == TaskStatus.RUNNING.value, _T.lease_expires_at_ms <= now),
            ),
            or_(not_(approval_needed()), _approval_valid(now)),
        )
        .values(
            status=TaskStatus.RUNNING.value,
            approval_consumed_generation=case(
                (approval_needed(), _T.claim_generation + 1), else_=_T.approval_consumed_generation
            ),
            lease_owner=bindparam("lease_owner"),
            lease_token_sha256=bindparam("lease_token_sha256", type_=_T.lease_token_sha256.type),
            lease_acquired_at_ms=now,
            lease_expires_at_ms=now
            + func.coalesce(bindparam("lease_ttl_override_ms", type_=BigInteger), _T.lease_ttl_ms),
            claim_generation=_T.claim_generation + 1,
            attempts=_T.attempts + 1,
            error_class=None,
            updated_at_ms=now,
            **{column: bindparam(column, type_=_T[column].type) for column in _TRACE_COLUMNS},
        )
        .returning(*TASKS.c),
        renew=renew,
        settle=settle,
        end_lease=update(TASKS)
        .where(holds)
        .values(
            status=bindparam("status", type_=_T.status.type),
            lease_owner=None,
            lease_expires_at_ms=None,
            error_class=bindparam("error_class", type_=_T.error_class.type),
            last_error=bindparam("last_error", type_=_T.last_error.type),
            updated_at_ms=now,
            attempts=_T.attempts - bindparam("attempts_returned", type_=_T.attempts.type),
        )
        .returning(_T.updated_at_ms, _T.stage),
        refused=select(
            now.label("now_ms"),
            _column_of_task(_T.claim_generation).label("claim_generation"),
            _column_of_task(_T.status).label("status"),
            _column_of_task(_T.lease_owner).label("lease_owner"),
            _column_of_task(_T.lease_token_sha256).label("lease_token_sha256"),
        ),
        insert_event=insert(EVENTS).values(
            {
                **{
                    name: bindparam(name, type_=column.type)
                    for name, column in _E.items()
                    if name not in ("event_id", "authenticated_as")
                },
                "authenticated_as": _authenticated_as(dialect_name),
            }
        ),
        insert_receipt=dialect_insert(RECEIPTS)
        .values({name: bindparam(name, type_=column.type) for name, column in RECEIPTS.c.items()})
        .on_conflict_do_nothing(index_elements=["idempotency_key"])
        .returning(RECEIPTS.c.idempotency_key),
        select_receipt=select(RECEIPTS).where(RECEIPTS.c.idempotency_key == bindparam("key_idempotency_key")),
        select_task=select(TASKS).where(_T.task_id == bindparam("key_task_id")),
        set_receipt=update(TASKS)
        .where(_T.task_id == bindparam("key_task_id"))
        .values(receipt=bindparam("receipt", type_=_T.receipt.type)),
        decisions={kind: _decision(kind, now) for kind in DecisionKind},
        latest_event_at=latest_event_at,
        select_now=select(now.label("now_ms")),
        clock_check=select(now.label("clock_ms"), latest_event_at.scalar_subquery().label("latest_ms")),
        expired_first=expired_first,
        expired_after=expired_after,
        claim_new=claim_new,
        refuse_approval=update(TASKS)
        .where(_T.task_id == bindparam("key_task_id"), _T.status == TaskStatus.PENDING.value)
        .values(status=TaskStatus.AWAITING_APPROVAL.value, updated_at_ms=now)
        .returning(_T.updated_at_ms),
        claim_new_evidenced=evidenced[0],
        renew_evidenced=evidenced[1],
        settle_evidenced=evidenced[2],
    )


PAGE_ROWS = 500
"""Rows one page of an operator listing reads, each page its own short read transaction."""

_WAITING = text(WAITING_PREDICATE)
"""The waiting statuses as literal SQL: the planner matches it with the partial index's predicate."""


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks an operator listing reads, oldest first.

    Attributes:
        agent_run_id: only this agent run's tasks.
        statuses: only tasks in one of these statuses (empty: any).
        waiting: only tasks waiting for a person (``TaskStatus.waits_for_person``).
        since_ms: only tasks created at or after this time (epoch ms, ledger clock).
    """

    agent_run_id: str | None = None
    statuses: frozenset[TaskStatus] = frozenset()
    waiting: bool = False
    since_ms: int | None = None


def tasks_page(which: TaskFilter, after: tuple[int, str] | None, limit: int) -> Select[Any]:
    """One keyset page of tasks in ``(created_at_ms, task_id)`` order, after the cursor ``after``.

    Each filter has an index whose order is the page's order (``ix_tasks_*_created_at_ms``), so a
    page reads ``limit`` index entries, however many tasks the ledger holds.
    """
    query = select(TASKS).order_by(_T.created_at_ms, _T.task_id).limit(limit)
    if which.agent_run_id is not None:
        query = query.where(_T.agent_run_id == which.agent_run_id)
    if which.waiting:
        query = query.where(_WAITING)
    if which.statuses:
        query = query.where(_T.status.in_(sorted(s.value for s in which.statuses)))
    if which.since_ms is not None:
        query = query.where(_T.created_at_ms >= which.since_ms)
    if after is not None:
        query = query.where(tuple_(_T.created_at_ms, _T.task_id) > tuple_(literal(after[0]), literal(after[1])))
    return query


def run_exists(agent_run_id: str) -> Select[Any]:
    """Whether the ledger has any task of ``agent_run_id`` (one index probe)."""
    return select(_T.task_id).where(_T.agent_run_id == agent_run_id).limit(1)


def events_page(
    dialect_name: str, *, task_id: str | None, agent_run_id: str | None, after: int | None, limit: int
) -> Select[Any]:
    """One keyset page of the evidence trail in ``event_id`` order, for one task, one run, or all.

    A run's page reads at most ``limit`` entries per task of the run from
    ``ix_lease_events_task_id_event_id`` (on PostgreSQL a ``LATERAL`` join per task), then the
    first ``limit`` of them: never a scan of the whole trail in ``event_id`` order.
    """
    cursor = [] if after is None else [_E.event_id > after]
    if agent_run_id is not None and task_id is None and dialect_name == "postgresql":
        per_task = (
            select(EVENTS)
            .where(_E.task_id == _T.task_id, *cursor)
            .order_by(_E.event_id)
            .limit(limit)
            .lateral("run_events")
        )
        return (
            select(per_task)
            .select_from(TASKS.join(per_task, true()))
            .where(_T.agent_run_id == agent_run_id)
            .order_by(per_task.c.event_id)
            .limit(limit)
        )
    query = select(EVENTS).where(*cursor).order_by(_E.event_id).limit(limit)
    if task_id is not None:
        query = query.where(_E.task_id == task_id)
    if agent_run_id is not None:
        query = query.where(_E.task_id.in_(select(_T.task_id).where(_T.agent_run_id == agent_run_id)))
    return query


RUN_TOTALS = ("tasks", "waiting", "final", "settled")
"""The per-run counts of :func:`runs_page`."""


def runs_page(after: str | None, limit: int, *, waiting_only: bool = False) -> Select[Any]:
    """One keyset page of agent runs (grouped tasks) in ``agent_run_id`` order.

    Grouped along ``ix_tasks_agent_run_id_created_at_ms``: a page reads the tasks of about
    ``limit`` runs. Columns: ``agent_run_id``, the counts of :data:`RUN_TOTALS`, ``created_at_ms``
    (first task) and ``updated_at_ms`` (latest change). ``waiting_only``: runs with a task waiting
    for a person (found through the waiting tasks' partial index).
    """
    terminal = [s.value for s in TaskStatus if s.is_terminal]
    query = (
        select(
            _T.agent_run_id,
            func.count().label("tasks"),
            func.sum(case((_WAITING, 1), else_=0)).label("waiting"),
            func.sum(case((_T.status.in_(terminal), 1), else_=0)).label("final"),
            func.sum(case((_T.status == TaskStatus.SETTLED.value, 1), else_=0)).label("settled"),
            func.min(_T.created_at_ms).label("created_at_ms"),
            func.max(_T.updated_at_ms).label("updated_at_ms"),
        )
        .group_by(_T.agent_run_id)
        .order_by(_T.agent_run_id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(_T.agent_run_id > after)
    if waiting_only:
        waiting_runs = select(_T.agent_run_id).where(_WAITING)
        if after is not None:
            waiting_runs = waiting_runs.where(_T.agent_run_id > after)
        query = query.where(_T.agent_run_id.in_(waiting_runs))
    return query


def receipt_keys_query(keys: set[str]) -> Select[Any]:
    """Which of ``keys`` have a stored settlement receipt."""
    key = RECEIPTS.c.idempotency_key
    return select(key).where(key.in_(sorted(keys)))
