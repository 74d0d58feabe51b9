"""Writing the evidence trail (``lease_events``): one helper every ledger transaction uses.

An entry is written in the same transaction as the change it records, so the trail and the task
never disagree. ``docs/vocabulary.md`` lists what each :class:`~agentlease.enums.EventKind` means.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from agentlease.enums import EventKind, Stage
from agentlease.ledger.compiled import execute
from agentlease.ledger.statements import LeaseStatements
from agentlease.records import TraceLink


def write_event(conn: Connection, sql: LeaseStatements, **entry: Any) -> None:
    """Append one entry to the evidence trail, inside ``conn``'s transaction.

    Args:
        conn: the connection of the transaction that makes the recorded change.
        sql: the ledger's statements for this dialect.
        **entry: the entry, as the keyword arguments of :func:`event_values`.
    """
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
    """The column values of one evidence-trail entry.

    Args:
        task_id / kind / generation: what happened to which task, under which claim generation.
        at_ms: when, on the ledger's clock (epoch ms).
        owner: the lease owner the entry is about.
        stage: the task's stage at that moment.
        reason: a specific, human-readable reason.
        details: small JSON facts (who decided, the receipt, the refused write...).
        trace: the Temporal attempt that made the change.
    """
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
