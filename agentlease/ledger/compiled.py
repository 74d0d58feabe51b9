"""The ledger's hot statements run on the driver connection: rendered and compiled once by SQLAlchemy, executed
without its per-call machinery (``bench/README.md``); driver errors are wrapped and a failed PostgreSQL
connection invalidated, as SQLAlchemy's own execution would."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

from agentlease.ledger.engine import asyncpg_errors

if TYPE_CHECKING:
    from sqlalchemy.pool import PoolProxiedConnection

_Processor = Callable[[Any], Any] | None


class Compiled:
    """One statement compiled for one dialect."""

    def __init__(self, statement: Any, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
        self.sql = str(compiled)
        self.order: list[tuple[str | None, Any, _Processor]] = []
        for name in compiled.positiontup or ():
            bind = compiled.binds[name]  # KeyError: an expanding IN list, not supported here
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if bind.callable is None and not bind.required:
                value = bind.value if processor is None else processor(bind.value)
                self.order.append((None, value, None))  # a constant of the statement
            else:
                self.order.append((bind.key, None, processor))
        self.keys = frozenset(key for key, _value, _processor in self.order if key is not None)
        self._constants = [value for _key, value, _processor in self.order]
        self._given = [(index, key, processor) for index, (key, _, processor) in enumerate(self.order) if key]
        self._plain = [(index, key) for index, key, processor in self._given if processor is None]
        self._processed = [(index, key, processor) for index, key, processor in self._given if processor]
        columns: list[Any] = list(
            getattr(statement, "selected_columns", None) or getattr(statement, "exported_columns", None) or ()
        )
        names = [column.key for column in columns]
        self.row_type = row_type(names)
        self.result_processors: list[_Processor] = [
            column.type.dialect_impl(dialect).result_processor(dialect, None) for column in columns
        ]
        self._results = [(index, processor) for index, processor in enumerate(self.result_processors) if processor]
        self.has_results = bool(columns)

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The statement's positional arguments: its constants, and ``params`` through the types' bind processors."""
        out = self._constants.copy()
        for index, key in self._plain:
            out[index] = params[key]
        for index, key, processor in self._processed:
            given = params[key]
            out[index] = given if given is None else processor(given)
        return out

    def rows(self, raw: Sequence[Sequence[Any]]) -> list[Any]:
        """Rows of ``raw`` through the columns' result processors (those that have one)."""
        make, processors = self.row_type, self._results
        if not processors:
            return [make(*row) for row in raw]
        out = []
        for row in raw:
            values = list(row)
            for index, processor in processors:
                if values[index] is not None:
                    values[index] = processor(values[index])
            out.append(make(*values))
        return out


def row_type(names: list[str]) -> type:
    """A row class with these column names: attributes by name, and ``_mapping`` as SQLAlchemy's rows have."""
    base = collections.namedtuple("LedgerRow", names)  # type: ignore[misc]

    class LedgerRow(base):
        __slots__ = ()

        @property
        def _mapping(self) -> dict[str, Any]:
            return self._asdict()

    return LedgerRow


_COMPILED: dict[tuple[int, str], tuple[ClauseElement, Compiled]] = {}


def _compiled(statement: ClauseElement, dialect: Dialect) -> Compiled:
    key = (id(statement), dialect.name)
    found = _COMPILED.get(key)
    if found is None or found[0] is not statement:
        found = _COMPILED[key] = (statement, Compiled(statement, dialect))
    return found[1]


def execute(conn: Connection, statement: ClauseElement, params: Mapping[str, Any]) -> list[Any]:
    """Run a prebuilt ``statement`` (compiled once; named ``bindparam`` s or constants, no expanding ``IN``
    lists) with ``params`` on ``conn``: on SQLite with ``sqlite3``, in autocommit with asyncpg's ``fetch``, else
    through SQLAlchemy. Returns its rows.

    Raises:
        DBAPIError: the driver's error, wrapped.
    """
    dialect = conn.dialect
    compiled = _compiled(statement, dialect)
    if dialect.name == "sqlite":
        args = compiled.args(params)
        driver: Any = conn.connection.driver_connection
        try:
            cursor = driver.execute(compiled.sql, args)
            raw = cursor.fetchall() if compiled.has_results else []
        except dialect.loaded_dbapi.Error as exc:
            raise DBAPIError.instance(compiled.sql, args, exc, dialect.loaded_dbapi.Error) from exc
        return compiled.rows(raw)
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        args = compiled.args(params)
        adapted = conn.connection.dbapi_connection
        try:
            if compiled.has_results:
                raw = adapted.run_async(lambda driver: driver.fetch(compiled.sql, *args))  # type: ignore[union-attr]
            else:
                adapted.run_async(lambda driver: driver.execute(compiled.sql, *args))  # type: ignore[union-attr]
                raw = []
        except Exception as exc:
            if not isinstance(exc, asyncpg_errors("PostgresError")):  # the server answered: the connection is fine
                conn.invalidate(exc)
            raise DBAPIError.instance(compiled.sql, args, exc, Exception) from exc
        return compiled.rows(raw)
    result = conn.execute(statement, {key: params[key] for key in compiled.keys})  # type: ignore[call-overload]
    return list(result) if compiled.has_results else []


async def fetch_alone(
    raw: PoolProxiedConnection, dialect: Dialect, statement: ClauseElement, params: Mapping[str, Any]
) -> list[Any]:
    """Run a prebuilt ``statement`` alone on ``raw``, a checked-out connection of a PostgreSQL pool, straight to
    asyncpg's ``fetch`` (autocommit, no greenlet). A connection whose statement failed other than by the
    server's answer is invalidated (closed at once, never reused); the caller gives ``raw`` back either way.

    Raises:
        DBAPIError: the driver's error, wrapped (as :func:`execute` does).
    """
    compiled = _compiled(statement, dialect)
    args = compiled.args(params)
    try:
        rows = await raw.driver_connection.fetch(compiled.sql, *args)  # type: ignore[union-attr]
    except BaseException as exc:
        if not isinstance(exc, asyncpg_errors("PostgresError")):  # the server did not answer: the connection is gone
            raw.invalidate(exc if isinstance(exc, Exception) else None)
        if isinstance(exc, Exception):
            raise DBAPIError.instance(compiled.sql, args, exc, Exception) from exc
        raise
    return compiled.rows(rows)
