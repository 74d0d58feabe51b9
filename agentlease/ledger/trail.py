"""Writing the evidence trail (``lease_events``), in the transaction of the change an entry records; what each
:class:`~agentlease.enums.EventKind` means: ``docs/vocabulary.md``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from agentlease.enums import EventKind, Stage
from agentlease.ledger.compiled import execute
from agentlease.ledger.statements import LeaseStatements
from agentlease.records import TraceLink


def write_event(conn: Connection, sql: LeaseStatements, **entry: Any) -> None:
    """Append one entry (the keyword arguments of :func:`event_values`) inside ``conn``'s transaction."""
    execute(conn, sql.insert_event, event_values(**entry))


def event_values(
    *,
    task_id: str,
    kind: EventKind,
    generation: int,
    at_ms: int,
    owner: str | None = None,
    stage: Stage | str | None = None,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
    trace: TraceLink | None = None,
) -> dict[str, Any]:
    """The column values of one evidence-trail entry: what happened (``kind``) to which task under which
    generation, when (``at_ms``, ledger clock), the lease owner and stage it is about, a specific reason,
    small JSON ``details`` and the Temporal attempt (``trace``) that made the change."""
    return {
        "task_id": task_id,
        "kind": kind.value,
        "claim_generation": generation,
        "lease_owner": owner,
        "stage": None if stage is None else str(stage),
        "reason": reason,
        "details": details,
        "at_ms": at_ms,
        **(trace or TraceLink()).columns(),
    }
