"""Schema migrations of the ledger, run through Alembic (``agentlease db upgrade``)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from agentlease.errors import LedgerUnavailableError, one_line
from agentlease.ledger.database import LedgerDatabase

SCRIPT_LOCATION = "agentlease:migrations"


def alembic_config(url: str | None = None) -> Config:
    """An Alembic ``Config`` for the ledger's migrations; ``url`` sets ``sqlalchemy.url``."""
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    if url is not None:
        config.set_main_option("sqlalchemy.url", url)
    return config


# PostgreSQL advisory lock ("agls") held while migrating: workers starting together migrate one after the other.
PG_MIGRATION_LOCK = 0x61676C73


def _upgrade(connection: Connection, revision: str) -> None:
    if connection.dialect.name == "postgresql":
        # Alembic loads its scripts between statements: on a busy host that outlasts the ledger sessions'
        # bound on an idle transaction (engine.PG_IDLE_IN_TRANSACTION_TIMEOUT_MS), which guards lease rows.
        connection.exec_driver_sql("SET LOCAL idle_in_transaction_session_timeout = 0")
        connection.exec_driver_sql("SET LOCAL lock_timeout = 0")  # waits for the worker migrating before it
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})")
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)
    if connection.dialect.name == "sqlite":
        # Rewrite the header's user_version with its own value: a write that fails now, with one
        # clear line, on a read-only file or mount rather than at every claim of every worker.
        version = connection.exec_driver_sql("PRAGMA user_version").scalar_one()
        connection.exec_driver_sql(f"PRAGMA user_version = {int(version)}")


async def upgrade(database: LedgerDatabase, revision: str = "head") -> None:
    """Bring the ledger schema (``Ledger.database``) to the Alembic ``revision`` (default ``head``) in one
    transaction; safe to run again, and from several processes at once.

    Raises:
        LedgerUnavailableError: unreachable, refused the migration, at a newer schema, or (SQLite) read-only.
    """
    try:
        await database.write(lambda connection: _upgrade(connection, revision))
    except (SQLAlchemyError, OSError) as exc:
        cause = one_line(getattr(exc, "orig", None) or exc)
        raise LedgerUnavailableError(f"cannot migrate the ledger at {database.url}: {cause}") from exc
    except CommandError as exc:  # a revision this version does not know: newer code wrote the ledger
        raise LedgerUnavailableError(
            f"cannot migrate the ledger at {database.url}: {str(exc).strip().splitlines()[0]}; "
            f"it was written by a newer agentlease (this version's newest schema is {head_revision()})"
        ) from None


def head_revision() -> str:
    """The newest schema revision this version of agentlease knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def require_current(database: LedgerDatabase) -> None:
    """Check that the ledger's schema is the one this version expects, without changing it.

    Raises:
        LedgerUnavailableError: unreachable, or the schema is missing, older or newer; it says what to run.
    """

    def current(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    try:
        found = await database.read(current)
    except (SQLAlchemyError, OSError) as exc:
        cause = one_line(getattr(exc, "orig", None) or exc)
        raise LedgerUnavailableError(f"cannot read the ledger at {database.url}: {cause}") from exc
    head = head_revision()
    if found == head:
        return
    if found is None:
        problem = "has no schema yet"
    elif found in {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}:
        problem = f"is at schema {found}, older than this version's {head}"
    else:
        raise LedgerUnavailableError(
            f"the ledger at {database.url} is at schema {found}, which this version does not know: a newer "
            f"agentlease wrote it (this version's newest is {head}); run that version"
        )
    raise LedgerUnavailableError(
        f"the ledger at {database.url} {problem}; run `agentlease db upgrade` (or set AGENTLEASE_MIGRATE_ON_START=true)"
    )
