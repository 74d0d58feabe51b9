"""Least-privilege PostgreSQL roles for the ledger (worker, operator, reader) that ``agentlease db grant``
prints or applies, each from ``REVOKE ALL`` (``docs/security-operations.md``, "Database roles")."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from agentlease.errors import ConfigurationError
from agentlease.ledger.database import LedgerDatabase
from agentlease.ledger.tables import TASKS

DECISION_ID_TABLES = ("decisions_applied", "decision_replays")  # insert-only for the worker role
LEDGER_TABLES = ("tasks", "lease_events", "receipts", *DECISION_ID_TABLES, "alembic_version")

TASK_IDENTITY = frozenset(
    {"task_id", "agent_run_id", "step_id", "tool", "side_effect_class", "idempotency_key", "arguments_sha256"}
    | {"created_at_ms"}
)
"""What a task is: set when the row is created, never updated by any role but the owner."""

LEASE_COLUMNS = tuple(c.name for c in TASKS.c if c.name not in TASK_IDENTITY)  # the worker and operator may UPDATE
GUARD_TRIGGERS = ("agentlease_tasks_guard", "agentlease_receipts_guard", "agentlease_events_guard")  # migration 0006


def quote_identifier(name: str) -> str:
    """``name`` as a quoted PostgreSQL identifier (``"..."``, inner quotes doubled).

    Raises:
        ValueError: an empty name, one longer than 63 bytes, or one with a NUL byte.
    """
    if not name or "\x00" in name or len(name.encode("utf-8")) > 63:
        raise ValueError(f"a role name has 1 to 63 bytes and no NUL byte, not {name!r}")
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class LedgerRoles:
    """The roles ``agentlease db grant`` gives privileges to; ``None``: that role is left alone."""

    worker: str | None = None
    operator: str | None = None
    reader: str | None = None


def _revoke(role: str, s: str) -> list[str]:
    """``REVOKE ALL``, then what every role may: use the schema, read the ledger's tables (but the ids)."""
    tables = ", ".join(f"{s}.{t}" for t in LEDGER_TABLES)
    return [
        f"REVOKE ALL ON {tables} FROM {role};",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {role};",
        f"GRANT USAGE ON SCHEMA {s} TO {role};",
        f"GRANT SELECT ON {s}.tasks, {s}.lease_events, {s}.receipts, {s}.alembic_version TO {role};",
    ]


def grant_statements(roles: LedgerRoles, *, schema: str = "public") -> list[str]:
    """The SQL that gives each role of ``roles`` exactly its privileges.

    Raises:
        ValueError: a bad role or schema name, or no role at all.
    """
    if roles.worker is None and roles.operator is None and roles.reader is None:
        raise ValueError("name at least one of --worker-role, --operator-role, --reader-role")
    s = quote_identifier(schema)
    columns = ", ".join(quote_identifier(name) for name in LEASE_COLUMNS)
    ids = ", ".join(f"{s}.{table}" for table in DECISION_ID_TABLES)
    out: list[str] = []
    if roles.worker is not None:
        w = quote_identifier(roles.worker)
        out += _revoke(w, s)
        out += [
            f"GRANT INSERT ON {s}.tasks TO {w};",
            f"GRANT UPDATE ({columns}) ON {s}.tasks TO {w};",
            f"GRANT INSERT ON {s}.lease_events TO {w};",
            f"GRANT INSERT ON {s}.receipts TO {w};",
            f"GRANT UPDATE (idempotency_key) ON {s}.receipts TO {w};",
            f"GRANT SELECT, INSERT ON {ids} TO {w};",
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {w};",
        ]
    if roles.operator is not None:
        o = quote_identifier(roles.operator)
        out += _revoke(o, s)
        out += [
            f"GRANT UPDATE ({columns}) ON {s}.tasks TO {o};",
            f"GRANT INSERT ON {s}.tasks, {s}.lease_events, {s}.receipts TO {o};",
            f"GRANT SELECT ON {ids} TO {o};",
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {o};",
        ]
    if roles.reader is not None:
        r = quote_identifier(roles.reader)
        out += [*_revoke(r, s), f"GRANT SELECT ON {ids} TO {r};"]
    return out


async def require_writable(database: LedgerDatabase) -> None:
    """Check, before a worker polls, that its PostgreSQL role may do lease operations (one line at start,
    not a failure of every claim).

    Raises:
        ConfigurationError: the role lacks INSERT or UPDATE on ``tasks`` or INSERT on the trail or receipts.
        LedgerUnavailableError: the ledger could not be reached.
    """
    if database.dialect != "postgresql":
        return

    def check(conn: Connection) -> tuple[str, bool]:
        params = {"tasks": "tasks", "events": "lease_events", "receipts": "receipts", "decisions": "decisions_applied"}
        may = bool(conn.execute(text(WRITE_PRIVILEGES), params).scalar_one())
        return str(conn.execute(text("SELECT current_user")).scalar_one()), may

    role, may = await database.read(check)
    if not may:
        raise ConfigurationError(
            f"the ledger role {role!r} may not do lease operations (INSERT and UPDATE on tasks, INSERT on "
            "lease_events, receipts and decisions_applied): connect workers as the worker role of "
            "`agentlease db grant` (run it again after `agentlease db upgrade`)"
        )


# How many of GUARD_TRIGGERS the database has (bind ``names``).
GUARDS_PRESENT = "SELECT count(DISTINCT tgname) FROM pg_trigger WHERE tgname = ANY(:names) AND NOT tgisinternal"

WRITE_PRIVILEGES = (
    "SELECT has_table_privilege(CAST(:tasks AS text), 'INSERT') "
    "AND has_column_privilege(CAST(:tasks AS text), 'status', 'UPDATE') "
    "AND has_table_privilege(CAST(:events AS text), 'INSERT') "
    "AND has_table_privilege(CAST(:receipts AS text), 'INSERT') "
    "AND has_table_privilege(CAST(:decisions AS text), 'INSERT')"
)  # whether the session's role may do lease operations (bind the four table names)
