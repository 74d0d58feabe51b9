"""Storage of idempotency keys and their responses, on SQLite or PostgreSQL (SQLAlchemy async).

The table ``idempotency_keys`` lives in the downstream service's database, beside the fences of
:mod:`agentlease.fencing`; the service creates both at startup with
:meth:`IdempotencyStore.create_tables` (``metadata.create_all``). They are not part of the
ledger's Alembic migrations: the ledger and a downstream service are different systems and
usually different databases, and the service owns its schema.

One row per key. ``expires_at_ms`` is the only clock a row has: while ``in_flight`` it is the end
of the in-flight lock (claim time + ``lock_timeout``), once ``done`` it is the end of the
retention (completion time + ``retention``). A row whose ``expires_at_ms`` has passed on the
database's clock is treated as absent by the claim, which is one conditional statement:

.. code-block:: sql

    INSERT INTO idempotency_keys (...) VALUES (..., 'in_flight', :lock_id, ..., :now + :lock_timeout_ms)
    ON CONFLICT (key) DO UPDATE SET ... = excluded....
     WHERE idempotency_keys.expires_at_ms <= :now
    RETURNING lock_id

so of concurrent requests with one key exactly one gets a row back and executes. Completing and
releasing are guarded by the claim's ``lock_id``: a handler that outlived its lock and was taken
over cannot overwrite the newer claim's row. Expired rows need no sweeper for correctness;
:meth:`IdempotencyStore.purge_expired` only reclaims space.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    delete,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from agentlease.clock import db_now_ms, duration_ms
from agentlease.databases import create_async_database_engine
from agentlease.fencing import FencingToken, advance_fence, create_fence_table, upsert_for
from agentlease.idempotency.convention import MAX_KEY_LENGTH
from agentlease.ledger.tables import NAMING_CONVENTION

DEFAULT_RETENTION = timedelta(hours=24)
"""How long a completed key is replayed before it may be reused. Default 24h."""

DEFAULT_LOCK_TIMEOUT = timedelta(seconds=60)
"""How long an in-flight key blocks others before a new request may take it over. Default 60s."""


class KeyStatus(StrEnum):
    """State of one idempotency key."""

    IN_FLIGHT = "in_flight"
    """A request holds the key and its handler runs. Left by completion (-> done), by a release
    (row deleted: the handler failed), or by a takeover once the lock's ``expires_at_ms`` passed."""
    DONE = "done"
    """The first response is stored and replayed. Left only when the retention has passed."""


metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""The downstream-owned metadata holding :data:`idempotency_keys`."""

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("key", String(MAX_KEY_LENGTH), primary_key=True),
    Column("request_hash", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("lock_id", String(32), nullable=False),
    Column("response_status", Integer),
    Column("response_headers", JSON),
    Column("response_body", LargeBinary),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("expires_at_ms", BigInteger, nullable=False),
    CheckConstraint("status IN ('in_flight', 'done')", name="status"),
    Index("ix_idempotency_keys_expires_at_ms", "expires_at_ms"),
)
"""One row per idempotency key: request hash, state, stored response and expiry (epoch ms)."""

_K = idempotency_keys.c


@dataclass(frozen=True)
class StoredResponse:
    """A response kept for replay.

    Attributes:
        status: HTTP status code.
        headers: ``(name, value)`` pairs as the handler sent them (latin-1 text).
        body: the body bytes.
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class Claimed:
    """This request holds the key; run the handler, then :meth:`IdempotencyStore.complete` or ``release``.

    Attributes:
        key: the idempotency key.
        lock_id: proof of this claim, checked by ``complete`` and ``release``.
    """

    key: str
    lock_id: str


@dataclass(frozen=True)
class Held:
    """Another request holds or has completed the key.

    Attributes:
        status: ``in_flight`` or ``done``.
        same_request: whether the holder's request hash equals this request's.
        response: the stored response when ``done``.
    """

    status: KeyStatus
    same_request: bool
    response: StoredResponse | None


def _positive(name: str, value: timedelta) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValueError(f"{name} must be a positive timedelta, not {value!r}")
    return value


