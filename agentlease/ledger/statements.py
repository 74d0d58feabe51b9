"""The ledger's lease statements, built once per dialect with bound parameters.

A lease write runs on every claim, stage change and settle, so its statement is built once and
executed with a parameter dict: SQLAlchemy then neither rebuilds the expression nor recomputes its
cache key per call (building them was most of the ledger's CPU in ``bench/overhead.py``). The SQL
is what :mod:`agentlease.ledger.store` documents: each lease write is one conditional statement
judged on the database's clock.

Parameter names (bound, never chosen by SQL text):

- ``now_ms``: the injected time (:func:`agentlease.clock.now_param`); ``None`` = database clock.
- ``held_task_id``, ``held_owner``, ``held_generation``: the claim a holder write is guarded by (G2).
- ``task_id`` and column names: values written.
"""

from __future__ import annotations

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
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from agentlease.clock import bound_now_ms
from agentlease.enums import Stage, TaskStatus
from agentlease.ledger.schema import LeaseEventRow, ReceiptRow, TaskRow
from agentlease.records import TraceLink

TASKS = TaskRow.__table__
EVENTS = LeaseEventRow.__table__
RECEIPTS = ReceiptRow.__table__
_T = TASKS.c

CLAIMABLE = (TaskStatus.PENDING.value, TaskStatus.RELEASED.value)
"""Statuses a claim may take without a lapsed lease."""

_TRACE_COLUMNS = tuple(TraceLink().columns())


def held(claim_task_id: str, owner: str, generation: int) -> dict[str, Any]:
    """The guard parameters of a holder write for the claim (task, owner, generation)."""
    return {"held_task_id": claim_task_id, "held_owner": owner, "held_generation": generation}


@dataclass(frozen=True)
class LeaseStatements:
    """The prebuilt statements of one dialect.

    Attributes:
        now: the current time expression (bound ``now_ms`` or the database clock), for the
            ledger's other statements.
        insert_task: create a task row on first sight (``ON CONFLICT DO NOTHING``).
        current_task: the task row (locked ``FOR UPDATE`` on PostgreSQL).
        claim: the claim UPDATE minting ``claim_generation + 1`` (G1, G3); RETURNING the row.
        renew: the holder's renewal, ``new_stage`` (``None`` keeps the stage); RETURNING expiry.
        settle: the holder's settle with ``receipt``; RETURNING ``updated_at_ms``, ``renewal_count``.
        end_lease: release / dead-letter / park with ``status``, ``error_class``, ``last_error``
            and ``attempts_returned`` (0 or 1).
        refused: why a holder write touched no row: ``now_ms``, ``claim_generation``, ``status``.
        insert_event: one evidence-trail entry (every column as a parameter).
        insert_receipt: store a receipt unless one stands for the key; RETURNING the key if stored.
        select_receipt: the receipt of ``idempotency_key``.
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


def _column_of_task(column: Any) -> Any:
    return select(column).where(_T.task_id == bindparam("held_task_id")).scalar_subquery()


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
        _T.lease_expires_at_ms > now,
    )
    current_task = select(TASKS).where(_T.task_id == bindparam("key_task_id"))
    if dialect_name == "postgresql":
        current_task = current_task.with_for_update(of=TASKS)
    return LeaseStatements(
        now=now,
        insert_task=dialect_insert(TASKS)
        .values(
            task_id=bindparam("task_id"),
            agent_run_id=bindparam("agent_run_id"),
            step_id=bindparam("step_id"),
            tool=bindparam("tool"),
            side_effect_class=bindparam("side_effect_class"),
            status=TaskStatus.PENDING.value,
            lease_ttl_ms=bindparam("lease_ttl_ms"),
            claim_generation=0,
            attempts=0,
            renewal_count=0,
            idempotency_key=bindparam("idempotency_key"),
            created_at_ms=now,
            updated_at_ms=now,
        )
        .on_conflict_do_nothing(index_elements=["task_id"]),
        current_task=current_task,
        claim=update(TASKS)
        .where(
            _T.task_id == bindparam("key_task_id"),
            or_(
                _T.status.in_(CLAIMABLE),
                and_(_T.status == TaskStatus.RUNNING.value, _T.lease_expires_at_ms <= now),
            ),
        )
        .values(
            status=TaskStatus.RUNNING.value,
            lease_owner=bindparam("lease_owner"),
            lease_acquired_at_ms=now,
            lease_expires_at_ms=now + _T.lease_ttl_ms,
            claim_generation=_T.claim_generation + 1,
            attempts=_T.attempts + 1,
            error_class=None,
            updated_at_ms=now,
            **{column: bindparam(column, type_=_T[column].type) for column in _TRACE_COLUMNS},
        )
        .returning(*TASKS.c),
        renew=update(TASKS)
        .where(holds)
        .values(
            lease_expires_at_ms=now + _T.lease_ttl_ms,
            renewal_count=_T.renewal_count + 1,
            updated_at_ms=now,
            stage=func.coalesce(bindparam("new_stage", type_=_T.stage.type), _T.stage),
        )
        .returning(_T.lease_expires_at_ms, _T.updated_at_ms, _T.stage),
        settle=update(TASKS)
        .where(holds)
        .values(
            status=TaskStatus.SETTLED.value,
            stage=Stage.SETTLED.value,
            receipt=bindparam("receipt", type_=_T.receipt.type),
            lease_expires_at_ms=None,
            updated_at_ms=now,
        )
        .returning(_T.updated_at_ms, _T.renewal_count),
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
        ),
        insert_event=insert(EVENTS),
        insert_receipt=dialect_insert(RECEIPTS)
        .on_conflict_do_nothing(index_elements=["idempotency_key"])
        .returning(RECEIPTS.c.idempotency_key),
        select_receipt=select(RECEIPTS).where(RECEIPTS.c.idempotency_key == bindparam("key_idempotency_key")),
    )
