"""Writing the evidence trail in the transaction of the change an entry records (kinds: ``docs/vocabulary.md``)."""

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
        conn / sql: the transaction's connection, and the ledger's statements for its dialect.
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
        owner / stage: the lease owner and the task's stage the entry is about.
        reason / details: a specific, human-readable reason; small JSON facts.
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
