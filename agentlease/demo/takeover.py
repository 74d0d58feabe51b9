"""``takeover_write``: the fenced call ``agentlease demo`` pauses mid-flight (``docs/operator-views.md``). It writes
``runbooks/<record key>`` and its fence in one transaction, logging each landed write in ``runbook_writes``.
Generation 1 holds until superseded, then plays a paused worker: it writes anyway (the fence refuses) and
returns a result (kept as ``late_unapplied``). A real tool stops at the first refused renewal."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import LeaseLostError, PermanentToolError, RetryableToolError, StaleFencingTokenError
from agentlease.fencing import advance_fence, create_fence_table
from agentlease.ledger.engine import create_async_database_engine
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools.builtin.sql_upsert import records_table

TAKEOVER_TTL = timedelta(seconds=3)
"""The lease TTL of this one tool: short, so that a paused holder loses its lease in seconds."""

RENEW_EVERY_S = TAKEOVER_TTL.total_seconds() / 4
"""How often the holding attempt renews (a quarter of the TTL)."""

TABLE = records_table("runbooks", MetaData())

WRITES = Table(
    "runbook_writes",
    TABLE.metadata,
    Column("write_id", Integer, primary_key=True, autoincrement=True),
    Column("record_key", String(256), nullable=False, index=True),
    Column("written_by", String(256), nullable=False),
    Column("written_at_ms", BigInteger, nullable=False),
)
"""One row per write of ``runbooks`` that landed, oldest first: the effects at this downstream."""


async def create_tables(engine: AsyncEngine) -> None:
    """Create ``runbooks`` and ``runbook_writes`` if they do not exist (safe to run again)."""
    async with engine.begin() as conn:
        await conn.run_sync(TABLE.metadata.create_all)


async def write_row(
    conn: AsyncConnection, record_key: str, row: dict[str, Any], *, key: str, generation: int, written_by: str
) -> None:
    """Upsert the row ``record_key`` and log the write in ``runbook_writes`` (in ``conn``'s transaction)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    values = {
        "record_key": record_key,
        "payload": row,
        "idempotency_key": key,
        "claim_generation": generation,
        "written_at_ms": now_ms,
    }
    statement = dialect.insert(TABLE).values(**values)
    statement = statement.on_conflict_do_update(
        index_elements=["record_key"], set_={name: statement.excluded[name] for name in values if name != "record_key"}
    )
    await conn.execute(statement)
    await conn.execute(WRITES.insert().values(record_key=record_key, written_by=written_by, written_at_ms=now_ms))


async def landed_writes(url: str, record_key: str) -> list[str]:
    """Who wrote ``runbooks/<record_key>``, one entry per write that landed, oldest first."""
    engine = create_async_database_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            query = select(WRITES.c.written_by).where(WRITES.c.record_key == record_key).order_by(WRITES.c.write_id)
            return list((await conn.execute(query)).scalars())
    finally:
        await engine.dispose()


class TakeoverArgs(BaseModel):
    """Arguments of ``takeover_write``: the row to write and how long generation 1 holds before its write if
    nobody takes over (seconds, default 60)."""

    record_key: str = Field(min_length=1, max_length=200)
    row: dict[str, Any]
    hold_s: float = Field(default=60.0, gt=0, le=600)


async def _hold(ctx: LeaseContext, hold_s: float) -> bool:
    """Renew in external_call until a renewal is refused (True) or ``hold_s`` passed (False)."""
    deadline = time.monotonic() + hold_s
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(RENEW_EVERY_S)
            await ctx.renew(f"holding before the write as generation {ctx.fencing_token}")
    except LeaseLostError:
        return True
    except asyncio.CancelledError:
        # Temporal told the resumed worker its attempt is gone; this worker does not listen and renews.
        with contextlib.suppress(LeaseLostError):
            await ctx.renew(f"holding before the write as generation {ctx.fencing_token}")
        return True
    return False


async def _write(engine: AsyncEngine, ctx: LeaseContext, args: TakeoverArgs) -> str:
    """The fenced write: fence, row and its log entry in one transaction. Returns what the target answered."""
    try:
        async with engine.begin() as conn:
            await advance_fence(conn, f"runbooks/{args.record_key}", ctx.fencing_token)
            await write_row(
                conn,
                args.record_key,
                args.row,
                key=ctx.idempotency_key,
                generation=ctx.fencing_token,
                written_by=f"generation {ctx.fencing_token} ({ctx.worker_identity})",
            )
    except StaleFencingTokenError as exc:
        return (
            f"write of runbooks/{args.record_key} as generation {exc.generation} refused by the fence "
            f"(it accepted generation {exc.current_generation})"
        )
    return f"wrote runbooks/{args.record_key} as generation {ctx.fencing_token}"


@tool(side_effect=SideEffectClass.FENCED, lease_ttl=TAKEOVER_TTL, start_to_close=timedelta(minutes=2))
async def takeover_write(ctx: LeaseContext, args: TakeoverArgs) -> ToolResult:
    """Write a fenced row; generation 1 holds before its write until it is superseded, then writes late."""
    if not ctx.settings.sql_target_url:
        raise PermanentToolError("takeover_write needs AGENTLEASE_SQL_TARGET_URL")
    engine = ctx.resources.sql_engine(ctx.settings.sql_target_url)
    await create_tables(engine)
    await create_fence_table(engine)
    await ctx.advance(Stage.PREFLIGHT, f"preparing runbooks/{args.record_key}")
    await ctx.advance(Stage.EXTERNAL_CALL, f"writing runbooks/{args.record_key} as generation {ctx.fencing_token}")
    if ctx.fencing_token == 1 and await _hold(ctx, args.hold_s):
        # Superseded: write and return all the same, deaf to Temporal's cancellation of this attempt.
        async def write_late() -> ToolResult:
            return await _finish(engine, ctx, args, await _write(engine, ctx, args))

        late = asyncio.ensure_future(write_late())
        while True:
            try:
                return await asyncio.shield(late)
            except asyncio.CancelledError:
                continue
    written = await _write(engine, ctx, args)
    await ctx.advance(Stage.COMMIT, written)
    await ctx.advance(Stage.VERIFY, f"reading back runbooks/{args.record_key}")
    return await _finish(engine, ctx, args, written)


async def _finish(engine: AsyncEngine, ctx: LeaseContext, args: TakeoverArgs, written: str) -> ToolResult:
    """Read the row back: the receipt (what the target holds) and the result (what this attempt's write got)."""
    async with engine.connect() as conn:
        row = (await conn.execute(select(TABLE).where(TABLE.c.record_key == args.record_key))).first()
    if row is None:
        raise RetryableToolError(f"readback shows no row runbooks/{args.record_key}")
    receipt = ctx.receipt(
        "sql:runbooks",
        args.record_key,
        "present",
        claim_generation=row.claim_generation,
        idempotency_key=row.idempotency_key,
    )
    return ToolResult(receipt=receipt, output={"record_key": args.record_key, "write": written})
