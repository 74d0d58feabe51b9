"""``sql_upsert``: an idempotent write into a real SQL table, keyed by a deterministic record key.

A write replaces the whole row (:func:`records_table`), naming its writer; a retry past ``commit`` reads back
first and settles from this key's row without writing again (G6; ``docs/plans.md``, "Built-in tools").
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field, field_validator
from sqlalchemy import JSON, BigInteger, Column, MetaData, String, Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentlease.enums import SideEffectClass, Stage
from agentlease.errors import PermanentToolError, RetryableToolError
from agentlease.records import SettlementReceipt
from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool

_REWRITTEN = ("payload", "idempotency_key", "claim_generation", "written_at_ms")
"""Every column but the record key: an upsert leaves nothing of the previous writer behind."""

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def records_table(name: str, metadata: MetaData | None = None) -> Table:
    """The shape of a table ``sql_upsert`` writes, one row per record key: ``record_key`` (primary key),
    ``payload`` (JSON), ``idempotency_key``, ``claim_generation`` (of the writer), ``written_at_ms``."""
    return Table(
        name,
        metadata or MetaData(),
        Column("record_key", String(256), primary_key=True),
        Column("payload", JSON, nullable=False),
        Column("idempotency_key", String(256), nullable=False),
        Column("claim_generation", BigInteger, nullable=False),
        Column("written_at_ms", BigInteger, nullable=False),
    )


class SqlUpsertArgs(BaseModel):
    """Arguments of ``sql_upsert``.

    Attributes:
        table: target table (lower-case identifier) in ``AGENTLEASE_SQL_TARGET_URL``; one of
            ``AGENTLEASE_SQL_ALLOWED_TABLES``.
        row: the JSON payload to store.
        record_key: the deterministic target; default the task's idempotency key.
    """

    table: str
    row: dict[str, Any]
    record_key: str | None = Field(default=None, min_length=1, max_length=256)

    @field_validator("table")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError("table must be a lower-case SQL identifier")
        return value


def payload_digest(payload: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a payload."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def _read(conn: AsyncConnection, table: Table, key: str) -> Any:
    return (await conn.execute(select(table).where(table.c.record_key == key))).first()


def _is_ours(row: Any, ctx: LeaseContext, args: SqlUpsertArgs) -> bool:
    """Whether ``row`` is this key's write of ``args.row``."""
    return row.idempotency_key == ctx.idempotency_key and payload_digest(row.payload) == payload_digest(args.row)


def _receipt(ctx: LeaseContext, table: Table, row: Any) -> SettlementReceipt:
    return ctx.receipt(
        f"sql:{table.name}",
        row.record_key,
        "present",
        payload_sha256=payload_digest(row.payload),
        claim_generation=row.claim_generation,
        idempotency_key=row.idempotency_key,
    )


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=15), start_to_close=timedelta(minutes=2))
async def sql_upsert(ctx: LeaseContext, args: SqlUpsertArgs) -> ToolResult:
    """Upsert ``row`` under its record key, read it back, settle with a receipt.

    Only the tables of ``AGENTLEASE_SQL_ALLOWED_TABLES`` are written; any other table is a permanent
    tool error (the step is dead-lettered with the reason) before a connection is opened."""
    if not ctx.settings.sql_target_url:
        raise PermanentToolError("sql_upsert needs AGENTLEASE_SQL_TARGET_URL")
    if args.table not in ctx.settings.sql_allowed_tables:
        allowed = ", ".join(ctx.settings.sql_allowed_tables) or "none"
        raise PermanentToolError(
            f"refused to write table {args.table!r}: not in AGENTLEASE_SQL_ALLOWED_TABLES (allowed: {allowed})"
        )
    key = args.record_key or ctx.idempotency_key
    table = records_table(args.table)
    engine = ctx.resources.sql_engine(ctx.settings.sql_target_url)
    try:
        await ctx.advance(Stage.PREFLIGHT, f"checking {table.name}/{key}")
        if ctx.recovery.read_back_first:
            async with engine.connect() as conn:
                found = await _read(conn, table, key)
            if found is not None and _is_ours(found, ctx, args):
                await ctx.advance(Stage.VERIFY, f"{ctx.recovery.action}: {table.name}/{key} is already written")
                return ToolResult(receipt=_receipt(ctx, table, found), output={"record_key": key, "written": False})
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        values = {
            "record_key": key,
            "payload": args.row,
            "idempotency_key": ctx.idempotency_key,
            "claim_generation": ctx.fencing_token,
            "written_at_ms": int(datetime.now(UTC).timestamp() * 1000),
        }
        statement = dialect.insert(table).values(**values)
        statement = statement.on_conflict_do_update(
            index_elements=["record_key"], set_={name: statement.excluded[name] for name in _REWRITTEN}
        )
        async with engine.connect() as conn:
            await ctx.advance(Stage.EXTERNAL_CALL, f"upserting {table.name}/{key}")
            await conn.execute(statement)
            await ctx.advance(Stage.COMMIT, f"committing {table.name}/{key}")
            await conn.commit()
        await ctx.advance(Stage.VERIFY, f"reading back {table.name}/{key}")
        async with engine.connect() as conn:
            found = await _read(conn, table, key)
        if found is None or not _is_ours(found, ctx, args):
            raise RetryableToolError(f"readback of {table.name}/{key} does not show this key's row")
        return ToolResult(receipt=_receipt(ctx, table, found), output={"record_key": key, "written": True})
    except SQLAlchemyError as exc:
        if "no such table" in str(exc) or "does not exist" in str(exc):
            raise PermanentToolError(f"target table {table.name!r} does not exist") from None
        raise RetryableToolError(f"{type(exc).__name__} on {table.name}/{key}") from None
