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

from sqlalchemy.engine import Connection, Row

from agentlease.clock import from_ms, now_param
from agentlease.enums import ErrorClass, EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger.statements import receipt_keys_query
from agentlease.ledger.store import Ledger
from agentlease.ledger.trail import write_event
from agentlease.records import TraceLink

SWEEPER_STATUSES = frozenset({TaskStatus.RELEASED, TaskStatus.NEEDS_RECONCILIATION, TaskStatus.DEAD_LETTERED})
"""The statuses the sweeper may move a lapsed lease's task to."""


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
        """The lease of a ``tasks`` row read by :func:`expired_leases`."""
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
    """Running tasks whose lease lapsed, oldest lapse first, in keyset batches.

    Args:
        limit: batch size.
        after: the cursor of the last lease of the previous batch.
        now: injected time; default the database's clock.
    """
    sql = ledger.statements
    params: dict[str, Any]
    if after is None:
        query, params = sql.expired_first, {"limit": limit, **now_param(now)}
    else:
        cursor = {"after_expires_at_ms": after[0], "after_task_id": after[1]}
        query, params = sql.expired_after, {"limit": limit, **cursor, **now_param(now)}

    def read_tx(conn: Connection) -> list[ExpiredLease]:
        rows = conn.execute(query, params).all()
        keys = {row.idempotency_key for row in rows}
        stored = {r.idempotency_key for r in conn.execute(receipt_keys_query(keys))} if keys else set()
        return [ExpiredLease.from_row(row, row.idempotency_key in stored) for row in rows]

    return await ledger.database.read(read_tx)


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
    if status not in SWEEPER_STATUSES:
        raise ValueError(f"the sweeper does not move a task to {status.value}")
    sql = ledger.statements
    params = {
        "key_task_id": lease.task_id,
        "expired_generation": lease.generation,
        "expired_at_ms": lease.expires_at_ms,
        "status": status.value,
        "error_class": ErrorClass.EXPIRED.value,
        "last_error": f"lease lapsed in stage {lease.stage.value if lease.stage else 'none'}",
        **now_param(now),
    }

    def record_tx(conn: Connection) -> bool:
        if sql.lock_expired is not None and conn.execute(sql.lock_expired, params).first() is None:
            return False  # another sweeper holds it, or it changed
        row = conn.execute(sql.record_expiry, params).first()
        if row is None:
            return False
        write_event(
            conn,
            sql,
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

    recorded: bool = await ledger.database.write(record_tx)
    if recorded:
        ledger.metrics.expiry(
            lease.tool, lease.stage, by="sweeper", parked=None if status is TaskStatus.RELEASED else status
        )
    return recorded


__all__ = ["SWEEPER_STATUSES", "ExpiredLease", "expired_leases", "record_expiry"]
