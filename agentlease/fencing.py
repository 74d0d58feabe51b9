"""Fenced writes to SQL resources: the claim generation as a fencing token (G2), moved by one conditional upsert
on the downstream's ``fences`` table inside the writer's own transaction (``docs/edge.md``, "Fencing tokens at
the downstream"); with a fencing key only a token signed for the resource passes (``docs/security-downstream.md``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import BigInteger, Column, MetaData, String, Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentlease.clock import db_now_ms
from agentlease.errors import ConfigurationError, InvalidFencingTokenError, StaleFencingTokenError
from agentlease.ledger.tables import NAMING_CONVENTION
from agentlease.limits import check_text, is_decimal

MAX_GENERATION = 2**63 - 1
"""The largest generation a ``BIGINT`` column holds."""

MAX_RESOURCE_KEY_LENGTH = 400
"""Longest resource key, in characters."""

metadata = MetaData(naming_convention=NAMING_CONVENTION)  # the downstream's, holding fences

fences = Table(
    "fences",
    metadata,
    Column("resource_key", String(MAX_RESOURCE_KEY_LENGTH), primary_key=True),
    Column("generation", BigInteger, nullable=False),
    Column("updated_at_ms", BigInteger, nullable=False),
)
"""Highest generation accepted per fenced resource; ``updated_at_ms`` is when it last moved."""


@dataclass(frozen=True)
class FencingToken:
    """A fenced resource and the claim generation a writer carries for it.

    Attributes:
        resource_key: the fenced resource, 1 to 400 characters.
        generation: the writer's claim generation, 0 to 2**63 - 1.

    Raises:
        ValueError: an empty or too long key, or a generation that is not such an integer.
    """

    resource_key: str
    generation: int

    def __post_init__(self) -> None:
        check_resource_key(self.resource_key)
        check_generation(self.generation)


def check_generation(generation: int) -> int:
    """Return ``generation`` if it is an integer in 0..2**63 - 1 (a ``bool`` is not).

    Raises:
        ValueError: anything else.
    """
    if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation <= MAX_GENERATION:
        raise ValueError(f"a fencing generation is an integer from 0 to {MAX_GENERATION}, not {generation!r}")
    return generation


def check_resource_key(resource_key: str) -> str:
    """Return ``resource_key`` if it is a string of 1 to 400 characters, none of them NUL or a lone surrogate (which
    neither database stores).

    Raises:
        ValueError: anything else.
    """
    try:
        if isinstance(resource_key, str) and 0 < len(resource_key) <= MAX_RESOURCE_KEY_LENGTH:
            return check_text(resource_key)
    except ValueError:  # a NUL or a lone surrogate: told below, with the rest of the rule
        pass
    raise ValueError(
        f"a fenced resource key has 1 to {MAX_RESOURCE_KEY_LENGTH} characters, none NUL or a lone surrogate, "
        f"not {resource_key!r:.440}"
    )


refusals_told: ContextVar[Callable[[StaleFencingTokenError, AsyncEngine], None] | None] = ContextVar(
    "agentlease_fence_refusals_told", default=None
)
"""Called with each refusal :func:`advance_fence` raises and the database that refused it, before it raises it (a
guarded call's record of its own fence refused, set by ``agentlease.idempotency.edge``: a framework may turn the
exception into something else on its way out)."""


def _signature(fencing_key: bytes, resource_key: str, generation: int) -> str:
    message = f"agentlease-fence\n{resource_key}\n{generation}".encode()
    mac = hmac.new(fencing_key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


MIN_FENCING_KEY_BYTES = 16
"""The shortest fencing key, in bytes (``AGENTLEASE_FENCING_KEY``), on both sides."""


def fencing_key_bytes(fencing_key: bytes | str | None) -> bytes | None:
    """A downstream guard's ``fencing_key`` as bytes (text is UTF-8); ``None`` stays ``None``.

    Raises:
        ConfigurationError: a key shorter than :data:`MIN_FENCING_KEY_BYTES`, or neither bytes nor text.
    """
    if fencing_key is None:
        return None
    if not isinstance(fencing_key, bytes | str):
        raise ConfigurationError(f"a fencing key is bytes or text, not {type(fencing_key).__name__}")
    key = fencing_key.encode("utf-8") if isinstance(fencing_key, str) else fencing_key
    if len(key) < MIN_FENCING_KEY_BYTES:
        raise ConfigurationError(f"a fencing key has at least {MIN_FENCING_KEY_BYTES} bytes, not {len(key)}")
    return key


def sign_fencing_token(fencing_key: bytes, resource_key: str, generation: int) -> str:
    """The signed fencing token ``<generation>.<signature>`` of ``generation`` for ``resource_key``.

    Args:
        fencing_key: the shared fencing key (``AGENTLEASE_FENCING_KEY``), at least 16 bytes.
        resource_key / generation: the fenced resource the downstream will name (1 to 400 characters); the claim's.

    Raises:
        ValueError: a short key, a bad resource key or generation.
    """
    if len(fencing_key) < MIN_FENCING_KEY_BYTES:
        raise ValueError(f"a fencing key has at least {MIN_FENCING_KEY_BYTES} bytes")
    token = FencingToken(resource_key, generation)
    return f"{token.generation}.{_signature(fencing_key, token.resource_key, token.generation)}"


def verify_fencing_token(fencing_key: bytes, resource_key: str, token: str | int | None) -> int:
    """The generation of a signed fencing token that verifies for ``resource_key``.

    Raises:
        InvalidFencingTokenError: no token, an unsigned one (a bare integer), a malformed one, or a
            signature that is not the fencing key's for this resource and generation.
    """
    if token is None:
        raise InvalidFencingTokenError(resource_key, "a signed fencing token is required")
    if not isinstance(token, str) or "." not in token:
        raise InvalidFencingTokenError(resource_key, "the token is not signed (expected <generation>.<signature>)")
    raw_generation, _, signature = token.partition(".")
    if not _decimal(raw_generation) or int(raw_generation) > MAX_GENERATION:
        raise InvalidFencingTokenError(resource_key, "malformed generation")
    if not signature.isascii():  # compare_digest takes ASCII text only; a signature is base64url
        raise InvalidFencingTokenError(resource_key, "malformed signature")
    generation = int(raw_generation)
    if not hmac.compare_digest(signature, _signature(fencing_key, resource_key, generation)):
        raise InvalidFencingTokenError(
            resource_key, "the signature is not the ledger's fencing key's for this resource"
        )
    return generation


def token_generation(resource_key: str, token: int | str, fencing_key: bytes | None) -> int:
    """The generation a writer's ``token`` carries: verified when ``fencing_key`` is set, else read.

    Raises:
        InvalidFencingTokenError: with a key, a token that does not verify (see :func:`verify_fencing_token`).
        ValueError: without a key, a token that is not a generation (or ``<generation>.<signature>``).
    """
    if fencing_key is not None:
        return verify_fencing_token(fencing_key, resource_key, token)
    if isinstance(token, str):
        raw = token.partition(".")[0]
        if not _decimal(raw):
            raise ValueError(f"a fencing token is a generation, not {token!r}")
        return check_generation(int(raw))
    return token


def _decimal(text: str) -> bool:
    """Whether ``text`` is 1 to 19 ASCII digits (:func:`~agentlease.limits.is_decimal`)."""
    return is_decimal(text) and len(text) <= 19


def upsert_for(dialect_name: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An ``INSERT`` with ``ON CONFLICT`` support for ``table`` on SQLite or PostgreSQL.

    Raises:
        ValueError: another dialect.
    """
    if dialect_name == "postgresql":
        return postgresql.insert(table)
    if dialect_name == "sqlite":
        return sqlite.insert(table)
    raise ValueError(f"unsupported dialect {dialect_name!r}: use sqlite or postgresql")


