"""``takeover_write``: the fenced call ``agentlease demo`` pauses mid-flight to show what a lease does.

It writes one row of the example SQL target (``runbooks``, the shape of
:func:`~agentlease.tools.builtin.sql_upsert.records_table`) fenced by claim generation: the row and the
fence (:func:`agentlease.fencing.advance_fence`, resource ``runbooks/<record key>``) change in one
transaction, so a writer older than the newest accepted generation writes nothing. Its lease is
short (:data:`TAKEOVER_TTL`) so a takeover comes quickly.

Its generation-1 attempt stops just before its write and holds the lease there, renewing, until a
renewal is refused (the demo pauses its worker with SIGSTOP meanwhile, and another worker takes
over with generation 2). Then it plays a worker that does not know it was paused: it sends its
write anyway (the fence refuses generation 1) and returns a result (the ledger refuses the settle
and keeps it as ``late_unapplied``, with the refused write in its result). A real tool stops at
the first refused renewal (``docs/writing-tools.md``); this one goes on only to show that the
guards hold without its help.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import MetaData, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import LeaseLostError, PermanentToolError, RetryableToolError, StaleFencingTokenError
from agentlease.fencing import advance_fence, create_fence_table
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.tools.builtin.sql_upsert import records_table

TAKEOVER_TTL = timedelta(seconds=3)
"""The lease TTL of this one tool: short, so that a paused holder loses its lease in seconds."""

RENEW_EVERY_S = TAKEOVER_TTL.total_seconds() / 4
"""How often the holding attempt renews (a quarter of the TTL)."""

TABLE = records_table("runbooks", MetaData())


class TakeoverArgs(BaseModel):
    """Arguments of ``takeover_write``.

    Attributes:
        record_key: the row to write (1 to 200 characters).
        row: its JSON payload.
        hold_s: how long generation 1 holds before its write if nobody takes over, in seconds. Default 60.
    """

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
    """The fenced write: fence and row in one transaction. Returns what the target answered."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    values = {
        "record_key": args.record_key,
        "payload": args.row,
        "idempotency_key": ctx.idempotency_key,
        "claim_generation": ctx.fencing_token,
        "written_at_ms": int(datetime.now(UTC).timestamp() * 1000),
    }
    statement = dialect.insert(TABLE).values(**values)
    statement = statement.on_conflict_do_update(
        index_elements=["record_key"], set_={name: statement.excluded[name] for name in values if name != "record_key"}
    )
    try:
        async with engine.begin() as conn:
            await advance_fence(conn, f"runbooks/{args.record_key}", ctx.fencing_token)
            await conn.execute(statement)
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
    async with engine.begin() as conn:
        await conn.run_sync(TABLE.metadata.create_all)
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
