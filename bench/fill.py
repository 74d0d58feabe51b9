"""Fill a migrated ledger with many rows in bulk, for the scale benchmarks and the scale tests.

One ``INSERT ... SELECT`` per table over a generated series (``generate_series`` on PostgreSQL, a
recursive CTE on SQLite), so a million tasks take seconds, not hours of lease operations. The rows
look like a ledger that has been used for a while:

- tasks ``fill-<run>/s<k>``, ten per agent run, created one millisecond apart (oldest first);
- every hundredth task waits for a person (``dead_lettered`` or ``awaiting_approval``, alternately),
  the first ``expired`` tasks are ``running`` with a lease that lapsed an hour ago, the rest are
  ``settled`` with a small receipt (stored in ``receipts`` too);
- ``events_per_task`` evidence entries per task (``claimed``, then ``settled``...).

Then ``ANALYZE``, so the planner knows the table sizes as a long-lived ledger's statistics would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from agentlease.ledger.database import LedgerDatabase

STEPS_PER_RUN = 10
"""Tasks per agent run in the filled ledger."""

WAITING_EVERY = 100
"""Every this-many-th task waits for a person."""


@dataclass(frozen=True)
class Fill:
    """What :func:`fill_ledger` inserts.

    Attributes:
        tasks: how many tasks.
        expired: how many of them are ``running`` with a lapsed lease (the sweeper's work).
        events_per_task: evidence entries per task.
        base_ms: ``created_at_ms`` of the first task (epoch ms); the others follow 1 ms apart.
    """

    tasks: int
    expired: int = 0
    events_per_task: int = 2
    base_ms: int = 1_700_000_000_000

    @property
    def waiting(self) -> int:
        """How many tasks wait for a person (the expired ones excepted)."""
        return sum(1 for i in range(0, self.tasks, WAITING_EVERY) if i >= self.expired)


def _series(dialect: str, count: int) -> str:
    if dialect == "postgresql":
        return f"generate_series(0, {count - 1}) AS seq(i)"
    return "seq"


def _with_series(dialect: str, count: int) -> str:
    if dialect == "postgresql":
        return ""
    return f"WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < {count - 1}) "


def _tasks_sql(dialect: str, fill: Fill) -> str:
    run = f"'fill-' || (i / {STEPS_PER_RUN})"
    step = f"'s' || (i % {STEPS_PER_RUN})"
    receipt = (
        """'{"external_system": "fill", "external_id": "x", "status": "done", "details": {}, """
        """"verified_at": "2026-01-01T00:00:00Z"}'"""
    )
    receipt = f"CAST({receipt} AS JSON)" if dialect == "postgresql" else receipt
    status = (
        f"CASE WHEN i < {fill.expired} THEN 'running' "
        f"WHEN i % {WAITING_EVERY} = 0 AND (i / {WAITING_EVERY}) % 2 = 0 THEN 'dead_lettered' "
        f"WHEN i % {WAITING_EVERY} = 0 THEN 'awaiting_approval' ELSE 'settled' END"
    )
    running = f"i < {fill.expired}"
    settled = f"i >= {fill.expired} AND i % {WAITING_EVERY} <> 0"
    return (
        _with_series(dialect, fill.tasks)
        + "INSERT INTO tasks (task_id, agent_run_id, step_id, tool, side_effect_class, status, stage, lease_owner, "
        "lease_acquired_at_ms, lease_expires_at_ms, lease_ttl_ms, claim_generation, attempts, renewal_count, "
        "idempotency_key, receipt, last_error, error_class, created_at_ms, updated_at_ms, trace_workflow_id) "
        f"SELECT {run} || '/' || {step}, {run}, {step}, 'fill_tool', 'idempotent', {status}, "
        f"CASE WHEN {settled} THEN 'settled' WHEN {running} THEN 'external_call' ELSE NULL END, "
        f"CASE WHEN {running} THEN 'fill-worker' ELSE NULL END, "
        f"CASE WHEN {running} THEN {fill.base_ms} + i ELSE NULL END, "
        f"CASE WHEN {running} THEN {fill.base_ms} + i + 30000 ELSE NULL END, "
        "30000, 1, 1, 0, "
        f"{run} || ':' || {step}, CASE WHEN {settled} THEN {receipt} ELSE NULL END, "
        f"CASE WHEN {status} = 'dead_lettered' THEN 'filled: permanent' ELSE NULL END, "
        f"CASE WHEN {status} = 'dead_lettered' THEN 'permanent' ELSE NULL END, "
        f"{fill.base_ms} + i, {fill.base_ms} + i, {run} "
        f"FROM {_series(dialect, fill.tasks)}"
    )


def _events_sql(dialect: str, fill: Fill) -> str:
    count = fill.tasks * fill.events_per_task
    n = fill.events_per_task
    task = f"(i / {n})"
    run = f"'fill-' || ({task} / {STEPS_PER_RUN})"
    kind = f"CASE WHEN i % {n} = 0 THEN 'claimed' WHEN i % {n} = {n - 1} THEN 'settled' ELSE 'renewed' END"
    return (
        _with_series(dialect, count)
        + "INSERT INTO lease_events (task_id, kind, claim_generation, lease_owner, stage, reason, at_ms) "
        f"SELECT {run} || '/s' || ({task} % {STEPS_PER_RUN}), {kind}, 1, 'fill-worker', NULL, 'filled', "
        f"{fill.base_ms} + {task} FROM {_series(dialect, count)}"
    )


def _execute(statement: str, conn: Connection) -> None:
    conn.execute(text(statement))


async def fill_ledger(database: LedgerDatabase, fill: Fill) -> None:
    """Insert ``fill``'s rows into a migrated, empty ledger, then update the planner's statistics."""
    dialect = database.dialect
    statements = [
        _tasks_sql(dialect, fill),
        "INSERT INTO receipts (idempotency_key, task_id, claim_generation, receipt, created_at_ms) "
        "SELECT idempotency_key, task_id, claim_generation, receipt, updated_at_ms FROM tasks "
        "WHERE receipt IS NOT NULL",
    ]
    if fill.events_per_task:
        statements.append(_events_sql(dialect, fill))
    for statement in [*statements, "ANALYZE"]:
        await database.write(functools.partial(_execute, statement))


__all__ = ["STEPS_PER_RUN", "WAITING_EVERY", "Fill", "fill_ledger"]
