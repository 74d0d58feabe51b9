"""How many late holder writes the ledger refused on a task: ``AgentLeaseRefusedWrites``
(``docs/operator-views.md``, "Refused late writes")."""

from __future__ import annotations

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from agentlease.enums import EventKind
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import EVENTS as _EVENTS

REFUSED_KINDS = (EventKind.LEASE_LOST, EventKind.LATE_UNAPPLIED)
"""The trail's kinds of a refused holder write (the web view's "refused" markers)."""

_COUNT = (
    select(func.count())
    .select_from(_EVENTS)
    .where(_EVENTS.c.task_id == bindparam("task_id"), _EVENTS.c.kind.in_([kind.value for kind in REFUSED_KINDS]))
)


async def refused_writes(ledger: Ledger, task_id: str) -> int:
    """The task's refused holder writes so far (0 for a task the ledger does not know).

    Raises:
        LedgerUnavailableError: the ledger could not be reached.
    """

    def count_tx(conn: Connection) -> int:
        return int(conn.execute(_COUNT, {"task_id": task_id}).scalar_one())

    return await ledger.database.read(count_tx)
