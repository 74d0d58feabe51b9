"""Ledger queries of the expired-lease sweeper (:mod:`reconciliation.sweeper`).

Reading candidates and recording an expiry are separate statements on purpose: between them the
task may be claimed again and settled by a newer generation. The write is conditional on the
generation and the lapse it read, so such a settlement always stands (the River rescuer fix,
PR #1373). On PostgreSQL the write first locks the row with ``FOR UPDATE SKIP LOCKED`` so that
several sweepers pass each other by instead of queueing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, and_, select, tuple_, update
from sqlalchemy.engine import Connection

from agentlease import metrics
from agentlease.clock import from_ms, now_param
from agentlease.enums import EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.statements import TASKS
from agentlease.ledger.store import Ledger
from agentlease.records import TraceLink

_T = TASKS.c


@dataclass(frozen=True)
class ExpiredLease:
    """A running task whose lease lapsed on the ledger's clock, as the sweeper read it.

    Attributes:
        task_id / tool / side_effect_class / stage: the task and its last durable stage.
        generation: the claim generation whose lease lapsed.
        owner: its ``lease_owner``.
        expires_at_ms: when it lapsed (epoch ms, ledger clock); also the keyset cursor.
        attempts: attempts so far.
        has_receipt: whether a settlement receipt exists for its idempotency key.
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


async def expired_leases(
    ledger: Ledger, *, limit: int, after: tuple[int, str] | None = None, now: datetime | None = None
) -> list[ExpiredLease]:
    """Running tasks whose lease lapsed, oldest lapse first, in keyset batches.

    Args:
        limit: batch size.
        after: the cursor of the last lease of the previous batch.
        now: injected time; default the database's clock.
    """
    now_ms = ledger.now_expression
    query = (
        select(TASKS)
        .where(_T.status == TaskStatus.RUNNING.value, _T.lease_expires_at_ms <= now_ms)
        .order_by(_T.lease_expires_at_ms, _T.task_id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(tuple_(_T.lease_expires_at_ms, _T.task_id) > tuple_(*after))

    def read_tx(conn: Connection) -> tuple[list[Row[Any]], set[str]]:
        rows = conn.execute(query, now_param(now)).all()
        keys = {row.idempotency_key for row in rows}
        return rows, (ledger.receipt_keys(conn, keys) if keys else set())

    rows, receipts = await ledger.database.read(read_tx)
    return [
        ExpiredLease(
            task_id=row.task_id,
            tool=row.tool,
            side_effect_class=SideEffectClass(row.side_effect_class),
            stage=None if row.stage is None else Stage(row.stage),
            generation=row.claim_generation,
            owner=row.lease_owner,
            expires_at_ms=row.lease_expires_at_ms,
            attempts=row.attempts,
            has_receipt=row.idempotency_key in receipts,
            trace=TraceLink.from_mapping(row._mapping),
        )
        for row in rows
    ]


async def record_expiry(
    ledger: Ledger,
    lease: ExpiredLease,
    *,
    status: TaskStatus,
    decision: str,
    now: datetime | None = None,
) -> bool:
    """Record that ``lease`` expired and move its task to ``status``, if nothing changed since it was read.

    Args:
        lease: as read by :func:`expired_leases`.
        status: ``released`` (reclaimable), ``needs_reconciliation`` or ``dead_lettered``.
        decision: the policy rule that chose ``status``, kept in the evidence trail.
        now: injected time; default the database's clock.

    Returns:
        True if this call recorded the expiry; False if the task was claimed again, settled,
        cancelled or recorded by another sweeper meanwhile (nothing is written then).

    Raises:
        ValueError: ``status`` is not one the sweeper may set.
    """
    if status not in (TaskStatus.RELEASED, TaskStatus.NEEDS_RECONCILIATION, TaskStatus.DEAD_LETTERED):
        raise ValueError(f"the sweeper does not move a task to {status.value}")
    now_ms = ledger.now_expression
    unchanged = and_(
        _T.task_id == lease.task_id,
        _T.status == TaskStatus.RUNNING.value,
        _T.claim_generation == lease.generation,
        _T.lease_expires_at_ms == lease.expires_at_ms,
        _T.lease_expires_at_ms <= now_ms,
    )
    def record_tx(conn: Connection) -> bool:
        if ledger.database.dialect == "postgresql":
            locked = conn.execute(
                select(_T.task_id).where(unchanged).with_for_update(skip_locked=True), now_param(now)
            ).first()
            if locked is None:
                return False
        row = conn.execute(
            update(TASKS)
            .where(unchanged)
            .values(
                status=status.value,
                lease_owner=None,
                lease_expires_at_ms=None,
                error_class="expired",
                last_error=f"lease lapsed in stage {lease.stage.value if lease.stage else 'none'}",
                updated_at_ms=now_ms,
            )
            .returning(_T.updated_at_ms),
            now_param(now),
        ).first()
        if row is None:
            return False
        ledger._event(
            conn,
            task_id=lease.task_id,
            kind=EventKind.EXPIRED,
            generation=lease.generation,
            at_ms=row.updated_at_ms,
            owner=lease.owner,
            stage=lease.stage,
            reason=f"lease lapsed at {from_ms(lease.expires_at_ms).isoformat()}; sweeper: {decision} -> {status.value}",
            details={"lease_expires_at_ms": lease.expires_at_ms, "by": "sweeper", "next_status": status.value},
            trace=lease.trace,
        )
        return True

    recorded = await ledger.database.write(record_tx)
    if recorded:
        metrics.LEASES_EXPIRED.labels(lease.tool, metrics.stage_label(lease.stage), "sweeper").inc()
        if status is not TaskStatus.RELEASED:
            metrics.TASKS_PARKED.labels(lease.tool, status.value).inc()
    return recorded


__all__ = ["ExpiredLease", "expired_leases", "record_expiry"]
