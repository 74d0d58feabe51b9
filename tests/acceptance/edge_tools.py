"""The tools of the edge matrix (:mod:`tests.acceptance.edge_matrix`), one per edge, as a user writes them.

Worker processes load them with ``AGENTLEASE_TOOL_MODULES=tests.acceptance.edge_tools``. Environment:
``EDGE_CONTROL_DIR`` (crash points, :mod:`tests.acceptance.edge_holds`), ``EDGE_HTTP_URL`` (the charge
service, :mod:`tests.acceptance.edge_service`, through the driver's proxy), ``EDGE_SQL_URL`` (the database
``edge_sql_charge`` writes to; ``{target}`` in it names a database per call, as SQLite's one writer at a
time would otherwise let one held transaction stop every call), ``EDGE_CRM_URL`` (the CRM over streamable
HTTP, through the proxy) and ``EDGE_CRM_DATABASE_URL`` (the CRM's database, for the stdio server each attempt
starts).

- ``edge_http_charge``: POSTs a charge with ``lease.downstream_headers()`` and the documented
  ``response.raise_for_status()``, reads it back by target, settles with the charge's id. Crash points in
  the worker: ``before`` (the request not sent), ``after`` (the answer in hand, not yet settled).
- ``edge_sql_charge``: one fenced transaction (``fenced_write``) inserts the charge keyed by the
  idempotency key (a repeat inserts nothing), then reads it back. Crash points: ``before``, ``inside``
  (the transaction open, before its commit), ``committed``, ``after`` (read back, not yet settled).
- ``crmhttp_create_contact`` / ``crmstdio_create_contact``: the example CRM's guarded tool over streamable
  HTTP and over stdio (its crash points are in the server, :mod:`tests.integration.mcp_crm`).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import httpx
from pydantic import BaseModel
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, UniqueConstraint, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentlease import ToolResult, lease, leased
from agentlease.enums import Stage
from agentlease.errors import PermanentToolError, StaleFencingTokenError
from agentlease.fencing import create_fence_table, fenced_write, upsert_for
from agentlease.ledger.engine import create_async_database_engine
from agentlease.mcp import MCPServer, ToolPolicy, mcp_tools
from tests.acceptance import edge_holds
from tests.acceptance.matrix_tools import _despite_cancellation as despite_cancellation

LEASE_TTL = timedelta(seconds=6)
"""Lease TTL (= heartbeat timeout) of every edge tool."""
HTTP_TIMEOUT_S = 3.0
"""How long ``edge_http_charge`` waits for an answer (a withheld one fails the attempt after it)."""

sql_metadata = MetaData()
sql_charges = Table(
    "edge_charges",
    sql_metadata,
    Column("charge_id", Integer, primary_key=True, autoincrement=True),
    Column("target", String(200), nullable=False, index=True),
    Column("idempotency_key", String(255), nullable=False),
    Column("generation", BigInteger, nullable=False),
    UniqueConstraint("idempotency_key", name="uq_edge_charges_idempotency_key"),
)
"""The charges ``edge_sql_charge`` makes: one row per effect, at most one per idempotency key."""


async def _renew() -> None:
    await lease.renew("held at a crash point of the edge matrix")


def _as_paused_process(attempt: Callable[[], Awaitable[ToolResult]]) -> Awaitable[ToolResult]:
    """Generation 1 runs to its end despite Temporal's cancellation: a paused process notices nothing, and
    sends its late request once resumed (what the downstream must refuse)."""
    return despite_cancellation(attempt()) if lease.fencing_token() == 1 else attempt()


@leased(side_effect="fenced", lease_ttl=LEASE_TTL, name="edge_http_charge")
async def edge_http_charge(target: str) -> ToolResult:
    """Charge ``target`` at the charge service, once."""
    return await _as_paused_process(lambda: _http_charge(target))


async def _http_charge(target: str) -> ToolResult:
    await lease.advance(Stage.EXTERNAL_CALL, f"charging {target}")
    await edge_holds.at("before", target, _renew)
    async with httpx.AsyncClient(base_url=os.environ["EDGE_HTTP_URL"], timeout=HTTP_TIMEOUT_S) as http:
        response = await http.post(f"charges/{target}", json={}, headers=lease.downstream_headers())
        response.raise_for_status()
        await edge_holds.at("after", target, _renew)
        await lease.advance(Stage.VERIFY, f"reading the charge of {target} back")
        found = (await http.get(f"charges/{target}")).raise_for_status().json()["charges"]
    mine = [c for c in found if c["idempotency_key"] == lease.idempotency_key()]
    charge_id = str(mine[0]["charge_id"]) if mine else "missing"
    return ToolResult(receipt=lease.receipt("edge-http", charge_id, "charged" if mine else "missing"))


_engines: dict[str, AsyncEngine] = {}
_making: dict[str, asyncio.Lock] = {}


async def _sql(target: str) -> AsyncEngine:
    """The charges' database of ``target``, its tables made once per process."""
    url = os.environ["EDGE_SQL_URL"].replace("{target}", target)
    async with _making.setdefault(url, asyncio.Lock()):
        if url not in _engines:
            engine = create_async_database_engine(url, pool_size=4)
            await create_fence_table(engine)
            async with engine.begin() as conn:
                await conn.run_sync(sql_metadata.create_all)
            _engines[url] = engine
    return _engines[url]


