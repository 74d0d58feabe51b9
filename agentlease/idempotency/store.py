"""Idempotency keys and their answers in the downstream's database (SQLite or PostgreSQL): ``idempotency_keys``,
one row per key, beside the fences of :mod:`agentlease.fencing` (``docs/edge.md``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    delete,
    false,
    inspect,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentlease.clock import db_now_ms, duration_ms
from agentlease.errors import AgentLeaseError
from agentlease.fencing import FencingToken, advance_fence, create_fence_table, upsert_for
from agentlease.idempotency.convention import MAX_KEY_LENGTH
from agentlease.ledger.engine import create_async_database_engine
from agentlease.ledger.tables import NAMING_CONVENTION

DEFAULT_RETENTION = timedelta(hours=24)
"""How long a key's answer (or its doubt) is kept before the key may be used again. Default 24h."""

DEFAULT_LOCK_TIMEOUT = timedelta(seconds=60)
"""How long an in-flight key blocks other requests before its holder counts as gone. Default 60s."""


class KeyStatus(StrEnum):
    """State of one idempotency key at the downstream; how each is left: ``docs/edge.md``, "A key's life"."""

    IN_FLIGHT = "in_flight"
    """A handler holds the key."""
    DONE = "done"
    """The effect's answer is stored and replayed, until the retention has passed."""
    IN_DOUBT = "in_doubt"
    """The handler started and its outcome is unknown: the key is never given back by itself."""


metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""The downstream-owned metadata holding :data:`idempotency_keys`."""

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("key", String(MAX_KEY_LENGTH), primary_key=True),
    Column("request_hash", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("lock_id", String(32), nullable=False),
    Column("effect_in_transaction", Boolean, nullable=False, server_default=false()),
    Column("response_status", Integer),
    Column("response_headers", JSON),
    Column("response_body", LargeBinary),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("expires_at_ms", BigInteger, nullable=False),
    CheckConstraint("status IN ('in_flight', 'done', 'in_doubt')", name="status"),
    Index("ix_idempotency_keys_expires_at_ms", "expires_at_ms"),
)
"""One row per key; ``expires_at_ms``: the lock's end while ``in_flight``, else the retention's end."""

_KEPT_BEFORE_0_4 = tuple(column.name for column in idempotency_keys.c if column.name != "effect_in_transaction")

_K = idempotency_keys.c


class KeyTakenOverError(AgentLeaseError):
    """The holder's lock timed out and another request took the key: this holder's effect must not commit.

    Attributes:
        key: the stored key.
    """

    def __init__(self, key: str) -> None:
        super().__init__(f"idempotency key {key!r} was taken over after its lock timed out; this write rolls back")
        self.key = key


@dataclass(frozen=True)
class StoredResponse:
    """An answer kept for replay.

    Attributes:
        status / headers / body: HTTP status (an MCP result: 200), ``(name, value)`` pairs (latin-1), bytes.
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class Claimed:
    """This request holds the key; run the handler, then complete, release or hold the key in doubt.

    Attributes:
        key / lock_id: the stored key; proof of this claim, checked by every later write of the key.
    """

    key: str
    lock_id: str


@dataclass(frozen=True)
class Held:
    """Another request holds the key, has answered it, or left it in doubt.

    Attributes:
        status / response: the key's status; the stored answer when ``done``.
        same_request: whether the holder's request hash equals this request's.
    """

    status: KeyStatus
    same_request: bool
    response: StoredResponse | None


def _positive(name: str, value: timedelta) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValueError(f"{name} must be a positive timedelta, not {value!r}")
    return value


def _answer(response: StoredResponse) -> dict[str, Any]:
    headers = [list(pair) for pair in response.headers]
    return {"response_status": response.status, "response_headers": headers, "response_body": response.body}


def _held_by(key: str, lock_id: str, *statuses: KeyStatus) -> Any:
    """The row of ``key`` still held by ``lock_id`` in one of ``statuses``."""
    return (_K.key == key) & (_K.lock_id == lock_id) & _K.status.in_([status.value for status in statuses])


def _response_of(row: Any) -> StoredResponse | None:
    if row.response_status is None:
        return None
    headers = [(name, value) for name, value in row.response_headers or []]
    return StoredResponse(row.response_status, headers, bytes(row.response_body or b""))


