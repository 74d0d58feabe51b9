"""The ledger's statements besides its lease writes, built once per dialect, and the operator listings' keyset
pages (``docs/operations.md``, "Operator queries")."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
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
    select,
    text,
    true,
    tuple_,
    update,
)

from agentlease.clock import bound_now_ms
from agentlease.enums import TaskStatus
from agentlease.ledger.rendering import authenticated_as, dialect_insert, receipt_columns
from agentlease.ledger.tables import EVENTS, RECEIPTS, TASKS, WAITING_PREDICATE

_T = TASKS.c
_E = EVENTS.c


def token_sha256(token: str) -> str:
    """The SHA-256 (hex) of a lease token: what the ledger stores and compares; ``""`` for no token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest() if token else ""


def held(claim_task_id: str, owner: str, generation: int, token_sha256: str = "") -> dict[str, Any]:
    """The guard parameters of a holder write for the claim."""
    return {
        "held_task_id": claim_task_id,
        "held_owner": owner,
        "held_generation": generation,
        "held_token_sha256": token_sha256,
    }


def new_task(now: ColumnElement[int]) -> dict[str, Any]:
    """The values of a task row the ledger sees for the first time (identity, TTL, times)."""
    named = ("task_id", "agent_run_id", "step_id", "tool", "side_effect_class", "idempotency_key")
    return {
        **{name: bindparam(name, type_=_T[name].type) for name in (*named, "arguments_sha256", "lease_ttl_ms")},
        "renewal_count": 0,
        "created_at_ms": now,
        "updated_at_ms": now,
    }


@dataclass(frozen=True)
class LeaseStatements:
    """The prebuilt statements of one dialect; ``key_task_id`` names the task a statement is about.

    Attributes:
        now: the current time expression (bound ``now_ms`` or the database clock).
        insert_task: create a ``pending`` task row on first sight (``ON CONFLICT DO NOTHING``).
        current_task / select_task: the row of ``key_task_id``, the first locked ``FOR UPDATE`` on PostgreSQL.
        refused: why a holder write touched no row: ``now_ms`` and the task's lease columns.
        insert_event: one evidence-trail entry (every column a parameter).
        select_receipt: the receipt of ``key_idempotency_key`` (:data:`~agentlease.ledger.rendering.RECEIPT_COLUMNS`).
        select_now / clock_check: ``now_ms``; ``clock_ms`` and ``latest_ms`` (the newest entry's ``at_ms``).
        expired_first / expired_after: up to ``limit`` lapsed leases, oldest first (after a cursor).
        refuse_approval: a ``pending`` task back to ``awaiting_approval``; RETURNING ``updated_at_ms``.
        count_approval: one more approval of a call that needs several (``approvals``,
            ``approval_expires_at_ms``), the task still ``awaiting_approval``; RETURNING the row.
    """

    now: ColumnElement[int]
    insert_task: Insert
    current_task: Select[Any]
    refused: Select[Any]
    insert_event: Insert
    select_receipt: Select[Any]
    select_task: Select[Any]
    select_now: Select[Any]
    clock_check: Select[Any]
    expired_first: Select[Any]
    expired_after: Select[Any]
    refuse_approval: Update
    count_approval: Update


_REFUSAL_COLUMNS = ("claim_generation", "status", "lease_owner", "lease_token_sha256", "lease_expires_at_ms")


def _column_of_task(column: Any) -> Any:
    return select(column).where(_T.task_id == bindparam("held_task_id")).scalar_subquery()


def _expiry_reads(now: ColumnElement[int]) -> tuple[Select[Any], Select[Any]]:
    lapsed = and_(_T.status == TaskStatus.RUNNING.value, _T.lease_expires_at_ms <= now)
    first = select(TASKS).where(lapsed).order_by(_T.lease_expires_at_ms, _T.task_id).limit(bindparam("limit"))
    cursor = tuple_(bindparam("after_expires_at_ms", type_=_T.lease_expires_at_ms.type), bindparam("after_task_id"))
    return first, first.where(tuple_(_T.lease_expires_at_ms, _T.task_id) > cursor)