@leased(side_effect="fenced", lease_ttl=LEASE_TTL, name="edge_sql_charge")
async def edge_sql_charge(target: str) -> ToolResult:
    """Charge ``target`` in the SQL database, once, fenced by the claim generation."""
    return await _as_paused_process(lambda: _sql_charge(target))


async def _sql_charge(target: str) -> ToolResult:
    engine = await _sql(target)
    key = lease.idempotency_key()
    await lease.advance(Stage.EXTERNAL_CALL, f"charging {target} in SQL")
    await edge_holds.at("before", target, _renew)
    try:
        async with fenced_write(engine, f"edge-sql/{key}", lease.fencing_token()) as conn:
            insert = upsert_for(conn.dialect.name, sql_charges).values(
                target=target, idempotency_key=key, generation=lease.fencing_token()
            )
            await conn.execute(insert.on_conflict_do_nothing(index_elements=["idempotency_key"]))
            await edge_holds.at("inside", target, _renew)
    except StaleFencingTokenError as exc:
        edge_holds.log("sql_answer", target, token=str(lease.fencing_token()), error="stale_fencing_token")
        raise PermanentToolError(str(exc)) from None
    edge_holds.log("sql_answer", target, token=str(lease.fencing_token()), error=None)
    await edge_holds.at("committed", target, _renew)
    await lease.advance(Stage.VERIFY, f"reading the charge of {target} back")
    async with engine.connect() as conn:
        found = (
            await conn.execute(select(sql_charges.c.charge_id).where(sql_charges.c.idempotency_key == key))
        ).first()
    await edge_holds.at("after", target, _renew)
    charge_id = "missing" if found is None else str(found.charge_id)
    return ToolResult(receipt=lease.receipt("edge-sql", charge_id, "missing" if found is None else "charged"))


class CreateContact(BaseModel):
    name: str
    email: str


def _crm_tools(server: MCPServer) -> Any:
    [create] = mcp_tools(
        server,
        default=ToolPolicy(lease_ttl=LEASE_TTL, start_to_close=timedelta(minutes=2)),
        tools={"create_contact": ToolPolicy(side_effect="fenced", args=CreateContact)},
        prefix=f"{server.name}_",
    )
    return create


_CRM_ENV = {
    "CRM_DATABASE_URL": os.environ.get("EDGE_CRM_DATABASE_URL", ""),
    **{name: value for name, value in os.environ.items() if name.startswith("EDGE_")},
}
crmhttp_create_contact = _crm_tools(MCPServer.http("crmhttp", os.environ.get("EDGE_CRM_URL", "http://127.0.0.1:9/mcp")))
crmstdio_create_contact = _crm_tools(
    MCPServer.stdio("crmstdio", sys.executable, ["-m", "tests.integration.mcp_crm"], env=_CRM_ENV, cwd=os.getcwd())
)
