"""Time on the ledger: epoch milliseconds in columns (``_ms``), aware datetimes in records. Lease expiry is judged
on the database's clock (G1); every ledger query takes an optional ``now``, the one clock seam.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import overload

from sqlalchemy import BigInteger, ColumnElement, bindparam, cast, func, literal, literal_column

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def require_aware(value: datetime) -> datetime:
    """``value`` unchanged if it is timezone-aware; ``ValueError`` if naive (agentlease never guesses a zone)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r} rejected: pass a timezone-aware datetime")
    return value


def to_ms(value: datetime) -> int:
    """Epoch milliseconds of an aware datetime. Raises ValueError for a naive one."""
    return (require_aware(value) - _EPOCH) // timedelta(milliseconds=1)


@overload
def from_ms(value: int) -> datetime: ...
@overload
def from_ms(value: None) -> None: ...
@overload
def from_ms(value: int | None) -> datetime | None: ...
def from_ms(value: int | None) -> datetime | None:
    """Aware UTC datetime for epoch milliseconds; ``None`` stays ``None``."""
    return None if value is None else _EPOCH + timedelta(milliseconds=value)


def duration_ms(value: timedelta) -> int:
    """Whole milliseconds of a duration."""
    return value // timedelta(milliseconds=1)


def _database_clock_ms(dialect_name: str) -> ColumnElement[int]:
    if dialect_name == "sqlite":  # both are stable within one statement, to the millisecond
        return cast(literal_column("(julianday('now') - 2440587.5) * 86400000.0"), BigInteger)
    if dialect_name == "postgresql":
        return cast(literal_column("floor(extract(epoch from statement_timestamp()) * 1000)"), BigInteger)
    raise ValueError(f"unsupported ledger dialect {dialect_name!r}: use sqlite or postgresql")


def db_now_ms(dialect_name: str, now: datetime | None = None) -> ColumnElement[int]:
    """SQL expression for the current time in epoch milliseconds on ``sqlite`` or ``postgresql``: the injected
    ``now`` (tests), else the database's clock (``ValueError``: another dialect, or a naive ``now``)."""
    return _database_clock_ms(dialect_name) if now is None else literal(to_ms(now), BigInteger)


NOW_PARAM = "now_ms"  # the bound parameter of bound_now_ms


def bound_now_ms(dialect_name: str) -> ColumnElement[int]:
    """The current time for statements built once: ``COALESCE(:now_ms, <clock>)``; bind :func:`now_param`."""
    return func.coalesce(bindparam(NOW_PARAM, type_=BigInteger), _database_clock_ms(dialect_name))


def now_param(now: datetime | None) -> dict[str, int | None]:
    """The parameter of :func:`bound_now_ms`: epoch ms of an injected ``now`` (not naive), or ``None``."""
    return {NOW_PARAM: None if now is None else to_ms(now)}
