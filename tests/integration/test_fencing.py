"""Fenced writes (agentlease/fencing.py) on real SQLite and PostgreSQL databases.

Every accepted writer logs its generation in ``commit_log`` inside its fenced transaction; the
fence row serialises the writers of one resource, so the log's order is the commit order.
Refused writers keep the :class:`StaleFencingTokenError`, whose ``current_generation`` was read
in the refused transaction, i.e. after the newer writer had committed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentlease.clock import to_ms
from agentlease.errors import StaleFencingTokenError
from agentlease.fencing import advance_fence, create_fence_table, fenced_write, fences, read_fence, upsert_for
from agentlease.ledger.engine import create_async_database_engine

WRITERS = 20
ROUNDS = 3

_tables = MetaData()
articles = Table(
    "articles",
    _tables,
    Column("article_id", String(64), primary_key=True),
    Column("body", String(200), nullable=False),
    Column("generation", BigInteger, nullable=False),
)
commit_log = Table(
    "commit_log",
    _tables,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("article_id", String(64), nullable=False),
    Column("generation", BigInteger, nullable=False),
)


@pytest.fixture
async def engine(ledger_url: str) -> AsyncIterator[AsyncEngine]:
    """The downstream's database: its own tables plus the fence table."""
    opened = create_async_database_engine(ledger_url)
    try:
        await create_fence_table(opened)
        await create_fence_table(opened)  # safe to run again
        async with opened.begin() as conn:
            await conn.run_sync(_tables.create_all)
        yield opened
    finally:
        await opened.dispose()


async def _write(conn: AsyncConnection, article_id: str, generation: int) -> None:
    """The caller's fenced statements: upsert the article, log the commit."""
    values = {"article_id": article_id, "body": f"written by generation {generation}", "generation": generation}
    upsert = upsert_for(conn.dialect.name, articles).values(**values)
    replace = {"body": upsert.excluded.body, "generation": upsert.excluded.generation}
    await conn.execute(upsert.on_conflict_do_update(index_elements=[articles.c.article_id], set_=replace))
    await conn.execute(insert(commit_log).values(article_id=article_id, generation=generation))


async def write(engine: AsyncEngine, article_id: str, generation: int) -> StaleFencingTokenError | None:
    """One writer: fence, then write, in one transaction. Returns the refusal, if any."""
    try:
        async with fenced_write(engine, f"articles/{article_id}", generation) as conn:
            await _write(conn, article_id, generation)
    except StaleFencingTokenError as refused:
        return refused
    return None


async def committed(engine: AsyncEngine, article_id: str) -> list[int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(commit_log.c.generation).where(commit_log.c.article_id == article_id).order_by(commit_log.c.seq)
        )
        return list(rows.scalars())


async def article(engine: AsyncEngine, article_id: str) -> tuple[str, int] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(select(articles).where(articles.c.article_id == article_id))).first()
    return None if row is None else (row.body, row.generation)


async def fence(engine: AsyncEngine, resource_key: str) -> int | None:
    async with engine.connect() as conn:
        return await read_fence(conn, resource_key)


async def test_writers_in_random_order_leave_the_highest_generation(engine: AsyncEngine) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    for round_no in range(ROUNDS):
        article_id = f"a{round_no}"
        generations = list(range(1, WRITERS + 1))
        rng.shuffle(generations)
        outcomes = dict(
            zip(generations, await asyncio.gather(*(write(engine, article_id, g) for g in generations)), strict=True)
        )

        order = await committed(engine, article_id)
        rejected = {g: refusal for g, refusal in outcomes.items() if refusal is not None}
        context = f"seed {seed}, round {round_no}, start order {generations}, commit order {order}"
        # Each commit carried a newer generation than every commit before it ...
        assert order == sorted(set(order)), context
        assert order[-1] == WRITERS, context
        # ... and every writer that did not commit was refused, by a newer generation already committed.
        assert set(order).isdisjoint(rejected) and set(order) | set(rejected) == set(generations), context
        for generation, refusal in rejected.items():
            assert refusal.resource_key == f"articles/{article_id}"
            assert refusal.generation == generation
            assert refusal.current_generation is not None and refusal.current_generation > generation, context
            assert refusal.current_generation in order, context
        assert await article(engine, article_id) == (f"written by generation {WRITERS}", WRITERS)
        assert await fence(engine, f"articles/{article_id}") == WRITERS

        # Every older writer that comes after the highest one is refused; the highest itself passes again.
        late = await asyncio.gather(*(write(engine, article_id, g) for g in generations))
        refused = {g for g, refusal in zip(generations, late, strict=True) if refusal is not None}
        assert refused == set(range(1, WRITERS)), context
        assert (await committed(engine, article_id))[len(order) :] == [WRITERS]
        assert await article(engine, article_id) == (f"written by generation {WRITERS}", WRITERS)


async def test_equal_generation_is_accepted_and_newer_moves_the_fence(engine: AsyncEngine) -> None:
    assert await fence(engine, "articles/eq") is None
    assert await write(engine, "eq", 3) is None
    assert await write(engine, "eq", 3) is None
    assert await fence(engine, "articles/eq") == 3
    assert await write(engine, "eq", 4) is None
    assert await committed(engine, "eq") == [3, 3, 4]
    assert await fence(engine, "articles/eq") == 4
    # Fences are per resource: another article starts from nothing.
    assert await write(engine, "other", 1) is None
    assert await fence(engine, "articles/other") == 1


async def test_a_refused_fence_rolls_back_the_callers_write(engine: AsyncEngine) -> None:
    assert await write(engine, "rb", 7) is None
    with pytest.raises(StaleFencingTokenError) as refused:
        async with engine.begin() as conn:
            # The caller writes first and asks the fence last, in the same transaction.
            await conn.execute(update(articles).where(articles.c.article_id == "rb").values(body="stale", generation=6))
            await conn.execute(insert(commit_log).values(article_id="rb", generation=6))
            await advance_fence(conn, "articles/rb", 6)
    assert (refused.value.resource_key, refused.value.generation, refused.value.current_generation) == (
        "articles/rb",
        6,
        7,
    )
    assert await article(engine, "rb") == ("written by generation 7", 7)
    assert await committed(engine, "rb") == [7]
    assert await fence(engine, "articles/rb") == 7


async def test_fenced_write_refuses_before_the_block_and_rolls_back_the_fence_on_error(engine: AsyncEngine) -> None:
    assert await write(engine, "blk", 2) is None
    ran = False
    with pytest.raises(StaleFencingTokenError):
        async with fenced_write(engine, "articles/blk", 1):
            ran = True
    assert not ran

    with pytest.raises(RuntimeError, match="handler failed"):
        async with fenced_write(engine, "articles/blk", 9) as conn:
            await _write(conn, "blk", 9)
            raise RuntimeError("handler failed")
    assert await fence(engine, "articles/blk") == 2
    assert await article(engine, "blk") == ("written by generation 2", 2)


async def test_updated_at_follows_the_injected_clock(engine: AsyncEngine) -> None:
    at = datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    async with engine.begin() as conn:
        await advance_fence(conn, "clocked", 1, now=at)
    async with engine.connect() as conn:
        row = (await conn.execute(select(fences).where(fences.c.resource_key == "clocked"))).one()
        total = (await conn.execute(select(func.count()).select_from(fences))).scalar_one()
    assert (row.generation, row.updated_at_ms, total) == (1, to_ms(at), 1)
