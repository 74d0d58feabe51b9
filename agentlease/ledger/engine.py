"""Database engines for the ledger (``docs/operations.md``) and for a downstream: URLs, SQLite's file and
pragmas, and how a driver's error reads (an outage, a refused value, a missing schema)."""

from __future__ import annotations

import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, InterfaceError
from sqlalchemy.pool import QueuePool

from agentlease.errors import ConfigurationError, LedgerUnavailableError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another process's write lock before failing. Default 30s."""

PG_CONNECT_TIMEOUT_S = 10.0
"""How long opening a PostgreSQL connection may take before it fails. Default 10s."""

_PG_UNDEFINED_TABLE = "42P01"
_USERINFO_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")
_USERINFO_PASSWORD_TO_LAST_AT = re.compile(r"(://[^:/@]*:).*@")  # a password with an unencoded "@" in it

_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}

PG_URL_OPTIONS = ("sslmode", "ssl", "connect_timeout", "application_name", "prepared_statement_cache_size")
"""The query options a PostgreSQL URL may carry (``docs/operations.md``, "PostgreSQL connections"): libpq's
``sslmode`` (or SQLAlchemy's spelling, ``ssl``), ``connect_timeout`` and ``application_name``, given to asyncpg under
its own names (``ssl``, ``timeout``, ``server_settings``), and the asyncpg dialect's ``prepared_statement_cache_size``.
Any other is refused: asyncpg would raise on it at the first connection."""

_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_COUNT = re.compile(r"[0-9]{1,9}")


def _pg_option(key: str, value: str, name: str, shown: str) -> tuple[str, Any]:
    """asyncpg's connect argument for one query option of a PostgreSQL URL (``server_settings`` holds one setting)."""

    def bad(expected: str) -> ConfigurationError:
        return ConfigurationError(f"bad {name} URL {shown!r}: {key} must be {expected}, not {value!r}")

    if key in ("sslmode", "ssl"):
        if value not in _SSL_MODES:
            raise bad("one of " + ", ".join(_SSL_MODES))
        return "ssl", value
    if key == "connect_timeout":
        if not _COUNT.fullmatch(value) or int(value) == 0:
            raise bad("a whole number of seconds, at least 1")
        return "timeout", float(value)
    if key == "application_name":
        if not (value.isascii() and value.isprintable()):
            raise bad("printable ASCII")
        return "server_settings", {"application_name": value}
    if not _COUNT.fullmatch(value):
        raise bad("a whole number, at least 0")
    return key, int(value)


