"""A refused call on a task not the scheduling workflow's: recorded on the workflow's own task for the step,
dead-lettered (``docs/security-review.md``, "Receipts and tasks bound to their run")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.engine import Connection

from agentlease.clock import now_param
from agentlease.enums import ErrorClass, EventKind, TaskStatus
from agentlease.ledger.core import task_values
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import TASKS as _TASKS
from agentlease.ledger.trail import write_event
from agentlease.records import TaskRecord, TaskSpec, TraceLink


async def record_refusal(
    ledger: Ledger,
    own: TaskSpec,
    reason: str,
    *,
    details: dict[str, Any] | None = None,
    trace: TraceLink | None = None,
    now: datetime | None = None,
) -> TaskRecord:
    """Dead-letter ``own`` (the refused call's own task) with ``reason`` and record it in the trail (also when
    claimed or final, which keeps its status); returns the task.

    Raises:
        LedgerUnavailableError: the ledger could not be reached.
    """
    return await end_own_task(
        ledger,
        own,
        reason,
        status=TaskStatus.DEAD_LETTERED,
        error_class=ErrorClass.PERMANENT.value,
        kind=EventKind.DEAD_LETTERED,
        details={"refused": True, **(details or {})},
        always_recorded=True,
        trace=trace,
        now=now,
    )


async def end_own_task(
    ledger: Ledger,
    own: TaskSpec,
    reason: str,
    *,
    status: TaskStatus,
    error_class: str,
    kind: EventKind,
    details: dict[str, Any],
    always_recorded: bool,
    trace: TraceLink | None,
    now: datetime | None,
) -> TaskRecord:
    """In one transaction: create ``own`` if absent, move it to ``status`` if it is still claimable, and
    write a ``kind`` entry to its trail (when it moved, or in any case with ``always_recorded``)."""
    sql = ledger.statements
    claimable = [s.value for s in TaskStatus if s.claimable]
    end = (
        update(_TASKS)
        .where(_TASKS.c.task_id == own.task_id, _TASKS.c.status.in_(claimable))
        .values(status=status.value, error_class=error_class, last_error=reason, updated_at_ms=sql.now)
    )

    def end_tx(conn: Connection) -> TaskRecord:
        conn.execute(sql.insert_task, task_values(own, now))
        changed = conn.execute(end, now_param(now)).rowcount
        row = conn.execute(sql.select_task, {"key_task_id": own.task_id}).one()
        if changed or always_recorded:
            write_event(
                conn,
                sql,
                task_id=own.task_id,
                kind=kind,
                generation=row.claim_generation,
                at_ms=row.updated_at_ms,
                stage=row.stage,
                reason=reason,
                details=details,
                trace=trace,
            )
        return TaskRecord.from_row(row)

    return await ledger.database.write(end_tx)