@cache
def lease_statements(dialect_name: str) -> LeaseStatements:
    """The statements for ``sqlite`` or ``postgresql``, built on first use.

    Raises:
        ValueError: unsupported dialect.
    """
    now = bound_now_ms(dialect_name)
    latest_event_at = select(_E.at_ms).order_by(_E.event_id.desc()).limit(1)
    select_task = select(TASKS).where(_T.task_id == bindparam("key_task_id"))
    expired_first, expired_after = _expiry_reads(now)
    event_columns = {name: bindparam(name, type_=column.type) for name, column in _E.items()}
    del event_columns["event_id"], event_columns["authenticated_as"]
    return LeaseStatements(
        now=now,
        insert_task=dialect_insert(dialect_name)(TASKS)
        .values(**new_task(now), status=TaskStatus.PENDING.value, claim_generation=0, attempts=0)
        .on_conflict_do_nothing(index_elements=["task_id"]),
        current_task=select_task.with_for_update(of=TASKS),  # SQLite renders no FOR UPDATE
        refused=select(now.label("now_ms"), *(_column_of_task(_T[name]).label(name) for name in _REFUSAL_COLUMNS)),
        insert_event=insert(EVENTS).values({**event_columns, "authenticated_as": authenticated_as(dialect_name)}),
        select_receipt=select(*receipt_columns(RECEIPTS)).where(
            RECEIPTS.c.idempotency_key == bindparam("key_idempotency_key")
        ),
        select_task=select_task,
        select_now=select(now.label("now_ms")),
        clock_check=select(now.label("clock_ms"), latest_event_at.scalar_subquery().label("latest_ms")),
        expired_first=expired_first,
        expired_after=expired_after,
        refuse_approval=update(TASKS)
        .where(_T.task_id == bindparam("key_task_id"), _T.status == TaskStatus.PENDING.value)
        .values(
            status=TaskStatus.AWAITING_APPROVAL.value, approvals=None, approval_expires_at_ms=None, updated_at_ms=now
        )
        .returning(_T.updated_at_ms),
        count_approval=update(TASKS)
        .where(_T.task_id == bindparam("key_task_id"), _T.status == TaskStatus.AWAITING_APPROVAL.value)
        .values(
            approvals=bindparam("approvals", type_=_T.approvals.type),
            approval_expires_at_ms=bindparam("approval_expires_at_ms", type_=_T.approval_expires_at_ms.type),
            updated_at_ms=now,
        )
        .returning(*TASKS.c),
    )


PAGE_ROWS = 500
"""Rows one page of an operator listing reads, each page its own short read transaction."""

_WAITING = text(WAITING_PREDICATE)  # literal SQL: the planner matches it with the partial index's predicate


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks an operator listing reads, oldest first.

    Attributes:
        agent_run_id / statuses: only this agent run's tasks; only tasks in one of these statuses (empty: any).
        waiting: only tasks waiting for a person (``TaskStatus.waits_for_person``).
        since_ms: only tasks created at or after this time (epoch ms, ledger clock).
    """

    agent_run_id: str | None = None
    statuses: frozenset[TaskStatus] = frozenset()
    waiting: bool = False
    since_ms: int | None = None


def tasks_page(which: TaskFilter, after: tuple[int, str] | None, limit: int) -> Select[Any]:
    """One keyset page of tasks in ``(created_at_ms, task_id)`` order, after the cursor ``after``: ``limit``
    entries of an index in the page's order (``ix_tasks_*_created_at_ms``), however many tasks there are."""
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
    """One keyset page of the evidence trail in ``event_id`` order, for one task, one run, or all. A run's page
    reads at most ``limit`` entries per task of the run (on PostgreSQL a ``LATERAL`` join per task), never a
    scan of the whole trail."""
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


def runs_page(after: str | None, limit: int, *, waiting_only: bool = False) -> Select[Any]:
    """One keyset page of agent runs in ``agent_run_id`` order, grouped along an index (a page reads the tasks
    of about ``limit`` runs): ``agent_run_id``, the counts ``tasks``, ``waiting``, ``final``, ``settled``,
    ``created_at_ms`` (first task), ``updated_at_ms`` (latest change). ``waiting_only``: runs with a task
    waiting for a person."""
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
