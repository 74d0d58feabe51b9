"""Where ledger transactions run: one synchronous function per transaction, one hop per call.

Every ledger operation is written once, as a function over a synchronous SQLAlchemy
:class:`~sqlalchemy.engine.Connection` that runs inside one transaction. A :class:`LedgerDatabase`
runs it without blocking the event loop:

- **SQLite** (embedded default): a synchronous engine (the standard library's ``sqlite3``) used
  by one dedicated thread. The whole transaction is one hop to that thread and back. An async
  driver (aiosqlite) hops to its thread for every cursor, execute, fetch and commit, about 13
  hops per lease write, each a GIL hand-off with Temporal's own threads; they were the largest
  part of a lease's cost (``bench/README.md``). The one thread also serialises
  the process's ledger transactions, which ``BEGIN IMMEDIATE`` would serialise anyway, and a
  writer waiting for another process's lock (``busy_timeout``) waits there, not on the loop.
- **PostgreSQL**: the async engine (asyncpg) and ``AsyncConnection.run_sync``, which runs the
  same function with each statement awaited on the loop.

Writes begin with ``BEGIN IMMEDIATE`` on SQLite (see :mod:`agentlease.ledger.engine`); reads with
a plain ``BEGIN``, a WAL snapshot that does not take the write lock.

A caller cancelled while its transaction waits for or runs on the SQLite thread gets
``CancelledError`` at once, but the transaction still runs to its end (commit or rollback) on the
thread: unlike on PostgreSQL, where a cancelled caller's transaction is rolled back unless its
``COMMIT`` was already sent, the change may be made without the caller learning of it. Callers that
must know (a claim) wait for the outcome themselves (see ``LeasedActivities``).

While another process holds SQLite's write lock, transactions queue on the thread. Each one may
wait at most the busy timeout in all, queue included: one that reaches the thread after its
deadline fails at once with "database is locked" instead of waiting the busy timeout again, so a
worker's shutdown stays bounded by about one busy timeout however many tools were waiting.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Protocol, TypeVar

import asyncpg
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from agentlease.databases import SQLITE_BUSY_TIMEOUT_MS, display_url, is_refused_value, is_unavailable, sqlite_path
from agentlease.errors import LedgerFileChangedError, LedgerRefusedValueError, LedgerUnavailableError, one_line
from agentlease.ledger.engine import (
    PG_POOL_SIZE,
    READ_ONLY_OPTION,
    create_pg_ledger_engine,
    create_sqlite_thread_engine,
)

T = TypeVar("T")

Transaction = Callable[[Connection], T]
"""A ledger operation: runs inside one transaction on a synchronous connection."""


class LedgerDatabase(Protocol):
    """Runs ledger transactions on SQLite or PostgreSQL.

    Attributes:
        dialect: ``sqlite`` or ``postgresql``.
        url: the database URL with its password masked, for messages.
    """

    dialect: str
    url: str

    async def write(self, transaction: Transaction[T]) -> T:
        """Run ``transaction`` in a write transaction; commit if it returns, roll back if it raises.

        Raises:
            LedgerUnavailableError: the database could not be reached or answer; the outcome of the
                transaction is unknown (it may have committed).
        """
        ...

    async def read(self, transaction: Transaction[T]) -> T:
        """Run ``transaction`` on one consistent snapshot without taking SQLite's write lock.

        Raises:
            LedgerUnavailableError: the database could not be reached or answer.
        """
        ...

    async def write_one(self, transaction: Transaction[T]) -> T:
        """Run ``transaction``, whose change is ONE statement, in as few round trips as the database allows.

        On PostgreSQL each statement is its own transaction (autocommit): no ``BEGIN`` and
        ``COMMIT`` round trips, so a lease write with its evidence in one statement is one round
        trip. Statements after the first (the evidence of a refused write) commit on their own.
        On SQLite the same as :meth:`write`.

        Raises:
            LedgerUnavailableError: as :meth:`write`.
        """
        ...

    async def dispose(self) -> None:
        """Close the connections (and the SQLite thread); a later transaction opens them again, as
        ``Engine.dispose`` does."""
        ...


def open_database(
    url: str, *, pool_size: int = PG_POOL_SIZE, sqlite_busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS
) -> LedgerDatabase:
    """The ledger database for ``sqlite:///PATH`` or ``postgresql://...``.

    Args:
        url: see :func:`agentlease.databases.async_url`.
        pool_size: PostgreSQL connections at most (no overflow). Default
            :data:`~agentlease.ledger.engine.PG_POOL_SIZE` (10). SQLite uses one connection.
        sqlite_busy_timeout_ms: how long a SQLite transaction may wait for the write lock, queue
            included (ms). Default :data:`~agentlease.databases.SQLITE_BUSY_TIMEOUT_MS`.

    Raises:
        ConfigurationError: bad URL.
        LedgerUnavailableError: the directory of a SQLite ledger cannot be created.
    """
    if sqlite_path(url, name="ledger") is not None:
        engine = create_sqlite_thread_engine(url, busy_timeout_ms=sqlite_busy_timeout_ms)
        return SQLiteThreadDatabase(engine, display_url(url), busy_timeout_ms=sqlite_busy_timeout_ms)
    return AsyncEngineDatabase(create_pg_ledger_engine(url, pool_size=pool_size))


@contextmanager
def unavailable_as_error(url: str) -> Iterator[None]:
    """Raise :class:`LedgerUnavailableError` (one line, the driver's error as its cause) for an error
    that says the ledger could not be reached or answer (:func:`~agentlease.databases.is_unavailable`);
    a value the database refuses (:func:`~agentlease.databases.is_refused_value`) raises
    :class:`LedgerRefusedValueError`; anything else propagates unchanged. On an outage a write's
    outcome is unknown: it may have committed (see the idempotent retries of
    :class:`~agentlease.ledger.store.Ledger`)."""
    try:
        yield
    except (SQLAlchemyError, OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        cause = one_line(getattr(exc, "orig", None) or exc)
        if is_refused_value(exc):
            raise LedgerRefusedValueError(f"ledger {url} refused a value: {cause}") from exc
        if not is_unavailable(exc):
            raise
        raise LedgerUnavailableError(f"ledger {url} unavailable: {cause}") from exc


class SQLiteThreadDatabase:
    """A SQLite ledger used from one dedicated thread: one hop per transaction.

    Args:
        engine: from :func:`~agentlease.ledger.engine.create_sqlite_thread_engine`; owned.
        url: for messages.
        busy_timeout_ms: the engine's busy timeout; also the most a transaction waits in the queue.
    """

    dialect = "sqlite"

    def __init__(self, engine: Engine, url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
        self.url = url
        self._wait_s = busy_timeout_ms / 1000
        self._engine = engine
        self._read_engine = engine.execution_options(**{READ_ONLY_OPTION: True})
        self._thread: ThreadPoolExecutor | None = None
        database = engine.url.database
        self._path = "" if not database or database == ":memory:" or database.startswith("file:") else database
        self._file_id: tuple[int, int] | None = None
        """The file's identity at the first transaction: a later transaction on another file is refused."""

    def _run(self, engine: Engine, transaction: Transaction[T], deadline: float) -> T:
        if time.monotonic() >= deadline:
            cause = sqlite3.OperationalError(
                f"database is locked: waited {self._wait_s:g}s behind this process's other ledger transactions"
            )
            raise OperationalError("BEGIN", None, cause)
        self._check_file()
        with engine.begin() as conn:
            result = transaction(conn)
        if self._file_id is None:
            self._file_id = self._stat()
        return result

    def _stat(self) -> tuple[int, int] | None:
        """``(device, inode)`` of the ledger file; ``None`` for an in-memory database or no file."""
        if not self._path:
            return None
        try:
            found = os.stat(self._path)
        except FileNotFoundError:
            return None
        return found.st_dev, found.st_ino

    def _check_file(self) -> None:
        """Refuse to go on when the file first used was deleted or replaced (a new, empty ledger)."""
        if self._file_id is None:
            return
        now = self._stat()
        if now != self._file_id:
            raise LedgerFileChangedError(self._path, "deleted" if now is None else "replaced by another file")

    async def _hop(self, engine: Engine, transaction: Transaction[T]) -> T:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentlease-ledger")
        deadline = time.monotonic() + self._wait_s
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._run, engine, transaction, deadline)

    async def write(self, transaction: Transaction[T]) -> T:
        with unavailable_as_error(self.url):
            return await self._hop(self._engine, transaction)

    async def read(self, transaction: Transaction[T]) -> T:
        with unavailable_as_error(self.url):
            return await self._hop(self._read_engine, transaction)

    async def write_one(self, transaction: Transaction[T]) -> T:
        with unavailable_as_error(self.url):
            return await self._hop(self._engine, transaction)

    async def dispose(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        # Queued behind any transaction still running, on the thread that used the connection.
        await asyncio.get_running_loop().run_in_executor(thread, self._engine.dispose)
        thread.shutdown(wait=True)


class AsyncEngineDatabase:
    """A ledger on an async engine: the transaction runs via ``run_sync``, each statement awaited.

    The ledger's database for PostgreSQL (asyncpg).

    Args:
        engine: from :func:`~agentlease.ledger.engine.create_pg_ledger_engine`; owned.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._read_engine = engine.execution_options(**{READ_ONLY_OPTION: True})
        self._autocommit_engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.dialect = engine.dialect.name
        self.url = engine.url.set(drivername=engine.url.get_backend_name()).render_as_string(hide_password=True)

    async def write(self, transaction: Transaction[T]) -> T:
        with unavailable_as_error(self.url):
            async with self._engine.begin() as conn:
                return await conn.run_sync(transaction)

    async def read(self, transaction: Transaction[T]) -> T:
        with unavailable_as_error(self.url):
            async with self._read_engine.begin() as conn:
                return await conn.run_sync(transaction)

    async def write_one(self, transaction: Transaction[T]) -> T:
        with unavailable_as_error(self.url):
            async with self._autocommit_engine.connect() as conn:
                return await conn.run_sync(transaction)

    async def dispose(self) -> None:
        await self._engine.dispose()


__all__ = [
    "AsyncEngineDatabase",
    "LedgerDatabase",
    "SQLiteThreadDatabase",
    "Transaction",
    "open_database",
    "unavailable_as_error",
]