async def create_fence_table(engine: AsyncEngine) -> None:
    """Create ``fences`` in the downstream's database if it does not exist (safe to run again)."""
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)


async def read_fence(conn: AsyncConnection, resource_key: str) -> int | None:
    """The highest generation ``resource_key`` has accepted, or ``None`` if it was never fenced."""
    return (await conn.execute(select(fences.c.generation).where(fences.c.resource_key == resource_key))).scalar()


async def advance_fence(
    conn: AsyncConnection,
    resource_key: str,
    generation: int | str,
    *,
    now: datetime | None = None,
    fencing_key: bytes | None = None,
) -> None:
    """Accept ``generation`` for ``resource_key`` inside the caller's transaction (an equal or newer one moves the
    fence or leaves it), or refuse it, so that the fenced write commits only with an accepted fence.

    Args:
        conn: a connection inside the caller's transaction (``engine.begin()``).
        resource_key / generation: the fenced resource (1 to 400 characters); the writer's claim generation, or
            its signed token ``<generation>.<signature>``.
        now: injected time for ``updated_at_ms``; default the database's clock.
        fencing_key: only a signed token that verifies for ``resource_key`` passes. Default ``None``: taken as sent.

    Raises:
        StaleFencingTokenError: the resource has accepted a newer generation.
        InvalidFencingTokenError: with ``fencing_key``, an unsigned or forged token; the fence is untouched.
        ValueError: a bad key or generation (see :class:`FencingToken`).
    """
    token = FencingToken(resource_key, token_generation(check_resource_key(resource_key), generation, fencing_key))
    now_ms = db_now_ms(conn.dialect.name, now)
    insert = upsert_for(conn.dialect.name, fences).values(
        resource_key=token.resource_key, generation=token.generation, updated_at_ms=now_ms
    )
    statement = insert.on_conflict_do_update(
        index_elements=[fences.c.resource_key],
        set_={"generation": insert.excluded.generation, "updated_at_ms": insert.excluded.updated_at_ms},
        where=fences.c.generation <= insert.excluded.generation,
    ).returning(fences.c.generation)
    if (await conn.execute(statement)).first() is None:
        # On PostgreSQL the refused upsert has locked the row: this read sees what refused us.
        refused = StaleFencingTokenError(
            token.resource_key, token.generation, await read_fence(conn, token.resource_key)
        )
        told = refusals_told.get()
        if told is not None:
            told(refused, conn.engine)
        raise refused


@asynccontextmanager
async def fenced_write(
    engine: AsyncEngine,
    resource_key: str,
    generation: int | str,
    *,
    now: datetime | None = None,
    fencing_key: bytes | None = None,
) -> AsyncIterator[AsyncConnection]:
    """Open a transaction that has already accepted ``generation`` (:func:`advance_fence`); it commits when the
    block exits, the fence move with the caller's writes.

    Args:
        engine: the downstream's engine (:func:`~agentlease.ledger.engine.create_async_database_engine`).
        resource_key / generation / now / fencing_key: as for :func:`advance_fence`.

    Yields:
        The connection of the open transaction.

    Raises:
        StaleFencingTokenError / InvalidFencingTokenError / ValueError: as :func:`advance_fence`.
    """
    async with engine.begin() as conn:
        await advance_fence(conn, resource_key, generation, now=now, fencing_key=fencing_key)
        yield conn
