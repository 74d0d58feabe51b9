"""The expired-lease sweeper's ledger queries: keyset pages of lapsed leases, each batch recorded by one
statement conditional on the lease it read (as River's rescuer fix; ``docs/operations.md``, "The sweeper")."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    FromClause,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    column,
    func,
    select,
    type_coerce,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Row

from agentlease.clock import bound_now_ms, now_param
from agentlease.enums import ErrorClass, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.statements import receipt_keys_query
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import TASKS
from agentlease.ledger.writes import expired_entry
from agentlease.records import TraceLink

SWEEPER_STATUSES = frozenset({TaskStatus.RELEASED, TaskStatus.NEEDS_RECONCILIATION, TaskStatus.DEAD_LETTERED})
"""The statuses the sweeper may move a lapsed lease's task to."""


@dataclass(frozen=True)
class ExpiredLease:
    """A running task whose lease lapsed on the ledger's clock, as the sweeper read it.

    Attributes:
        task_id / tool / side_effect_class / stage: the task and its last durable stage.
        generation / owner: the claim generation whose lease lapsed, and its ``lease_owner``.
        expires_at_ms: when it lapsed (epoch ms, ledger clock); also the keyset cursor.
        attempts / has_receipt: attempts so far; whether a receipt exists for its idempotency key.
        trace: the Temporal attempt that held it.
    """

    task_id: str
    tool: str
    side_effect_class: SideEffectClass
    stage: Stage | None
    generation: int
    owner: str | None
    expires_at_ms: int
    attempts: int
    has_receipt: bool
    trace: TraceLink

    @property
    def cursor(self) -> tuple[int, str]:
        return (self.expires_at_ms, self.task_id)

    @classmethod
    def from_row(cls, row: Row[Any], has_receipt: bool) -> ExpiredLease:
        return cls(
            task_id=row.task_id,
            tool=row.tool,
            side_effect_class=SideEffectClass(row.side_effect_class),
            stage=None if row.stage is None else Stage(row.stage),
            generation=row.claim_generation,
            owner=row.lease_owner,
            expires_at_ms=row.lease_expires_at_ms,
            attempts=row.attempts,
            has_receipt=has_receipt,
            trace=TraceLink.from_mapping(row._mapping),
        )


async def expired_leases(
    ledger: Ledger, *, limit: int, after: tuple[int, str] | None = None, now: datetime | None = None
) -> list[ExpiredLease]:
    """Running tasks whose lease lapsed, oldest lapse first, in keyset batches (one short read transaction).

    Args:
        limit / after: batch size; the cursor of the last lease of the previous batch.
    """
    params: dict[str, Any] = {"limit": limit, **now_param(now)}
    query = ledger.statements.expired_first
    if after is not None:
        query = ledger.statements.expired_after
        params.update(after_expires_at_ms=after[0], after_task_id=after[1])

    def read_tx(conn: Connection) -> tuple[Sequence[Row[Any]], set[str]]:
        rows = conn.execute(query, params).all()
        keys = {row.idempotency_key for row in rows}
        stored = {r.idempotency_key for r in conn.execute(receipt_keys_query(keys))} if keys else set()
        return rows, stored

    rows, stored = await ledger.database.read(read_tx)
    return [ExpiredLease.from_row(row, row.idempotency_key in stored) for row in rows]


@dataclass(frozen=True)
class Expiry:
    """What the sweeper records for one lapsed lease.

    Attributes:
        lease: as read by :func:`expired_leases`.
        status: ``released`` (reclaimable), ``needs_reconciliation`` or ``dead_lettered``.
        decision: the policy rule that chose ``status``, kept in the evidence trail.
    """

    lease: ExpiredLease
    status: TaskStatus
    decision: str

    def __post_init__(self) -> None:
        if self.status not in SWEEPER_STATUSES:
            raise ValueError(f"the sweeper does not move a task to {self.status.value}")

    def row(self) -> dict[str, Any]:
        """This lease's row of the batch :func:`record_expiries` writes (:data:`BATCH_COLUMNS`)."""
        lease = self.lease
        stage = f"in stage {lease.stage.value}" if lease.stage else "before any stage was recorded"
        return {
            "task_id": lease.task_id,
            "claim_generation": lease.generation,
            "lease_expires_at_ms": lease.expires_at_ms,
            "status": self.status.value,
            "last_error": f"lease lapsed {stage}",
        }

    def event(self, at_ms: int) -> dict[str, Any]:
        """The ``expired`` entry of this lease at ``at_ms``."""
        lease = self.lease
        return expired_entry(
            task_id=lease.task_id,
            generation=lease.generation,
            owner=lease.owner,
            stage=lease.stage,
            expires_at_ms=lease.expires_at_ms,
            at_ms=at_ms,
            trace=lease.trace,
            by="sweeper",
            outcome=f"; sweeper: {self.decision} -> {self.status.value}",
            next_status=self.status.value,
        )


_T = TASKS.c

BATCH_COLUMNS = ("task_id", "claim_generation", "lease_expires_at_ms", "status", "last_error")  # per lease
BATCH_PARAM = "expired_batch"  # the batch: a JSON array of objects of BATCH_COLUMNS
BATCH_IDS_PARAM = "expired_task_ids"  # PostgreSQL: the batch's task ids, for the SKIP LOCKED lookup


