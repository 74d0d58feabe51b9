"""The ledger's engines: a synchronous SQLite engine for the ledger thread, an async PostgreSQL engine.

:func:`create_sqlite_thread_engine` makes the engine the SQLite ledger runs on its own thread (see
:mod:`agentlease.ledger.database`): the standard library's ``sqlite3``, one connection, WAL mode.
Every write transaction starts with ``BEGIN IMMEDIATE``, so a lease write never fails half-way with
a stale snapshot when several worker processes share the file; a connection carrying the execution
option :data:`READ_ONLY_OPTION` starts with a plain ``BEGIN`` instead: a snapshot that does not
take the write lock. ``BEGIN`` is one driver call, and a connection goes back to the pool without a
``ROLLBACK`` when its transaction has already ended.

:func:`create_pg_ledger_engine` makes the PostgreSQL ledger's async engine (asyncpg), whose
sessions end a transaction left idle (a paused holder) so its row lock cannot block takeovers, with
a fixed-size pool and no ping on the hot path.
"""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.pool import QueuePool

from agentlease.databases import (
    PG_CONNECT_TIMEOUT_S,
    SQLITE_BUSY_TIMEOUT_MS,
    async_url,
    create_sqlite_directory,
    display_url,
    sqlite_path,
    sqlite_pragmas,
)
from agentlease.errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 1_000
"""PostgreSQL ends a ledger session left idle inside a transaction this long. Default 1s.

Ledger transactions are a few statements issued back to back; a session idle inside one is a
worker that was paused (SIGSTOP, a long GC) or lost mid-transaction. Without this bound its row
lock would block every takeover claim of that task for as long as it stays paused."""

READ_ONLY_OPTION = "agentlease_read_only"
"""Execution option (bool) of SQLite connections whose transactions only read: plain ``BEGIN``."""


def create_sqlite_thread_engine(url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> Engine:
    """Create the synchronous SQLite engine of a ledger, for use by one thread at a time.

    The connection may be closed from another thread than the one that opened it.

    Args:
        url: a ``sqlite:///PATH`` URL (any SQLite driver name is replaced by ``pysqlite``).
        busy_timeout_ms: how long a writer waits for another process's write lock. Default 30s.

    Raises:
        ConfigurationError: bad URL, or not SQLite.
        LedgerUnavailableError: the file's directory cannot be created.
    """
    path = sqlite_path(url, name="ledger")
    if path is None:
        raise ConfigurationError(f"not a SQLite URL: {display_url(url)!r}")
    create_sqlite_directory(path, name="ledger")
    engine = create_engine(
        make_url(async_url(url, name="ledger")).set(drivername="sqlite+pysqlite"),
        connect_args={"timeout": busy_timeout_ms / 1000, "check_same_thread": False},
        poolclass=QueuePool,
        pool_size=1,
        max_overflow=0,
        pool_timeout=busy_timeout_ms / 1000,
        pool_reset_on_return=None,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        sqlite_pragmas(dbapi_connection, busy_timeout_ms)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # One call on the driver rather than exec_driver_sql's cursor/execute/close; errors are
        # wrapped as SQLAlchemy would wrap them.
        statement = "BEGIN" if conn.get_execution_options().get(READ_ONLY_OPTION) else "BEGIN IMMEDIATE"
        try:
            conn.connection.driver_connection.execute(statement)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(statement, (), exc, sqlite3.Error) from exc

    @event.listens_for(engine, "reset")
    def _on_reset(dbapi_connection: Any, _record: Any, state: Any) -> None:
        # Replaces the pool's unconditional rollback-on-return: roll back only a connection still
        # inside a transaction (one whose transaction raised before COMMIT or ROLLBACK).
        if not state.terminate_only and dbapi_connection.in_transaction:
            dbapi_connection.rollback()

    return engine


PG_POOL_SIZE = 10
"""Connections a PostgreSQL ledger keeps per process by default (no overflow): see
:func:`create_pg_ledger_engine`."""

PG_PING_AFTER_IDLE_S = 10.0
"""A pooled PostgreSQL connection idle this long is pinged before use. Default 10s."""

PG_POOL_TIMEOUT_S = 30.0
"""How long a ledger transaction waits for a free pooled connection. Default 30s."""


def create_pg_ledger_engine(url: str, *, pool_size: int = PG_POOL_SIZE) -> AsyncEngine:
    """Create the async engine of a PostgreSQL ledger.

    The pool holds at most ``pool_size`` connections, opened on demand and kept: no overflow, so a
    burst of transactions waits for a free connection (up to :data:`PG_POOL_TIMEOUT_S`) instead of
    opening and closing sessions. A process therefore uses at most ``pool_size`` of the server's
    ``max_connections`` (see ``docs/operations.md``). A connection is pinged before use only when it
    has been idle in the pool for :data:`PG_PING_AFTER_IDLE_S` or more: busy connections go
    straight to work (no ``pool_pre_ping`` round trip per transaction), and one the server closed
    while it sat idle (a restart, a network cut) is replaced before a lease write uses it.

    Args:
        url: ``postgresql://USER:PASS@HOST:PORT/DB`` (see :func:`agentlease.databases.async_url`).
        pool_size: connections at most. Default :data:`PG_POOL_SIZE` (10).

    Raises:
        ConfigurationError: bad URL, not PostgreSQL, or ``pool_size`` below 1.
    """
    if sqlite_path(url, name="ledger") is not None:
        raise ConfigurationError(f"not a PostgreSQL URL: {display_url(url)!r}")
    if pool_size < 1:
        raise ConfigurationError(f"the ledger's pool size must be at least 1, not {pool_size}")
    from sqlalchemy.ext.asyncio import create_async_engine  # PostgreSQL only: a SQLite ledger does not import it

    engine = create_async_engine(
        async_url(url, name="ledger"),
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=PG_POOL_TIMEOUT_S,
        pool_pre_ping=False,
        connect_args={
            "timeout": PG_CONNECT_TIMEOUT_S,
            "server_settings": {"idle_in_transaction_session_timeout": str(PG_IDLE_IN_TRANSACTION_TIMEOUT_MS)},
        },
    )
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["agentlease_idle_since"] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("agentlease_idle_since")
        if idle_since is None or time.monotonic() - idle_since < PG_PING_AFTER_IDLE_S:
            return
        try:
            sync_engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # any failure means: replace this connection
            # The pool discards this connection and checks out another (SQLAlchemy's documented recipe).
            raise DisconnectionError(f"pooled ledger connection is gone: {exc}") from exc

    return engine
