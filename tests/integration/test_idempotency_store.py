"""The key store's rules on SQLite and PostgreSQL, time injected (``docs/edge.md``, "A key's life")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import FencingToken, read_fence
from agentlease.idempotency import IdempotencyStore, KeyStatus
from agentlease.idempotency.store import Claimed, Held, KeyTakenOverError, StoredResponse

LOCK = timedelta(seconds=5)
ANSWER = StoredResponse(201, [("content-type", "application/json")], b'{"id": 1}')
T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.fixture
async def store(ledger_url: str) -> AsyncIterator[IdempotencyStore]:
    opened = IdempotencyStore.from_url(ledger_url, lock_timeout=LOCK, retention=timedelta(hours=1))
    await opened.create_tables()
    yield opened
    await opened.close()


async def claimed(store: IdempotencyStore, key: str, **options: object) -> Claimed:
    claim = await store.claim(key, "h", now=T0, **options)  # type: ignore[arg-type]
    assert isinstance(claim, Claimed)
    return claim


async def test_a_holder_past_its_lock_leaves_the_key_in_doubt_until_it_answers(store: IdempotencyStore) -> None:
    claim = await claimed(store, "k")
    busy = await store.claim("k", "h", now=T0 + LOCK / 2)
    assert isinstance(busy, Held) and busy.status is KeyStatus.IN_FLIGHT
    doubt = await store.claim("k", "h", now=T0 + LOCK)
    assert isinstance(doubt, Held) and doubt.status is KeyStatus.IN_DOUBT
    assert (await store.lookup("k", now=T0 + LOCK)).status is KeyStatus.IN_DOUBT  # type: ignore[union-attr]
    assert await store.complete(claim, ANSWER, now=T0 + 2 * LOCK)  # the late answer settles the doubt
    done = await store.claim("k", "h", now=T0 + 2 * LOCK)
    assert isinstance(done, Held) and (done.status, done.response) == (KeyStatus.DONE, ANSWER)


async def test_a_holder_that_commits_with_its_key_is_taken_over_and_cannot_commit_late(
    store: IdempotencyStore,
) -> None:
    first = await claimed(store, "k", commits_with_key=True)
    second = await store.claim("k", "h", now=T0 + LOCK)
    assert isinstance(second, Claimed) and second.lock_id != first.lock_id
    async with store.engine.begin() as conn:
        with pytest.raises(KeyTakenOverError):
            await store.record_done(conn, first, ANSWER, now=T0 + LOCK)
    assert not await store.release(first)
    assert await store.complete(second, ANSWER, now=T0 + LOCK)


async def test_the_fence_moves_even_while_the_key_is_held(store: IdempotencyStore) -> None:
    await claimed(store, "k", fence=FencingToken("r", 1))
    held = await store.claim("k", "h", fence=FencingToken("r", 3), now=T0)
    assert isinstance(held, Held) and held.status is KeyStatus.IN_FLIGHT
    async with store.engine.connect() as conn:
        assert await read_fence(conn, "r") == 3
    with pytest.raises(StaleFencingTokenError):
        await store.claim("k", "h", fence=FencingToken("r", 2), now=T0)


async def test_only_the_service_owner_settles_a_doubt(store: IdempotencyStore) -> None:
    claim = await claimed(store, "k")
    assert await store.hold_in_doubt(claim, now=T0)
    assert not await store.resolve("other", applied=False)
    with pytest.raises(ValueError, match="answer"):
        await store.resolve("k", applied=True)
    assert await store.resolve("k", applied=True, response=ANSWER)
    replayed = await store.claim("k", "h", now=T0)
    assert isinstance(replayed, Held) and replayed.response == ANSWER

    again = await claimed(store, "k2")
    assert await store.hold_in_doubt(again, now=T0)
    assert await store.resolve("k2", applied=False)  # it did not happen: the next request runs
    assert isinstance(await store.claim("k2", "h", now=T0), Claimed)


async def test_a_key_table_of_0_3_is_rebuilt_with_its_rows(ledger_url: str) -> None:
    store = IdempotencyStore.from_url(ledger_url)
    try:
        async with store.engine.begin() as conn:
            await conn.execute(
                text(
                    "CREATE TABLE idempotency_keys (key VARCHAR(255) PRIMARY KEY, request_hash VARCHAR(64) NOT NULL, "
                    "status VARCHAR(16) NOT NULL CONSTRAINT ck_idempotency_keys_status CHECK (status IN "
                    "('in_flight', 'done')), lock_id VARCHAR(32) NOT NULL, response_status INTEGER, "
                    "response_headers JSON, response_body BYTEA, created_at_ms BIGINT NOT NULL, "
                    "expires_at_ms BIGINT NOT NULL)".replace("BYTEA", "BYTEA" if "postgres" in ledger_url else "BLOB")
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO idempotency_keys VALUES ('old', 'h', 'done', 'l', 201, '[]', :body, 1, 9999999999999)"
                ),
                {"body": b"{}"},
            )
        await store.create_tables()
        await store.create_tables()  # safe to run again
        kept = await store.lookup("old")
        assert kept is not None and (kept.status, kept.response) == (KeyStatus.DONE, StoredResponse(201, [], b"{}"))
        claim = await store.claim("new", "h")
        assert isinstance(claim, Claimed) and await store.hold_in_doubt(claim)  # the new status is allowed
    finally:
        await store.close()
