"""The real downstream systems the demo and the tests talk to.

- a static file server (Starlette ``StaticFiles`` served by uvicorn) over ``examples/files``,
  the target of the read-only ``http_get`` tool;
- a SQL database with an ``inventory`` table of the ``sql_upsert`` shape, the target of the
  idempotent write.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from sqlalchemy import MetaData
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from activities.builtin.sql_upsert import records_table
from agentlease.ledger.engine import create_ledger_engine

FILES_DIR = Path(__file__).parent / "files"
"""The real files ``http_get`` fetches in the bundled plans."""

TARGET_TABLES = ("inventory",)
"""Tables the bundled plans write with ``sql_upsert``."""


@dataclass(frozen=True)
class Downstream:
    """Where the running downstream systems are.

    Attributes:
        http_base_url: base URL of the file server (files under ``/files/``).
        sql_target_url: database URL of the SQL target.
    """

    http_base_url: str
    sql_target_url: str


def bind_loopback() -> socket.socket:
    """A listening TCP socket on 127.0.0.1 with an OS-chosen port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@asynccontextmanager
async def serve_app(app: Starlette) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on a loopback port until the block exits; yields its base URL."""
    sock = bind_loopback()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def prepare_sql_target(url: str, tables: tuple[str, ...] = TARGET_TABLES) -> None:
    """Create the target tables (``records_table`` shape) if they do not exist."""
    engine = create_ledger_engine(url)
    metadata = MetaData()
    for name in tables:
        records_table(name, metadata)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
    finally:
        await engine.dispose()


@asynccontextmanager
async def running_downstream(data_dir: Path) -> AsyncIterator[Downstream]:
    """Start the file server and prepare the SQL target under ``data_dir``."""
    sql_target_url = f"sqlite:///{(data_dir / 'target.db').resolve()}"
    await prepare_sql_target(sql_target_url)
    app = Starlette(routes=[Mount("/files", app=StaticFiles(directory=FILES_DIR), name="files")])
    async with serve_app(app) as base_url:
        yield Downstream(http_base_url=base_url, sql_target_url=sql_target_url)
