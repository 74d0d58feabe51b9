"""Ledger queries of the expired-lease sweeper (:mod:`agentlease.recovery._sweeper`).

Reading candidates and recording an expiry are separate statements on purpose: between them the
task may be claimed again and settled by a newer generation. The write is conditional on the
generation and the lapse it read, so such a settlement always stands (the River rescuer fix,
PR #1373). A batch of leases is read in one keyset page and recorded by one conditional
``UPDATE ... FROM (VALUES ...)`` whose RETURNING says which tasks it moved; on PostgreSQL it skips
rows another sweeper has locked (``FOR UPDATE SKIP LOCKED``) so that several sweepers pass each
other by instead of queueing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, Row

from agentlease.clock import from_ms, now_param
from agentlease.enums import EventKind, SideEffectClass, Stage, TaskStatus
from agentlease.ledger import statements
from agentlease.ledger.statements import receipt_keys_query
from agentlease.ledger.store import Ledger
from agentlease.ledger.trail import event_values
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

    One short read transaction fetches the rows and which of them have a receipt; the leases are
    built after it ended.

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

    def row(self) -> tuple[str, int, int, str, str]:
        """The row of :func:`~agentlease.ledger.statements.record_expiries`."""
        lease = self.lease
        stage = f"in stage {lease.stage.value}" if lease.stage else "before any stage was recorded"
        return (lease.task_id, lease.generation, lease.expires_at_ms, self.status.value, f"lease lapsed {stage}")

    def event(self, at_ms: int) -> dict[str, Any]:
        """The ``expired`` evidence entry of this lease, recorded at ``at_ms``."""
        lease = self.lease
        return event_values(
            task_id=lease.task_id,
            kind=EventKind.EXPIRED,
            generation=lease.generation,
            at_ms=at_ms,
            owner=lease.owner,
            stage=lease.stage,
            reason=(
                f"lease lapsed at {from_ms(lease.expires_at_ms).isoformat()}; "
                f"sweeper: {self.decision} -> {self.status.value}"
            ),
            details={"lease_expires_at_ms": lease.expires_at_ms, "by": "sweeper", "next_status": self.status.value},
            trace=lease.trace,
        )


async def record_expiries(ledger: Ledger, expiries: Sequence[Expiry], *, now: datetime | None = None) -> set[str]:
    """Record a batch of lapsed leases in one transaction: one conditional UPDATE, then their evidence.

    Each task moves to its status only if nothing changed since it was read (see
    :func:`agentlease.ledger.statements.record_expiries`); the ``expired`` entries are written, in
    the same transaction, for exactly the tasks the UPDATE returned.

    Args:
        expiries: leases as read by :func:`expired_leases`, each with the status it moves to.
        now: injected time; default the database's clock.

    Returns:
        The ids of the tasks this call recorded; the others were claimed again, settled,
        cancelled or recorded by another sweeper meanwhile (nothing is written for them).
    """
    if not expiries:
        return set()
    by_task = {expiry.lease.task_id: expiry for expiry in expiries}
    if len(by_task) != len(expiries):
        raise ValueError("a batch names each task once")
    sql = ledger.statements
    statement = statements.record_expiries(ledger.database.dialect, [expiry.row() for expiry in expiries])

    def record_tx(conn: Connection) -> list[tuple[str, int]]:
        recorded = [(row.task_id, row.updated_at_ms) for row in conn.execute(statement, now_param(now))]
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
    ledger: Ledger,
    lease: ExpiredLease,
    *,
    status: TaskStatus,
    decision: str,
    now: datetime | None = None,
) -> bool:
    """Record that ``lease`` expired and move its task to ``status``, if nothing changed since it was read.

    A batch of one (:func:`record_expiries`).

    Returns:
        True if this call recorded the expiry; False if the task was claimed again, settled,
        cancelled or recorded by another sweeper meanwhile (nothing is written then).

    Raises:
        ValueError: ``status`` is not one the sweeper may set.
    """
    return bool(await record_expiries(ledger, [Expiry(lease, status, decision)], now=now))


__all__ = ["SWEEPER_STATUSES", "ExpiredLease", "Expiry", "expired_leases", "record_expiries", "record_expiry"]
