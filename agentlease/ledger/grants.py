"""Least-privilege PostgreSQL roles for the ledger: what ``agentlease db grant`` prints or applies.

Three roles (``docs/security.md``, "Database roles"), made by the database's administrator, who also
owns the tables (``agentlease db upgrade`` runs as the owner):

- the **worker** role does lease operations and nothing else: it reads the tables, inserts and
  updates ``tasks`` (claims, renewals, settles, lease ends, expiries, decisions), appends to the
  evidence trail (``lease_events``: INSERT only, never UPDATE or DELETE) and stores receipts
  (INSERT; the settle's ``ON CONFLICT`` needs UPDATE of ``receipts.idempotency_key`` alone). No
  DELETE anywhere, no DDL, no write to ``alembic_version``.
- the **operator** role reads everything and may write decisions (``Ledger.decide``: UPDATE
  ``tasks``, INSERT ``lease_events`` and ``receipts``); operators normally decide through Temporal
  updates, which the worker's decision activity applies.
- the **reader** role reads (listings, the UI, incident review).

Each grant starts from ``REVOKE ALL``, so applying it again (or to a role that had more) leaves
exactly these privileges. Every name is quoted as an SQL identifier.
"""

from __future__ import annotations

from dataclasses import dataclass

LEDGER_TABLES = ("tasks", "lease_events", "receipts", "alembic_version")
"""The ledger's tables (Alembic's version table among them)."""


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


def _revoke(role: str, schema: str) -> list[str]:
    tables = ", ".join(f"{schema}.{t}" for t in LEDGER_TABLES)
    return [
        f"REVOKE ALL ON {tables} FROM {role};",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {role};",
        f"GRANT USAGE ON SCHEMA {schema} TO {role};",
    ]


def grant_statements(roles: LedgerRoles, *, schema: str = "public") -> list[str]:
    """The SQL that gives each role of ``roles`` exactly its privileges (see the module docstring).

    Raises:
        ValueError: a bad role or schema name, or no role at all.
    """
    if roles.worker is None and roles.operator is None and roles.reader is None:
        raise ValueError("name at least one of --worker-role, --operator-role, --reader-role")
    s = quote_identifier(schema)
    out: list[str] = []
    if roles.worker is not None:
        w = quote_identifier(roles.worker)
        out += _revoke(w, s)
        out += [
            f"GRANT SELECT ON {s}.tasks, {s}.lease_events, {s}.receipts, {s}.alembic_version TO {w};",
            f"GRANT INSERT, UPDATE ON {s}.tasks TO {w};",
            f"GRANT INSERT ON {s}.lease_events TO {w};",
            f"GRANT INSERT ON {s}.receipts TO {w};",
            f"GRANT UPDATE (idempotency_key) ON {s}.receipts TO {w};",
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {w};",
        ]
    if roles.operator is not None:
        o = quote_identifier(roles.operator)
        out += _revoke(o, s)
        out += [
            f"GRANT SELECT ON {s}.tasks, {s}.lease_events, {s}.receipts, {s}.alembic_version TO {o};",
            f"GRANT UPDATE ON {s}.tasks TO {o};",
            f"GRANT INSERT ON {s}.tasks, {s}.lease_events, {s}.receipts TO {o};",
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {o};",
        ]
    if roles.reader is not None:
        r = quote_identifier(roles.reader)
        out += _revoke(r, s)
        out += [f"GRANT SELECT ON {s}.tasks, {s}.lease_events, {s}.receipts, {s}.alembic_version TO {r};"]
    return out


__all__ = ["LEDGER_TABLES", "LedgerRoles", "grant_statements", "quote_identifier"]
