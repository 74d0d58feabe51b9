"""Engines for the ledger and for the example downstreams: SQLite (embedded default) and PostgreSQL.

``sqlite:///path`` and ``postgresql://...`` URLs are accepted. :func:`create_ledger_engine` gives
them their async drivers (aiosqlite, asyncpg); :func:`create_sqlite_thread_engine` makes the
synchronous SQLite engine the ledger runs on its own thread (see :mod:`agentlease.ledger.database`).

On SQLite every write transaction starts with ``BEGIN IMMEDIATE`` so that a lease write never fails
half-way with a stale snapshot when several worker processes share the file; WAL mode lets readers
proceed meanwhile. A connection carrying the execution option :data:`READ_ONLY_OPTION` starts with
a plain ``BEGIN`` instead: a snapshot that does not take the write lock.

A SQLite engine keeps one connection (its pool is one wide): ``BEGIN IMMEDIATE`` lets one
transaction at a time hold the file anyway, so in-process transactions queue on the pool instead
of sleeping in SQLite's busy handler. ``BEGIN`` is one driver call (on aiosqlite, one trip to its
thread rather than three) and a connection goes back to the pool without a ROLLBACK when its
transaction has already ended.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import QueuePool

from agentlease.errors import ConfigurationError, LedgerUnavailableError

try:  # SQLAlchemy 2.1 renamed await_only() to await_()
    from sqlalchemy.util.concurrency import await_ as _await
except ImportError:  # SQLAlchemy 2.0
    from sqlalchemy.util.concurrency import await_only as _await

PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 1_000
"""PostgreSQL ends a ledger session left idle inside a transaction this long. Default 1s.

Ledger transactions are a few statements issued back to back; a session idle inside one is a
worker that was paused (SIGSTOP, a long GC) or lost mid-transaction. Without this bound its row
lock would block every takeover claim of that task for as long as it stays paused."""

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for the file lock before failing. Default 30s."""

PG_CONNECT_TIMEOUT_S = 10.0
"""How long opening a PostgreSQL connection may take before it fails. Default 10s."""

READ_ONLY_OPTION = "agentlease_read_only"
"""Execution option (bool) of SQLite connections whose transactions only read: plain ``BEGIN``."""

_PG_UNDEFINED_TABLE = "42P01"
_USERINFO_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")

_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}


def async_url(url: str) -> str:
    """Normalise a ledger URL to its async driver.

    Args:
        url: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``postgresql://user@host/db``,
            or the same with an explicit async driver.

    Raises:
        ConfigurationError: not a URL, or a database other than SQLite or PostgreSQL.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigurationError(
            f"bad ledger URL {display_url(url)!r}: expected sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ConfigurationError(
            f"unsupported ledger database {backend!r} in {display_url(url)!r}: use sqlite or postgresql"
        )
    driver = _DRIVERS[backend]
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigurationError("the SQLite ledger needs a file path (sqlite:///PATH); :memory: cannot be shared")
        parsed = parsed.set(database=str(Path(parsed.database).expanduser()))  # sqlite:///~/ledger.db
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def display_url(url: str) -> str:
    """``url`` with its password masked, for messages (also when it does not parse as a URL)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return _USERINFO_PASSWORD.sub(r"\1***@", url)


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite ledger URL; ``None`` for other databases.

    Raises:
        ConfigurationError: bad URL (see :func:`async_url`).
    """
    normalised = async_url(url)
    if not normalised.startswith("sqlite"):
        return None
    database = make_url(normalised).database
    return None if database is None else Path(database).expanduser()


def is_missing_schema(exc: BaseException) -> bool:
    """Whether a database error says the ledger's tables do not exist (``agentlease db upgrade`` fixes it)."""
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) == _PG_UNDEFINED_TABLE:
        return True
    return isinstance(orig, sqlite3.OperationalError) and str(orig).startswith("no such table")


