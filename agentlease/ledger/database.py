"""Where ledger transactions run, one synchronous function per transaction: on SQLite one dedicated thread
running them in turn (``bench/README.md``), on PostgreSQL the async engine's ``run_sync``. A caller cancelled
while its transaction runs on the SQLite thread is told at once, but the transaction still runs to its end
(one still queued is skipped); one queued longer than the busy timeout fails with "database is locked"."""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.sql import ClauseElement

from agentlease.errors import LedgerFileChangedError, LedgerRefusedValueError, LedgerUnavailableError, one_line
from agentlease.ledger.compiled import execute, fetch_alone
from agentlease.ledger.engine import (
    PG_IDLE_SINCE,
    PG_PING_AFTER_IDLE_S,
    PG_POOL_SIZE,
    READ_ONLY_OPTION,
    SQLITE_BUSY_TIMEOUT_MS,
    asyncpg_errors,
    create_pg_ledger_engine,
    create_sqlite_thread_engine,
    display_url,
    is_refused_value,
    is_unavailable,
    sqlite_path,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine
    from sqlalchemy.pool import PoolProxiedConnection

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
            LedgerUnavailableError: the database could not be reached or answer; it may have committed.
        """
        ...

    async def read(self, transaction: Transaction[T]) -> T:
        """Run ``transaction`` on one consistent snapshot without taking SQLite's write lock.

        Raises:
            LedgerUnavailableError: the database could not be reached or answer.
        """
        ...

    async def write_one(self, transaction: Transaction[T]) -> T:
        """Run ``transaction``, whose change is ONE statement: on PostgreSQL in autocommit, on SQLite as
        :meth:`write`.

        Raises:
            LedgerUnavailableError: as :meth:`write`.
        """
        ...

    async def write_statement(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Any]:
        """Run ONE prebuilt lease statement alone; its rows. On PostgreSQL straight to asyncpg in autocommit
        (:func:`~agentlease.ledger.compiled.fetch_alone`); on SQLite as :meth:`write_one`.

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
        url: see :func:`agentlease.ledger.engine.async_url`.
        pool_size: PostgreSQL connections at most (no overflow). Default 10. SQLite uses one connection.
        sqlite_busy_timeout_ms: how long a SQLite transaction may wait for the write lock, queue included.
            Default 30,000 ms.

    Raises:
        ConfigurationError: bad URL.
        LedgerUnavailableError: the directory of a SQLite ledger cannot be created.
    """
    if sqlite_path(url, name="ledger") is not None:
        engine = create_sqlite_thread_engine(url, busy_timeout_ms=sqlite_busy_timeout_ms)
        return SQLiteThreadDatabase(engine, display_url(url), busy_timeout_ms=sqlite_busy_timeout_ms)
    return AsyncEngineDatabase(create_pg_ledger_engine(url, pool_size=pool_size), display_url(url))


def _driver_errors() -> tuple[type[BaseException], ...]:
    return (SQLAlchemyError, OSError, TimeoutError, *asyncpg_errors("PostgresError", "InterfaceError"))


@contextmanager
def unavailable_as_error(url: str) -> Iterator[None]:
    """Raise :class:`LedgerUnavailableError` (one line) for an error that says the ledger could not be reached
    or answer, :class:`LedgerRefusedValueError` for a value it refuses; anything else propagates unchanged."""
    try:
        yield
    except _driver_errors() as exc:
        _raise_as_ledger_error(exc, url)


def _raise_as_ledger_error(exc: BaseException, url: str) -> NoReturn:
    """Raise what :func:`unavailable_as_error` says for the driver's ``exc``, which is being handled: anything
    else is raised again unchanged. Called from an ``except`` block only."""
    cause = one_line(getattr(exc, "orig", None) or exc)
    if is_refused_value(exc):
        raise LedgerRefusedValueError(f"ledger {url} refused a value: {cause}") from exc
    if not is_unavailable(exc):
        raise  # the exception being handled, unchanged
    raise LedgerUnavailableError(f"ledger {url} unavailable: {cause}") from exc


_DELIVER_AFTER = 16  # at most this many finished transactions wait for one wake-up of the event loop
_DELIVER_WITHIN_S = 0.001  # and none longer than this before the next one starts (which may wait for a lock)


class _LedgerThread:
    """The SQLite ledger's thread, running queued calls in order; stopped by :meth:`stop` or at exit."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[asyncio.Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="agentlease-ledger", daemon=False)
        _LIVE_THREADS.add(self)
        self._thread.start()

    def submit(self, future: asyncio.Future[Any], call: Callable[[], Any]) -> None:
        self._queue.put((future, call))

    def stop(self) -> None:
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()
        _LIVE_THREADS.discard(self)

    def _serve(self) -> None:
        done: list[tuple[asyncio.Future[Any], bool, Any]] = []
        first_done_at = 0.0
        while True:
            if done and (
                len(done) >= _DELIVER_AFTER
                or self._queue.empty()
                or time.monotonic() - first_done_at >= _DELIVER_WITHIN_S
            ):
                _deliver(done)
                done = []
            item = self._queue.get()
            if item is None:
                break
            future, call = item
            if future.cancelled():  # its caller gave up before it started (as an executor's queued call)
                continue
            try:
                outcome = (future, True, call())
            except BaseException as exc:  # noqa: BLE001  # handed to the caller, as an executor would
                outcome = (future, False, exc)
            if not done:
                first_done_at = time.monotonic()
            done.append(outcome)
        if done:
            _deliver(done)


def _deliver(done: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for entry in done:
        loops.setdefault(entry[0].get_loop(), []).append(entry)
    for loop, entries in loops.items():
        try:
            loop.call_soon_threadsafe(_complete, entries)
        except RuntimeError:  # that loop is closed: nobody waits for these any more
            pass


def _complete(entries: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in entries:
        if future.cancelled():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


_LIVE_THREADS: weakref.WeakSet[_LedgerThread] = weakref.WeakSet()


def _stop_at_exit() -> None:  # before threads are joined
    for thread in list(_LIVE_THREADS):
        thread.stop()


threading._register_atexit(_stop_at_exit)  # type: ignore[attr-defined]  # as concurrent.futures does


class SQLiteThreadDatabase:
    """A SQLite ledger used from one dedicated thread: one hop per transaction.

    Args:
        engine / url: from :func:`~agentlease.ledger.engine.create_sqlite_thread_engine` (owned); for messages.
        busy_timeout_ms: the engine's busy timeout; also the most a transaction waits in the queue.
    """

    dialect = "sqlite"

    def __init__(self, engine: Engine, url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
        self.url = url
        self._wait_s = busy_timeout_ms / 1000
        self._engine = engine
        self._thread: _LedgerThread | None = None
        self._conn: Connection | None = None  # kept between transactions, dropped after one raised
        self._conn_read_only = False
        database = engine.url.database
        self._path = "" if not database or database == ":memory:" or database.startswith("file:") else database
        self._file_id: tuple[int, int] | None = None  # at the first transaction: another file is refused

    def _run(self, read_only: bool, transaction: Transaction[T], deadline: float) -> T:
        if time.monotonic() >= deadline:
            cause = sqlite3.OperationalError(
                f"database is locked: waited {self._wait_s:g}s behind this process's other ledger transactions"
            )
            raise OperationalError("BEGIN", None, cause)
        self._check_file()
        conn = self._conn
        if conn is None:
            conn = self._conn = self._engine.connect()
            self._conn_read_only = False
        if read_only is not self._conn_read_only:  # the begin listener reads it: BEGIN or BEGIN IMMEDIATE
            conn.execution_options(**{READ_ONLY_OPTION: read_only})
            self._conn_read_only = read_only
        try:
            with conn.begin():
                result = transaction(conn)
        except BaseException:  # rolled back; the next transaction takes a fresh connection
            self._conn = None
            try:
                conn.close()
            except (SQLAlchemyError, sqlite3.Error):
                conn.invalidate()
            raise
        if self._file_id is None:
            self._file_id = self._stat()
        return result

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        self._engine.dispose()

    def _stat(self) -> tuple[int, int] | None:
        if not self._path:
            return None
        try:
            found = os.stat(self._path)
        except FileNotFoundError:
            return None
        return found.st_dev, found.st_ino

    def _check_file(self) -> None:
        if self._file_id is None:
            return
        now = self._stat()
        if now != self._file_id:
            raise LedgerFileChangedError(self._path, "deleted" if now is None else "replaced by another file")

    async def _hop(self, read_only: bool, transaction: Transaction[T]) -> T:
        if self._thread is None:
            self._thread = _LedgerThread()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + self._wait_s
        self._thread.submit(future, functools.partial(self._run, read_only, transaction, deadline))
        with unavailable_as_error(self.url):
            return await future

    async def write(self, transaction: Transaction[T]) -> T:
        return await self._hop(False, transaction)

    async def read(self, transaction: Transaction[T]) -> T:
        return await self._hop(True, transaction)

    write_one = write

    async def write_statement(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Any]:
        return await self.write_one(functools.partial(execute, statement=statement, params=params))

    async def dispose(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        # Queued behind any transaction still running, on the thread that used the connection.
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        thread.submit(closed, self._close)
        try:
            await closed
        finally:
            thread.stop()


class AsyncEngineDatabase:
    """The PostgreSQL ledger's database: each transaction runs via ``run_sync``; a lease statement alone goes
    straight to asyncpg on a pooled connection that it keeps checked out for the next one while no caller
    waits for the pool (within the pool's size; one idle :data:`PG_PING_AFTER_IDLE_S` or more is pinged by the
    pool first).

    Args:
        engine: from :func:`~agentlease.ledger.engine.create_pg_ledger_engine`; owned.
        url: the ledger's URL as messages show it (password masked, options kept: ``display_url``).
    """

    def __init__(self, engine: AsyncEngine, url: str) -> None:
        self._engine = engine
        self._read_engine = engine.execution_options(**{READ_ONLY_OPTION: True})
        self._autocommit_engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.dialect = engine.dialect.name
        self.url = url
        self._kept: list[tuple[float, PoolProxiedConnection]] = []  # (idle since, connection), newest last
        self._waiting = 0  # callers waiting for the pool: a finished lease statement gives its connection back

    async def write(self, transaction: Transaction[T]) -> T:
        return await self._transaction(self._engine.begin, transaction)

    async def read(self, transaction: Transaction[T]) -> T:
        return await self._transaction(self._read_engine.begin, transaction)

    async def write_one(self, transaction: Transaction[T]) -> T:
        return await self._transaction(self._autocommit_engine.connect, transaction)

    async def _transaction(self, begin: Callable[[], Any], transaction: Transaction[T]) -> T:
        self._give_back()
        with unavailable_as_error(self.url):
            self._waiting += 1
            waiting = True
            try:
                async with begin() as conn:
                    self._waiting -= 1
                    waiting = False
                    return await conn.run_sync(transaction)
            finally:
                if waiting:
                    self._waiting -= 1

    async def write_statement(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Any]:
        # unavailable_as_error, written out: this is the lease's hot path (bench/README.md)
        try:
            raw = await self._connection()
            try:
                rows = await fetch_alone(raw, self._engine.dialect, statement, params)
            except BaseException:
                raw.close()  # back to the pool, which discards it if it was invalidated
                raise
        except _driver_errors() as exc:
            _raise_as_ledger_error(exc, self.url)
        if self._waiting:
            raw.close()
        else:
            self._kept.append((time.monotonic(), raw))
        return rows

    async def _connection(self) -> PoolProxiedConnection:
        """The newest kept connection, else one from the pool. Kept ones idle :data:`PG_PING_AFTER_IDLE_S` or more
        go back to the pool first, whose checkout pings them (``create_pg_ledger_engine``) as any pooled one."""
        if self._kept and time.monotonic() - self._kept[-1][0] < PG_PING_AFTER_IDLE_S:
            return self._kept.pop()[1]
        self._give_back()  # newest last: none is fresh
        self._waiting += 1
        try:
            return await self._engine.raw_connection()
        except self._engine.dialect.loaded_dbapi.Error as exc:
            # A server that refuses the new session ("not yet accepting connections" while it starts): the pool
            # raises the driver's error as it is, where a connection SQLAlchemy opens itself wraps it.
            raise DBAPIError.instance(None, None, exc, self._engine.dialect.loaded_dbapi.Error) from exc
        finally:
            self._waiting -= 1

    def _give_back(self) -> None:
        """Return the kept connections to the pool (a transaction is about to wait for one), each idle since it
        was kept: the pool pings one kept :data:`PG_PING_AFTER_IDLE_S` or more before its next use."""
        kept, self._kept = self._kept, []
        for idle_since, raw in kept:
            info = raw.info  # the pooled connection's own (outlives this checkout)
            raw.close()
            info[PG_IDLE_SINCE] = idle_since

    async def dispose(self) -> None:
        self._give_back()
        await self._engine.dispose()