def _batch(dialect_name: str) -> FromClause:
    """The batch as a table ``expired``, unpacked from ONE JSON parameter (one statement serves every batch)."""
    types = {name: _T[name].type for name in BATCH_COLUMNS}
    batch = bindparam(BATCH_PARAM, type_=Text)
    if dialect_name == "postgresql":
        records = func.json_to_recordset(sql_cast(batch, JSON))
        return records.table_valued(*(column(name, types[name]) for name in BATCH_COLUMNS)).render_derived(
            name="expired", with_types=True
        )
    if dialect_name != "sqlite":
        raise ValueError(f"unsupported ledger dialect {dialect_name!r}")
    rows = func.json_each(batch).table_valued("value", name="batch_rows")
    fields = [
        type_coerce(func.json_extract(rows.c.value, f"$.{name}"), types[name]).label(name) for name in BATCH_COLUMNS
    ]
    return select(*fields).subquery("expired")


@functools.cache
def record_statement(dialect_name: str) -> Update:
    """The sweeper's write of a batch of lapsed leases (:func:`batch_params`): ONE ``UPDATE ... FROM <batch>``
    moving a task only if it is still the lease read (on PostgreSQL skipping rows another sweeper locked),
    RETURNING ``task_id`` and ``updated_at_ms``.

    Raises:
        ValueError: unsupported dialect.
    """
    now = bound_now_ms(dialect_name)
    batch = _batch(dialect_name)
    unchanged: ColumnElement[bool] = and_(
        _T.task_id == batch.c.task_id,
        _T.claim_generation == batch.c.claim_generation,
        _T.lease_expires_at_ms == batch.c.lease_expires_at_ms,
        _T.status == TaskStatus.RUNNING.value,
        _T.lease_expires_at_ms <= now,
    )
    if dialect_name == "postgresql":  # lock the batch's rows first, once, skipping those held
        locked = TASKS.alias("locked")
        ids = bindparam(BATCH_IDS_PARAM, type_=postgresql.ARRAY(_T.task_id.type))
        free = (
            select(locked.c.task_id)
            .where(locked.c.task_id == any_(ids))
            .with_for_update(skip_locked=True, of=locked)
            .subquery("free")
        )
        locked_ids = sql_cast(
            select(func.array_agg(free.c.task_id)).scalar_subquery(), postgresql.ARRAY(_T.task_id.type)
        )
        unchanged = and_(unchanged, _T.task_id == any_(locked_ids))
    return (
        update(TASKS)
        .where(unchanged)
        .values(
            status=batch.c.status,
            lease_owner=None,
            lease_expires_at_ms=None,
            error_class=ErrorClass.EXPIRED.value,
            last_error=batch.c.last_error,
            updated_at_ms=now,
        )
        .returning(_T.task_id, _T.updated_at_ms)
    )


def batch_params(dialect_name: str, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of :func:`record_statement` for ``rows`` (each :meth:`Expiry.row`), ``now`` aside."""
    params: dict[str, Any] = {BATCH_PARAM: json.dumps(list(rows), separators=(",", ":"))}
    if dialect_name == "postgresql":
        params[BATCH_IDS_PARAM] = [row["task_id"] for row in rows]
    return params


async def record_expiries(ledger: Ledger, expiries: Sequence[Expiry], *, now: datetime | None = None) -> set[str]:
    """Record a batch of lapsed leases in one transaction: :func:`record_statement`, then the ``expired``
    entries of exactly the tasks it moved. Returns their ids; the others were claimed again, settled,
    cancelled or recorded by another sweeper meanwhile (nothing is written for them).

    Args:
        expiries: leases as read by :func:`expired_leases`, each with the status it moves to.
    """
    if not expiries:
        return set()
    by_task = {expiry.lease.task_id: expiry for expiry in expiries}
    if len(by_task) != len(expiries):
        raise ValueError("a batch names each task once")
    sql = ledger.statements
    dialect = ledger.database.dialect
    statement = record_statement(dialect)
    params = {**batch_params(dialect, [expiry.row() for expiry in expiries]), **now_param(now)}

    def record_tx(conn: Connection) -> list[tuple[str, int]]:
        recorded = [(row.task_id, row.updated_at_ms) for row in conn.execute(statement, params)]
        if recorded:
            conn.execute(sql.insert_event, [by_task[task_id].event(at_ms) for task_id, at_ms in recorded])
        return recorded

    recorded = await ledger.database.write(record_tx)
    for task_id, _at_ms in recorded:
        expiry = by_task[task_id]
        parked = None if expiry.status is TaskStatus.RELEASED else expiry.status
        ledger.metrics.expiry(expiry.lease.tool, expiry.lease.stage, by="sweeper", parked=parked)
    return {task_id for task_id, _at_ms in recorded}


async def record_expiry(
    ledger: Ledger, lease: ExpiredLease, *, status: TaskStatus, decision: str, now: datetime | None = None
) -> bool:
    """Record that ``lease`` expired and move its task to ``status``, if nothing changed since it was read (a
    batch of one, :func:`record_expiries`): whether it did.

    Raises:
        ValueError: ``status`` is not one the sweeper may set.
    """
    return bool(await record_expiries(ledger, [Expiry(lease, status, decision)], now=now))
