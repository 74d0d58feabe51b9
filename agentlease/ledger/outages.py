"""What the ledger does when it cannot trust what it was told: an answer lost in an outage, a clock
that runs behind.

- A write whose answer an outage lost may have committed all the same. Retried (``retried=True`` of
  :meth:`~agentlease.ledger.store.Ledger.settle`, ``release`` and ``await_decision``), the guarded
  statement then matches no row; :func:`own_settle` and :func:`own_lease_end` recognise the committed
  write of the same claim, so that it is not recorded as refused.
- SQLite judges time on each process's own clock (G1: one host, one clock). :func:`check_claim_clock`
  refuses a claim whose clock runs behind the newest evidence entry by more than
  :data:`CLOCK_TOLERANCE`: entries written by a process whose clock was ahead, or by this one before its
  clock went back. PostgreSQL has one clock, the server's; injected times (tests) are not checked.
"""

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
    """Refuse a SQLite claim on a clock behind the ledger's latest recorded time (see the module docstring).

    Raises:
        ClockBehindError: this process's clock is more than :data:`CLOCK_TOLERANCE` behind.
    """
    if now is not None or dialect != "sqlite":
        return
    clock_ms, latest_ms = execute(conn, sql.clock_check, now_param(None))[0]
    if latest_ms is not None and latest_ms - clock_ms > duration_ms(CLOCK_TOLERANCE):
        raise ClockBehindError(task_id, timedelta(milliseconds=latest_ms - clock_ms))


def own_settle(
    conn: Connection, sql: LeaseStatements, claim: Claim, receipt_json: dict[str, Any], stored: StoredReceipt | None
) -> tuple[StoredReceipt, int] | None:
    """``claim``'s own settle with this receipt, if it committed: the stored receipt and the renewal count."""
    task = conn.execute(sql.select_task, {"key_task_id": claim.task_id}).first()
    if task is None or stored is None:
        return None
    settled = (task.status, task.claim_generation, task.lease_owner, task.lease_token_sha256) == (
        TaskStatus.SETTLED.value,
        claim.generation,
        claim.owner,
        token_sha256(claim.lease_token.get_secret_value()),
    )
    mine = stored.claim_generation == claim.generation and stored.receipt.model_dump(mode="json") == receipt_json
    return (stored, task.renewal_count) if settled and mine else None


def own_lease_end(
    conn: Connection, sql: LeaseStatements, claim: Claim, status: TaskStatus, error_class: ErrorClass, error: str
) -> bool:
    """Whether ``claim``'s own release or park (this status, class and error) committed."""
    task = conn.execute(sql.select_task, {"key_task_id": claim.task_id}).first()
    return task is not None and (
        task.status,
        task.claim_generation,
        task.lease_owner,
        task.error_class,
        task.last_error,
        task.lease_token_sha256,
    ) == (
        status.value,
        claim.generation,
        None,
        error_class.value,
        error,
        token_sha256(claim.lease_token.get_secret_value()),
    )


__all__ = ["CLOCK_TOLERANCE", "check_claim_clock", "own_lease_end", "own_settle"]
