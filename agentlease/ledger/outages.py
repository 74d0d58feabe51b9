"""A retried write recognising its own write, committed before an outage (``docs/recovery.md``, "Ledger
outages"), and a SQLite clock that runs behind (``docs/guarantees.md``, G1)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from agentlease.clock import duration_ms, now_param
from agentlease.enums import ErrorClass, TaskStatus
from agentlease.errors import ClockBehindError
from agentlease.ledger.compiled import execute
from agentlease.ledger.statements import LeaseStatements, token_sha256
from agentlease.records import Claim, StoredReceipt

CLOCK_TOLERANCE = timedelta(seconds=1)
"""How far behind the ledger's latest recorded time a SQLite claim's clock may be. Default 1 s."""


def check_claim_clock(conn: Connection, sql: LeaseStatements, dialect: str, task_id: str, now: datetime | None) -> None:
    """Refuse a SQLite claim on a clock behind the newest evidence entry (not an injected ``now``).

    Raises:
        ClockBehindError: this process's clock is more than :data:`CLOCK_TOLERANCE` behind.
    """
    if now is not None or dialect != "sqlite":
        return
    clock_ms, latest_ms = execute(conn, sql.clock_check, now_param(None))[0]
    if latest_ms is not None and latest_ms - clock_ms > duration_ms(CLOCK_TOLERANCE):
        raise ClockBehindError(task_id, timedelta(milliseconds=latest_ms - clock_ms))


def _own_task(conn: Connection, sql: LeaseStatements, claim: Claim, status: TaskStatus, owner: str | None) -> Any:
    """The task row if ``claim`` left it in ``status`` with ``owner``, else ``None``."""
    task = conn.execute(sql.select_task, {"key_task_id": claim.task_id}).first()
    token = token_sha256(claim.lease_token.get_secret_value())
    own = (status.value, claim.generation, owner, token)
    found = task is not None and (task.status, task.claim_generation, task.lease_owner, task.lease_token_sha256) == own
    return task if found else None


def own_settle(
    conn: Connection, sql: LeaseStatements, claim: Claim, receipt_json: dict[str, Any], stored: StoredReceipt | None
) -> tuple[StoredReceipt, int] | None:
    """``claim``'s own settle with this receipt, if it committed: the stored receipt and the renewal count."""
    task = _own_task(conn, sql, claim, TaskStatus.SETTLED, claim.owner) if stored is not None else None
    if task is None or stored is None:
        return None
    mine = stored.claim_generation == claim.generation and stored.receipt.model_dump(mode="json") == receipt_json
    return (stored, task.renewal_count) if mine else None


def own_lease_end(
    conn: Connection, sql: LeaseStatements, claim: Claim, status: TaskStatus, error_class: ErrorClass, error: str
) -> bool:
    """Whether ``claim``'s own release or park (this status, class and error) committed."""
    task = _own_task(conn, sql, claim, status, None)
    return task is not None and (task.error_class, task.last_error) == (error_class.value, error)
