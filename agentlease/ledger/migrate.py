"""Schema migrations of the ledger, run through Alembic (``agentlease db upgrade``)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
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


def _upgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


async def upgrade(database: LedgerDatabase, revision: str = "head") -> None:
    """Bring the ledger schema to ``revision`` (default the newest), in one transaction. Safe to run again.

    Args:
        database: the ledger's database (``Ledger.database``).
        revision: an Alembic revision. Default ``head``.

    Raises:
        LedgerUnavailableError: the database cannot be reached or refused the migration.
    """
    try:
        await database.write(lambda connection: _upgrade(connection, revision))
    except (SQLAlchemyError, OSError) as exc:
        cause = one_line(getattr(exc, "orig", None) or exc)
        raise LedgerUnavailableError(f"cannot migrate the ledger at {database.url}: {cause}") from exc