def _parse(url: str, name: str) -> tuple[URL, dict[str, Any]]:
    """``url`` checked and set to its async driver, its query moved out (PostgreSQL: into asyncpg's connect
    arguments). ConfigurationError: see :func:`async_url`."""
    shown = display_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigurationError(
            f"bad {name} URL {shown!r}: expected sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "postgres":  # libpq's spelling
        backend = "postgresql"
    if backend not in _DRIVERS:
        raise ConfigurationError(f"unsupported {name} database {backend!r} in {shown!r}: use sqlite or postgresql")
    parsed = parsed.set(drivername=_DRIVERS[backend])
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigurationError(f"the SQLite {name} needs a file path (sqlite:///PATH); :memory: cannot be shared")
        return parsed.set(database=str(Path(parsed.database).expanduser())), {}
    if parsed.port is not None and not 0 < parsed.port <= 65535:
        raise ConfigurationError(f"bad {name} URL {shown!r}: port {parsed.port} is not between 1 and 65535")
    query = url.partition("?")[2]
    blank = [part for part in query.split("&") if part and not part.partition("=")[2]]  # dropped by make_url
    if blank:
        raise ConfigurationError(f"bad {name} URL {shown!r}: option {blank[0].partition('=')[0]!r} without a value")
    if "sslmode" in parsed.query and "ssl" in parsed.query:
        raise ConfigurationError(f"bad {name} URL {shown!r}: sslmode and ssl both set; give one")
    options: dict[str, Any] = {}
    for key, value in parsed.query.items():
        if key not in PG_URL_OPTIONS:
            raise ConfigurationError(
                f"bad {name} URL {shown!r}: unsupported option {key!r} (supported: {', '.join(PG_URL_OPTIONS)}; "
                "certificates through PGSSLROOTCERT, PGSSLCERT, PGSSLKEY)"
            )
        if not isinstance(value, str):
            raise ConfigurationError(f"bad {name} URL {shown!r}: {key} given {len(value)} times")
        argument, setting = _pg_option(key, value, name, shown)
        options[argument] = setting
    return parsed.set(query={}), options


def async_url(url: str, *, name: str = "database") -> str:
    """Normalise a database URL to its async driver (``~`` in a SQLite path expanded); a PostgreSQL URL's query
    options are checked and left out: :func:`pg_connect_args` carries them.

    Args:
        url: ``sqlite:///PATH`` or ``postgresql://USER:PASS@HOST:PORT/DB`` (``postgres://`` too), with
            :data:`PG_URL_OPTIONS` as ``?sslmode=require&application_name=x``.
        name: what the URL names, for messages (``"ledger"``). Default ``"database"``.

    Raises:
        ConfigurationError: not a URL, a database other than SQLite or PostgreSQL, SQLite without a file, a port
            out of range, or a query option not supported or with a bad value.
    """
    return _parse(url, name)[0].render_as_string(hide_password=False)


def pg_connect_args(url: str, *, name: str = "database") -> dict[str, Any]:
    """asyncpg's connect arguments for a PostgreSQL URL: its query options under asyncpg's names, and a connect
    timeout of :data:`PG_CONNECT_TIMEOUT_S` unless ``connect_timeout`` sets one.

    Raises:
        ConfigurationError: bad URL (see :func:`async_url`).
    """
    return {"timeout": PG_CONNECT_TIMEOUT_S, **_parse(url, name)[1]}


def display_url(url: str) -> str:
    """``url`` with its password masked, for messages (also when it does not parse as a URL, or its password holds
    an unencoded ``@``: then all up to the last ``@`` is masked)."""
    if url.count("@") > 1:
        return _USERINFO_PASSWORD_TO_LAST_AT.sub(r"\1***@", url)
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
    """asyncpg's error classes of these names (``"PostgresError"``, ...); ``()`` while asyncpg was never imported
    (then none of its errors can have been raised)."""
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
    "LockNotAvailableError",  # a lock held elsewhere past PG_LOCK_TIMEOUT_MS: no answer in time
)


def is_unavailable(exc: BaseException) -> bool:
    """Whether a database error says the database could not be reached or answer (stopped, restarting, the
    connection dropped, SQLite's write lock held too long); not a missing schema."""
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
    """Whether a database error refuses a value (too long, not encodable, out of range) or the write to this
    role (no privilege, a row guard): retrying the same statement fails the same way."""
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
    """WAL mode, the busy timeout and ``synchronous=NORMAL`` on a new SQLite connection (``BEGIN`` left to the
    engine)."""
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
        pool_size: PostgreSQL connection pool size (as many again may overflow). Default 5; SQLite keeps one.

    Raises:
        ConfigurationError: bad URL.
        LedgerUnavailableError: the directory of a SQLite file cannot be created.
    """
    from sqlalchemy.ext.asyncio import create_async_engine

    normalised = async_url(url)
    path = sqlite_path(normalised)
    if path is None:
        return create_async_engine(
            normalised, pool_size=pool_size, max_overflow=pool_size, connect_args=pg_connect_args(url)
        )
    create_sqlite_directory(path)
    engine = create_async_engine(
        normalised,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        pool_size=1,
        max_overflow=0,
        pool_timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
    )

    event.listen(engine.sync_engine, "connect", lambda dbapi, _record: sqlite_pragmas(dbapi, SQLITE_BUSY_TIMEOUT_MS))
    event.listen(engine.sync_engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    return engine


PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 5_000
"""PostgreSQL ends a ledger session idle inside a transaction this long (a paused worker's row lock would block
takeovers): 5 s, short beside a lease TTL, long beside a ledger transaction on a CPU-starved host."""

PG_LOCK_TIMEOUT_MS = 10_000
"""A ledger statement waits this long for a lock another session holds (say, an operator's open
``SELECT ... FOR UPDATE``), then fails as the ledger being unavailable, never waiting without bound: 10 s, twice
the bound on a ledger session idle in a transaction (``docs/operations.md``, "PostgreSQL connections")."""

READ_ONLY_OPTION = "agentlease_read_only"  # execution option of SQLite reads: a plain ``BEGIN``


def create_sqlite_thread_engine(url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> Engine:
    """Create the synchronous SQLite engine of a ledger, for use by one thread at a time.

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

    event.listen(engine, "connect", lambda dbapi, _record: sqlite_pragmas(dbapi, busy_timeout_ms))

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:  # one call on the driver, errors wrapped as SQLAlchemy would
        statement = "BEGIN" if conn.get_execution_options().get(READ_ONLY_OPTION) else "BEGIN IMMEDIATE"
        try:
            conn.connection.driver_connection.execute(statement)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(statement, (), exc, sqlite3.Error) from exc

    @event.listens_for(engine, "reset")
    def _on_reset(dbapi_connection: Any, _record: Any, state: Any) -> None:  # roll back only if still inside one
        if not state.terminate_only and dbapi_connection.in_transaction:
            dbapi_connection.rollback()

    return engine