class IdempotencyStore:
    """Claims, answers and doubts of idempotency keys in the downstream's database.

    Args:
        engine: the downstream's async engine (see :func:`create_async_database_engine`); the store owns it.
        retention: how long a key's answer or doubt is kept. Default 24h.
        lock_timeout: how long an in-flight key blocks others before its holder counts as gone. Default 60s.

    Raises:
        ValueError: a retention or lock timeout that is not a positive ``timedelta``.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        retention: timedelta = DEFAULT_RETENTION,
        lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self._engine = engine
        self.retention = _positive("retention", retention)
        self.lock_timeout = _positive("lock_timeout", lock_timeout)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> IdempotencyStore:
        """Open a store on ``sqlite:///PATH`` or ``postgresql://...``; ``options`` as for the constructor.

        Raises:
            ConfigurationError: bad URL.
        """
        return cls(create_async_database_engine(url), **options)

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def close(self) -> None:
        """Dispose of the engine's connections."""
        await self._engine.dispose()

    async def create_tables(self) -> None:
        """Create ``idempotency_keys`` and ``fences`` if they do not exist (safe to run again); a key table of
        agentlease 0.3 or earlier is rebuilt, its rows kept."""
        await create_fence_table(self._engine)
        async with self._engine.begin() as conn:
            await conn.run_sync(_create_or_upgrade)

    def _now(self, now: datetime | None) -> Any:
        return db_now_ms(self._engine.dialect.name, now)

    async def _rowcount(self, statement: Any) -> int:
        """Run ``statement`` in a transaction of its own; the rows it changed."""
        async with self._engine.begin() as conn:
            return int((await conn.execute(statement)).rowcount)

    async def claim(
        self,
        key: str,
        request_hash: str,
        *,
        fence: FencingToken | None = None,
        commits_with_key: bool = False,
        now: datetime | None = None,
    ) -> Claimed | Held:
        """Pass the fence (moved first, whatever the key's state), then claim ``key`` for one execution, in one
        transaction; an in-flight key whose holder timed out is taken over if its effect commits with its
        key, else put in doubt.

        Args:
            key / request_hash: the stored key (scoped to its caller); :func:`~.convention.request_hash`.
            fence: the request's fenced resource and generation, if it carries one.
            commits_with_key: the handler commits its effect with its key (:meth:`promise_effect_in_transaction`).
            now: injected time; default the database's clock.

        Returns:
            :class:`Claimed`, or :class:`Held` describing the row that blocked the claim.

        Raises:
            StaleFencingTokenError: the resource has accepted a newer generation; nothing changed.
        """
        dialect = self._engine.dialect.name
        now_ms = self._now(now)
        lock_id = uuid.uuid4().hex
        insert = upsert_for(dialect, idempotency_keys).values(
            key=key,
            request_hash=request_hash,
            status=KeyStatus.IN_FLIGHT.value,
            lock_id=lock_id,
            effect_in_transaction=commits_with_key,
            response_status=None,
            response_headers=None,
            response_body=None,
            created_at_ms=now_ms,
            expires_at_ms=now_ms + duration_ms(self.lock_timeout),
        )
        takeable = (_K.expires_at_ms <= now_ms) & or_(_K.status != KeyStatus.IN_FLIGHT.value, _K.effect_in_transaction)
        claim = insert.on_conflict_do_update(
            index_elements=[_K.key],
            set_={column.name: insert.excluded[column.name] for column in idempotency_keys.c if column.name != "key"},
            where=takeable,
        ).returning(_K.lock_id)
        async with self._engine.begin() as conn:
            if fence is not None:
                await advance_fence(conn, fence.resource_key, fence.generation, now=now)
            if (await conn.execute(claim)).first() is not None:
                return Claimed(key, lock_id)
            row = (
                await conn.execute(
                    select(idempotency_keys, (_K.expires_at_ms <= now_ms).label("lapsed")).where(_K.key == key)
                )
            ).one()
            status = KeyStatus(row.status)
            if status is KeyStatus.IN_FLIGHT and row.lapsed:
                # The holder timed out and promised nothing: whether it acted is unknown.
                await self._set_in_doubt(conn, key, row.lock_id, now)
                status = KeyStatus.IN_DOUBT
        response = _response_of(row) if status is KeyStatus.DONE else None
        return Held(status, row.request_hash == request_hash, response)

    async def _set_in_doubt(self, conn: AsyncConnection, key: str, lock_id: str, now: datetime | None) -> bool:
        result = await conn.execute(
            update(idempotency_keys)
            .where(_held_by(key, lock_id, KeyStatus.IN_FLIGHT))
            .values(status=KeyStatus.IN_DOUBT.value, expires_at_ms=self._now(now) + duration_ms(self.retention))
        )
        return result.rowcount == 1

    def _answered(self, claim: Claimed, response: StoredResponse, now: datetime | None) -> Any:
        """The conditional ``UPDATE`` that stores ``claim``'s answer (from in flight or in doubt)."""
        return (
            update(idempotency_keys)
            .where(_held_by(claim.key, claim.lock_id, KeyStatus.IN_FLIGHT, KeyStatus.IN_DOUBT))
            .values(
                status=KeyStatus.DONE.value,
                expires_at_ms=self._now(now) + duration_ms(self.retention),
                **_answer(response),
            )
        )

    async def complete(self, claim: Claimed, response: StoredResponse, *, now: datetime | None = None) -> bool:
        """Store the answer of a claimed key (in flight, or put in doubt meanwhile) and start its retention.

        Returns:
            ``False`` when the key had been taken over (nothing stored).
        """
        return await self._rowcount(self._answered(claim, response, now)) == 1

    async def replace_answer(self, claim: Claimed, response: StoredResponse) -> bool:
        """Replace the answer a claim stored with its effect (:func:`record_done`) by the handler's final one."""
        done = _held_by(claim.key, claim.lock_id, KeyStatus.DONE)
        return await self._rowcount(update(idempotency_keys).where(done).values(**_answer(response))) == 1

    async def record_done(
        self, conn: AsyncConnection, claim: Claimed, response: StoredResponse, *, now: datetime | None = None
    ) -> None:
        """Store ``claim``'s answer inside the effect's own transaction (``conn``): done exactly when it commits.

        Raises:
            KeyTakenOverError: the key was taken over after its lock timed out; the caller's transaction
                must roll back (raising does that inside ``engine.begin()``).
        """
        if (await conn.execute(self._answered(claim, response, now))).rowcount != 1:
            raise KeyTakenOverError(claim.key)

    async def promise_effect_in_transaction(self, claim: Claimed) -> None:
        """Record that ``claim``'s effect commits with its key: should its holder vanish, a later request may
        take the key over once the lock times out.

        Raises:
            KeyTakenOverError: the key was taken over already; the holder must not act.
        """
        held = _held_by(claim.key, claim.lock_id, KeyStatus.IN_FLIGHT)
        if await self._rowcount(update(idempotency_keys).where(held).values(effect_in_transaction=True)) != 1:
            raise KeyTakenOverError(claim.key)

    async def release(self, claim: Claimed) -> bool:
        """Give a claimed key back: its handler failed before any effect; a retry may run it.

        Returns:
            ``False`` when the key had been taken over or answered (nothing deleted).
        """
        held = _held_by(claim.key, claim.lock_id, KeyStatus.IN_FLIGHT, KeyStatus.IN_DOUBT)
        return await self._rowcount(delete(idempotency_keys).where(held)) == 1

    async def hold_in_doubt(self, claim: Claimed, *, now: datetime | None = None) -> bool:
        """Keep a claimed key as ``in_doubt``: its handler started and its outcome is unknown.

        Returns:
            ``False`` when the key had been taken over or answered (nothing changed).
        """
        async with self._engine.begin() as conn:
            return await self._set_in_doubt(conn, claim.key, claim.lock_id, now)

    async def lookup(self, key: str, *, now: datetime | None = None) -> Held | None:
        """The live row of ``key`` (its status and stored answer), ``None`` if it has none."""
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(select(idempotency_keys).where(_K.key == key, _K.expires_at_ms > self._now(now)))
            ).first()
        if row is None:
            return None
        status = KeyStatus(row.status)
        return Held(status, True, _response_of(row) if status is KeyStatus.DONE else None)

    async def resolve(self, key: str, *, applied: bool, response: StoredResponse | None = None) -> bool:
        """The service owner's word on a key in doubt: it took effect, or it did not (the key is given back).

        Args:
            key: the stored key (:func:`~agentlease.idempotency.convention.scoped_key` of caller and key).
            applied / response: whether the effect happened; the answer to replay when it did.

        Returns:
            ``False`` when the key is not in doubt (nothing changed).

        Raises:
            ValueError: ``applied`` without a ``response``.
        """
        doubtful = (_K.key == key) & (_K.status == KeyStatus.IN_DOUBT.value)
        if not applied:
            return await self._rowcount(delete(idempotency_keys).where(doubtful)) == 1
        if response is None:
            raise ValueError("an applied key needs the answer to replay")
        done = update(idempotency_keys).where(doubtful).values(status=KeyStatus.DONE.value, **_answer(response))
        return await self._rowcount(done) == 1

    async def purge_expired(self, *, now: datetime | None = None) -> int:
        """Delete the rows whose retention has passed (but in-flight ones); returns how many. Optional."""
        lapsed = (_K.expires_at_ms <= self._now(now)) & (_K.status != KeyStatus.IN_FLIGHT.value)
        return await self._rowcount(delete(idempotency_keys).where(lapsed))


def _create_or_upgrade(conn: Connection) -> None:
    """Create the key table, or rebuild one of agentlease 0.3 or earlier, its rows kept."""
    inspector = inspect(conn)
    if inspector.has_table(idempotency_keys.name) and "effect_in_transaction" not in {
        column["name"] for column in inspector.get_columns(idempotency_keys.name)
    }:
        kept = select(*(idempotency_keys.c[name] for name in _KEPT_BEFORE_0_4))
        rows = [dict(row._mapping) for row in conn.execute(kept)]
        idempotency_keys.drop(conn)
        metadata.create_all(conn)
        if rows:
            conn.execute(idempotency_keys.insert(), rows)
        return
    metadata.create_all(conn)
