"""Database URLs and async engines for SQLite and PostgreSQL: downstream databases and migrations.

A downstream database is one a tool or a downstream service writes into: a fenced table
(:mod:`agentlease.fencing`), the idempotency store (:mod:`agentlease.idempotency.store`), the
table ``sql_upsert`` writes. :func:`create_async_database_engine` gives its URL its async driver
(aiosqlite, asyncpg). The ledger's own engines are made by :mod:`agentlease.ledger.engine`.

On SQLite every transaction starts with ``BEGIN IMMEDIATE`` (SQLAlchemy's documented recipe for
taking transaction control from the driver), so concurrent writers in several processes queue on
the file lock instead of failing half-way with a stale snapshot; WAL mode lets readers proceed.

URLs: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``sqlite:///~/ledger.db``,
``postgresql://user:pass@host:port/db`` (``postgres://`` too), or any of them with an explicit
async driver.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError

from agentlease.errors import ConfigurationError, LedgerUnavailableError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another process's write lock before failing. Default 30s."""

PG_CONNECT_TIMEOUT_S = 10.0
"""How long opening a PostgreSQL connection may take before it fails. Default 10s."""

_PG_UNDEFINED_TABLE = "42P01"
_USERINFO_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")

_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}


def async_url(url: str, *, name: str = "database") -> str:
    """Normalise a database URL to its async driver (``~`` in a SQLite path expanded).

    Args:
        url: see the module docstring.
        name: what the URL names, for messages (``"ledger"``). Default ``"database"``.

    Raises:
        ConfigurationError: not a URL, a database other than SQLite or PostgreSQL, or SQLite
            without a file path.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigurationError(
            f"bad {name} URL {display_url(url)!r}: expected sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "postgres":  # libpq's spelling
        backend = "postgresql"
    if backend not in _DRIVERS:
        raise ConfigurationError(
            f"unsupported {name} database {backend!r} in {display_url(url)!r}: use sqlite or postgresql"
        )
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigurationError(f"the SQLite {name} needs a file path (sqlite:///PATH); :memory: cannot be shared")
        parsed = parsed.set(database=str(Path(parsed.database).expanduser()))
    return parsed.set(drivername=_DRIVERS[backend]).render_as_string(hide_password=False)


def display_url(url: str) -> str:
    """``url`` with its password masked, for messages (also when it does not parse as a URL)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return _USERINFO_PASSWORD.sub(r"\1***@", url)


def sqlite_path(url: str, *, name: str = "database") -> Path | None:
    """The file of a SQLite URL; ``None`` for PostgreSQL.

    Raises:
        ConfigurationError: bad URL (see :func:`async_url`).
    """
    normalised = async_url(url, name=name)
    if not normalised.startswith("sqlite"):
        return None
    database = make_url(normalised).database
    return None if database is None else Path(database)


def is_missing_schema(exc: BaseException) -> bool:
    """Whether a database error says the ledger's tables do not exist (``agentlease db upgrade`` fixes it)."""
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) == _PG_UNDEFINED_TABLE:
        return True
    return isinstance(orig, sqlite3.OperationalError) and str(orig).startswith("no such table")


def asyncpg_errors(*names: str) -> tuple[type[BaseException], ...]:
    """asyncpg's error classes of these names (``"PostgresError"``, ``"InterfaceError"``, ...), for an
    ``except`` clause or ``isinstance``; ``()`` while asyncpg was never imported.

    asyncpg is imported only by a PostgreSQL connection: with no asyncpg in ``sys.modules``, no error of
    asyncpg can have been raised, and a SQLite ledger's command does not pay for importing it.
    """
    if "asyncpg" not in sys.modules:
        return ()
    import asyncpg  # already imported: a dictionary look-up (waits if another thread is importing it)

    return tuple(getattr(asyncpg.exceptions, name) for name in names)


_UNREACHABLE_PG = (
    "PostgresConnectionError",
    "CannotConnectNowError",
    "AdminShutdownError",
    "CrashShutdownError",
    "TooManyConnectionsError",
    "InterfaceError",
)


def is_unavailable(exc: BaseException) -> bool:
    """Whether a database error says the database could not be reached or could not answer (stopped,
    restarting, the connection dropped, SQLite's write lock held too long), rather than refusing what a
    statement asked; a missing schema is not an outage."""
    if is_missing_schema(exc):
        return False
    if (isinstance(exc, DBAPIError) and exc.connection_invalidated) or isinstance(exc, InterfaceError):
        return True
    orig = getattr(exc, "orig", None) or exc
    for cause in (orig, orig.__cause__):
        if isinstance(cause, (OSError, TimeoutError, *asyncpg_errors(*_UNREACHABLE_PG))):
            return True
        if isinstance(cause, sqlite3.OperationalError) and str(cause).startswith(_SQLITE_OUTAGES):
            return True
    return False


def is_refused_value(exc: BaseException) -> bool:
    """Whether a database error refuses a value a statement carried (too long for its column, a
    character the encoding cannot hold, out of range), or refuses the write to this role (no
    privilege: a worker connected as the reader role; a row guard of the ledger): retrying the same
    statement fails the same way, unlike an outage (:func:`is_unavailable`)."""
    from sqlalchemy.exc import DataError

    if isinstance(exc, DataError):
        return True
    orig = getattr(exc, "orig", None) or exc
    refused = (*asyncpg_errors("DataError", "InsufficientPrivilegeError"), sqlite3.DataError)
    return any(isinstance(cause, refused) for cause in (orig, orig.__cause__))


_SQLITE_OUTAGES = ("database is locked", "unable to open database file", "disk I/O error", "database or disk is full")


def create_sqlite_directory(path: Path, *, name: str = "database") -> None:
    """Create the directory of a SQLite database file.

    Raises:
        LedgerUnavailableError: it cannot be created.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LedgerUnavailableError(
            f"cannot create {path.parent} for the SQLite {name}: {exc.strerror or exc}"
        ) from None


def sqlite_pragmas(dbapi_connection: Any, busy_timeout_ms: int) -> None:
    """Set WAL mode, the busy timeout and ``synchronous=NORMAL`` on a new SQLite connection, and take
    transaction control away from the driver (the engine emits ``BEGIN`` itself)."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def create_async_database_engine(url: str, *, pool_size: int = 5) -> AsyncEngine:
    """An async engine for a downstream database.

    Args:
        url: see :func:`async_url`.
        pool_size: PostgreSQL connection pool size (as many again may overflow). Default 5.
            A SQLite engine keeps one connection: ``BEGIN IMMEDIATE`` lets one writer in at a time.

    Raises:
        ConfigurationError: bad URL.
        LedgerUnavailableError: the directory of a SQLite file cannot be created.
    """
    from sqlalchemy.ext.asyncio import create_async_engine

    normalised = async_url(url)
    path = sqlite_path(normalised)
    if path is None:
        return create_async_engine(
            normalised, pool_size=pool_size, max_overflow=pool_size, connect_args={"timeout": PG_CONNECT_TIMEOUT_S}
        )
    create_sqlite_directory(path)
    engine = create_async_engine(
        normalised,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        pool_size=1,
        max_overflow=0,
        pool_timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        sqlite_pragmas(dbapi_connection, SQLITE_BUSY_TIMEOUT_MS)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