class IdempotencyStore:
    """Claims, completions and replays of idempotency keys in the downstream's database.

    Args:
        engine: the downstream's async engine (see :func:`create_async_database_engine`); the store owns it.
        retention: how long a completed key's response is replayed. Default 24h.
        lock_timeout: how long an in-flight key blocks other requests; after it a request may take
            the key over and run the handler again, so it must exceed the slowest handler.
            Default 60s.

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
        """Create ``idempotency_keys`` and ``fences`` if they do not exist (safe to run again)."""
        await create_fence_table(self._engine)
        async with self._engine.begin() as conn:
            await conn.run_sync(metadata.create_all)

    async def claim(
        self, key: str, request_hash: str, *, fence: FencingToken | None = None, now: datetime | None = None
    ) -> Claimed | Held:
        """Claim ``key`` for one execution, and pass the fence in the same transaction.

        The claim is one conditional upsert that succeeds only where no row exists or the row
        has expired. When it succeeds and ``fence`` is given, :func:`advance_fence` runs in the
        same transaction: a stale token rolls the claim back, so a refused request leaves no row.

        Args:
            key: the idempotency key.
            request_hash: see :func:`~agentlease.idempotency.convention.request_hash`.
            fence: the request's fenced resource and generation, if it carries one.
            now: injected time; default the database's clock.

        Returns:
            :class:`Claimed`, or :class:`Held` describing the live row that blocked the claim.

        Raises:
            StaleFencingTokenError: the claim was possible but the fence refused the generation.
        """
        dialect = self._engine.dialect.name
        now_ms = db_now_ms(dialect, now)
        lock_id = uuid.uuid4().hex
        insert = upsert_for(dialect, idempotency_keys).values(
            key=key,
            request_hash=request_hash,
            status=KeyStatus.IN_FLIGHT.value,
            lock_id=lock_id,
            response_status=None,
            response_headers=None,
            response_body=None,
            created_at_ms=now_ms,
            expires_at_ms=now_ms + duration_ms(self.lock_timeout),
        )
        claim = insert.on_conflict_do_update(
            index_elements=[_K.key],
            set_={column.name: insert.excluded[column.name] for column in idempotency_keys.c if column.name != "key"},
            where=_K.expires_at_ms <= now_ms,
        ).returning(_K.lock_id)
        async with self._engine.begin() as conn:
            if (await conn.execute(claim)).first() is not None:
                if fence is not None:
                    await advance_fence(conn, fence.resource_key, fence.generation, now=now)
                return Claimed(key, lock_id)
            row = (await conn.execute(select(idempotency_keys).where(_K.key == key))).one()
        response = None
        if row.status == KeyStatus.DONE:
            headers = [(name, value) for name, value in row.response_headers]
            response = StoredResponse(row.response_status, headers, bytes(row.response_body))
        return Held(KeyStatus(row.status), row.request_hash == request_hash, response)

    async def complete(self, claim: Claimed, response: StoredResponse, *, now: datetime | None = None) -> bool:
        """Store the first response of a claimed key and start its retention.

        Returns:
            ``False`` when the claim had been taken over after its lock timed out (nothing stored).
        """
        now_ms = db_now_ms(self._engine.dialect.name, now)
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(idempotency_keys)
                .where(_K.key == claim.key, _K.lock_id == claim.lock_id, _K.status == KeyStatus.IN_FLIGHT.value)
                .values(
                    status=KeyStatus.DONE.value,
                    response_status=response.status,
                    response_headers=[list(pair) for pair in response.headers],
                    response_body=response.body,
                    expires_at_ms=now_ms + duration_ms(self.retention),
                )
            )
        return result.rowcount == 1

    async def release(self, claim: Claimed) -> bool:
        """Give a claimed key back without a stored response (the handler failed); a retry may run.

        Returns:
            ``False`` when the claim had been taken over after its lock timed out (nothing deleted).
        """
        async with self._engine.begin() as conn:
            result = await conn.execute(
                delete(idempotency_keys).where(
                    _K.key == claim.key, _K.lock_id == claim.lock_id, _K.status == KeyStatus.IN_FLIGHT.value
                )
            )
        return result.rowcount == 1

    async def purge_expired(self, *, now: datetime | None = None) -> int:
        """Delete rows whose lock or retention has passed; returns how many. Optional housekeeping."""
        now_ms = db_now_ms(self._engine.dialect.name, now)
        async with self._engine.begin() as conn:
            result = await conn.execute(delete(idempotency_keys).where(_K.expires_at_ms <= now_ms))
        return result.rowcount