def _begin_statement(conn: Any) -> str:
    return "BEGIN" if conn.get_execution_options().get(READ_ONLY_OPTION) else "BEGIN IMMEDIATE"


def _configure_sqlite(engine: Engine, *, driver_is_async: bool, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the driver; we emit BEGIN [IMMEDIATE] ourselves.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # One call on the driver rather than exec_driver_sql's cursor/execute/close (on aiosqlite,
        # one trip to its thread instead of three); errors are wrapped as SQLAlchemy would wrap them.
        statement = _begin_statement(conn)
        try:
            if driver_is_async:
                _await(conn.connection.driver_connection.execute(statement))
            else:
                conn.connection.driver_connection.execute(statement)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(statement, (), exc, sqlite3.Error) from exc

    @event.listens_for(engine, "reset")
    def _on_reset(dbapi_connection: Any, record: Any, state: Any) -> None:
        # Replaces the pool's unconditional rollback-on-return (pool_reset_on_return=None): roll back
        # only a connection still inside a transaction. A garbage-collected connection is not
        # asyncio-safe and is discarded by the pool instead.
        if state.asyncio_safe and not state.terminate_only and record.driver_connection.in_transaction:
            dbapi_connection.rollback()


def _create_sqlite_directory(normalised_url: str) -> None:
    """Create the directory of a SQLite ledger file (the URL from :func:`async_url`, ``~`` expanded)."""
    database = make_url(normalised_url).database
    assert database is not None
    directory = Path(database).parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LedgerUnavailableError(f"cannot create {directory} for the SQLite ledger: {exc.strerror or exc}") from None


_SQLITE_POOL: dict[str, Any] = {
    "pool_size": 1,
    "max_overflow": 0,
    "pool_timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
    "pool_reset_on_return": None,
}


def create_sqlite_thread_engine(url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> Engine:
    """Create the synchronous SQLite engine of a ledger, for use by one thread at a time.

    Same pragmas, ``BEGIN`` handling and one-connection pool as the async SQLite engine; the
    connection may be closed from another thread than the one that opened it.

    Args:
        url: a ``sqlite:///PATH`` URL (any SQLite driver name is replaced by ``pysqlite``).
        busy_timeout_ms: how long a writer waits for another process's write lock. Default 30s.

    Raises:
        ConfigurationError: bad URL, or not SQLite.
        LedgerUnavailableError: the file's directory cannot be created.
    """
    normalised = async_url(url)
    if not normalised.startswith("sqlite"):
        raise ConfigurationError(f"not a SQLite URL: {display_url(url)!r}")
    _create_sqlite_directory(normalised)
    engine = create_engine(
        make_url(normalised).set(drivername="sqlite+pysqlite"),
        connect_args={"timeout": busy_timeout_ms / 1000, "check_same_thread": False},
        poolclass=QueuePool,
        **_SQLITE_POOL,
    )
    _configure_sqlite(engine, driver_is_async=False, busy_timeout_ms=busy_timeout_ms)
    return engine


def create_ledger_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """Create the async engine for a ledger URL.

    Args:
        url: see :func:`async_url`.
        pool_size: PostgreSQL connection pool size. Default 10. A SQLite engine keeps one connection.

    Raises:
        ConfigurationError: bad URL.
        LedgerUnavailableError: the directory of a SQLite ledger cannot be created.
    """
    normalised = async_url(url)
    if normalised.startswith("sqlite"):
        _create_sqlite_directory(normalised)
        engine = create_async_engine(
            normalised, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **_SQLITE_POOL
        )
        _configure_sqlite(engine.sync_engine, driver_is_async=True)
        return engine
    return create_async_engine(
        normalised,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args={
            "timeout": PG_CONNECT_TIMEOUT_S,
            "server_settings": {"idle_in_transaction_session_timeout": str(PG_IDLE_IN_TRANSACTION_TIMEOUT_MS)},
        },
    )