PG_POOL_SIZE = 10
"""Connections a PostgreSQL ledger keeps per process by default (no overflow)."""

PG_PING_AFTER_IDLE_S = 10.0
"""A pooled PostgreSQL connection idle this long is pinged before use. Default 10s."""

PG_POOL_TIMEOUT_S = 30.0
"""How long a ledger transaction waits for a free pooled connection. Default 30s."""

PG_IDLE_SINCE = "agentlease_idle_since"
"""Key of a pooled connection's ``info``: when it last went idle (``time.monotonic()``), set on checkin."""


def create_pg_ledger_engine(url: str, *, pool_size: int = PG_POOL_SIZE) -> AsyncEngine:
    """Create the async engine of a PostgreSQL ledger: no overflow (a burst waits up to :data:`PG_POOL_TIMEOUT_S`),
    pinged only after :data:`PG_PING_AFTER_IDLE_S` idle (``docs/operations.md``, "PostgreSQL connections").

    Args:
        url: ``postgresql://USER:PASS@HOST:PORT/DB`` (see :func:`async_url`).
        pool_size: connections at most. Default :data:`PG_POOL_SIZE` (10).

    Raises:
        ConfigurationError: bad URL, not PostgreSQL, or ``pool_size`` below 1.
    """
    if sqlite_path(url, name="ledger") is not None:
        raise ConfigurationError(f"not a PostgreSQL URL: {display_url(url)!r}")
    if pool_size < 1:
        raise ConfigurationError(f"the ledger's pool size must be at least 1, not {pool_size}")
    from sqlalchemy.ext.asyncio import create_async_engine  # PostgreSQL only: a SQLite ledger does not import it

    connect_args = pg_connect_args(url, name="ledger")
    connect_args["server_settings"] = {
        **connect_args.get("server_settings", {}),
        "idle_in_transaction_session_timeout": str(PG_IDLE_IN_TRANSACTION_TIMEOUT_MS),
        "lock_timeout": str(PG_LOCK_TIMEOUT_MS),
    }
    engine = create_async_engine(
        async_url(url, name="ledger"),
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=PG_POOL_TIMEOUT_S,
        pool_pre_ping=False,
        connect_args=connect_args,
    )
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[PG_IDLE_SINCE] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get(PG_IDLE_SINCE)
        if idle_since is None or time.monotonic() - idle_since < PG_PING_AFTER_IDLE_S:
            return
        try:
            sync_engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # replace this connection (SQLAlchemy's documented recipe)
            raise DisconnectionError(f"pooled ledger connection is gone: {exc}") from exc

    return engine
