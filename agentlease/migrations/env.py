"""Alembic environment for the ledger: the connection :func:`agentlease.ledger.migrate.upgrade` hands over in
``config.attributes["connection"]``, or else an engine made from the ``sqlalchemy.url`` option.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from agentlease.ledger.engine import create_async_database_engine
from agentlease.ledger.tables import metadata

target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_engine(url: str) -> None:
    engine = create_async_database_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


def _main() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no ledger URL: set sqlalchemy.url or pass a connection")
    asyncio.run(_run_with_engine(url))


if context.is_offline_mode():
    context.configure(url=context.config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    _main()
