"""Recording a refused tool call or decision: one the ledger must not apply to the task it names.

A leased activity or the decision activity scheduled by a workflow for a task that is not its own
(``docs/security.md``, "Receipts and tasks bound to their run") changes nothing of that task. The
refusal is recorded on the task derived from the scheduling workflow's own id and the call's step:
that task is created if absent and dead-lettered with the reason (``agentlease waiting`` lists it,
``agentlease events`` shows why), in one transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, update
from sqlalchemy.engine import Connection

from agentlease.clock import now_param
from agentlease.enums import ErrorClass, EventKind, TaskStatus
from agentlease.ledger.schema import TaskRow
from agentlease.ledger.store import Ledger
from agentlease.ledger.trail import write_event
from agentlease.records import TaskRecord, TaskSpec, TraceLink

_TASKS = cast(Table, TaskRow.__table__)


async def record_refusal(
    ledger: Ledger,
    own: TaskSpec,
    reason: str,
    *,
    details: dict[str, Any] | None = None,
    trace: TraceLink | None = None,
    now: datetime | None = None,
) -> TaskRecord:
    """Dead-letter ``own`` (the refused call's own task) with ``reason`` and record it in the trail.

    A task of ``own`` that is already claimed or final keeps its status; the entry is written all the
    same. Returns the task as it is afterwards.

    Raises:
        LedgerUnavailableError: the ledger could not be reached.
    """
    sql = ledger.statements
    claimable = [status.value for status in TaskStatus if status.claimable]
    park = (
        update(_TASKS)
        .where(_TASKS.c.task_id == own.task_id, _TASKS.c.status.in_(claimable))
        .values(
            status=TaskStatus.DEAD_LETTERED.value,
            error_class=ErrorClass.PERMANENT.value,
            last_error=reason,
            updated_at_ms=sql.now,
        )
    )

    def refuse_tx(conn: Connection) -> TaskRecord:
        conn.execute(sql.insert_task, ledger.task_values(own, now))
        conn.execute(park, now_param(now))
        row = conn.execute(sql.select_task, {"key_task_id": own.task_id}).one()
        write_event(
            conn,
            sql,
            task_id=own.task_id,
            kind=EventKind.DEAD_LETTERED,
            generation=row.claim_generation,
            at_ms=row.updated_at_ms,
            stage=row.stage,
            reason=reason,
            details={"refused": True, **(details or {})},
            trace=trace,
        )
        return TaskRecord.from_row(row)

    return await ledger.database.write(refuse_tx)


__all__ = ["record_refusal"]
