"""A small CRM served over MCP with the official SDK, guarded by agentlease's ``LeaseGuard``.

``create_contact`` is guarded: a repeated idempotency key replays the stored result, an older fencing
token than the newest seen for the call's resource is refused, a call without a key is refused. Its insert
runs in ``effect_transaction``: the fence is checked again inside that transaction, and the contact and
"this key is done, with this result" commit together, so a worker that dies (or a client that drops) at
any point leaves either no contact and the key free, or the contact and its key done: the retry is
answered from the stored result, never run twice. ``find_contact`` is a read.

    python crm_server.py                      # stdio (an agentlease worker starts it per call)
    python crm_server.py --http 8010          # streamable HTTP on http://127.0.0.1:8010/mcp

``CRM_DATABASE_URL`` names the database (default ``sqlite:///crm.db``): contacts, idempotency keys
and fences live together, so a contact and its key commit in one database.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from agentlease.idempotency import DEFAULT_LOCK_TIMEOUT, IdempotencyStore
from agentlease.mcp import LeaseGuard, current_call, effect_transaction
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert, select

DEFAULT_DATABASE_URL = "sqlite:///crm.db"

metadata = MetaData()
contacts = Table(
    "contacts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("email", String(320), nullable=False),
    Column("idempotency_key", String(255)),
    Column("generation", BigInteger),
)


def build_server(
    database_url: str, *, lock_timeout: timedelta = DEFAULT_LOCK_TIMEOUT, anonymous: bool = True
) -> MCPServer[Any]:
    """The CRM's MCP server on ``database_url``: ``create_contact`` (guarded) and ``find_contact``;
    ``lock_timeout``: how long a call's key blocks others before its holder counts as gone (default 60 s);
    ``anonymous``: accept HTTP callers without credentials, in one shared scope (default true: one local client; a
    shared server names its callers by their credentials, ``docs/mcp.md``)."""
    store = IdempotencyStore.from_url(database_url, lock_timeout=lock_timeout)

    @asynccontextmanager
    async def lifespan(server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        await store.create_tables()  # idempotency_keys and fences
        async with store.engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        yield {}
        await store.close()

    server: MCPServer[Any] = MCPServer(
        "crm",
        lifespan=lifespan,
        extensions=[
            LeaseGuard(store, tools={"create_contact"}, commits_with_key={"create_contact"}, anonymous=anonymous)
        ],
    )

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False))
    async def create_contact(name: str, email: str, ctx: Context) -> dict[str, Any]:
        """Create a contact in the CRM."""
        call = current_call()  # the guard's view of this call: key and fence (None when unguarded)
        await ctx.report_progress(0, 1, f"creating {email}")
        async with effect_transaction(store.engine) as effect:  # fence check, insert and key: one commit
            created = await effect.conn.execute(
                insert(contacts).values(
                    name=name,
                    email=email,
                    idempotency_key=None if call is None else call.idempotency_key,
                    generation=None if call is None or call.fencing is None else call.fencing.generation,
                )
            )
            contact_id = created.inserted_primary_key[0] if created.inserted_primary_key else None
            contact = {"id": contact_id, "name": name, "email": email}
            effect.done(contact)
        await ctx.report_progress(1, 1, f"created contact {contact_id}")
        return contact

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def find_contact(email: str) -> dict[str, Any]:
        """Find the contacts with an email address."""
        async with store.engine.connect() as conn:
            rows = (await conn.execute(select(contacts).where(contacts.c.email == email))).mappings().all()
        return {"contacts": [{"id": row["id"], "name": row["name"], "email": row["email"]} for row in rows]}

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    options = parser.parse_args()
    server = build_server(os.environ.get("CRM_DATABASE_URL", DEFAULT_DATABASE_URL))
    if options.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=options.http)


if __name__ == "__main__":
    main()
