"""The Alembic head makes exactly the tables :mod:`agentlease.ledger.tables` describes, on SQLite and PostgreSQL.

A table change without a migration (or a migration that does not match its table) shows up here
as a non-empty difference, listed in the failure.
"""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, MetaData, String, Table
from sqlalchemy.engine import Connection

from agentlease.ledger.migrate import head_revision, require_current
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import metadata as ledger_metadata


def drift(conn: Connection, metadata: MetaData = ledger_metadata) -> list[Any]:
    context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
    return compare_metadata(context, metadata)


async def test_the_alembic_head_matches_the_models(ledger: Ledger) -> None:
    assert await ledger.database.read(drift) == []
    await require_current(ledger.database)  # and the ledger knows it is at the head
    assert await ledger.database.read(lambda c: MigrationContext.configure(c).get_current_revision()) == head_revision()


async def test_drift_is_seen(ledger: Ledger) -> None:
    """The comparison is not vacuous: a column the tables have and the migrations do not is reported."""
    changed = MetaData()
    for table in ledger_metadata.tables.values():
        table.to_metadata(changed)
    tasks: Table = changed.tables["tasks"]
    tasks.append_column(Column("not_migrated", String(10)))
    differences = await ledger.database.read(lambda conn: drift(conn, changed))
    assert [d[0] for d in differences] == ["add_column"], differences
