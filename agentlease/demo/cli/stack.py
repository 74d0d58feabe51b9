"""The embedded default stack of ``agentlease demo`` and ``agentlease dev``: a Temporal dev server, a SQLite
ledger at the newest schema, the example downstream systems and an in-process worker."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from agentlease.demo.downstream import TARGET_TABLES, bind_loopback, running_downstream
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.runtime.devserver import dev_server
from agentlease.settings import AgentLeaseSettings
from agentlease.worker import running_worker


@dataclass(frozen=True)
class LocalStack:
    """A running embedded stack: the dev server ``env`` (its ``client`` connected), the ``settings`` its worker
    uses (for further workers and the CLI), the Temporal UI and the dev server's log."""

    env: WorkflowEnvironment
    settings: AgentLeaseSettings
    ui_url: str
    server_log: Path


SERVER_LOG = "temporal-server.log"
"""The dev server's output, in the data dir."""


@contextmanager
def _stdout_to(path: Path) -> Iterator[None]:
    """Point file descriptor 1 at ``path`` meanwhile: a child started meanwhile (the dev server) keeps writing there."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@asynccontextmanager
async def local_stack(
    base: AgentLeaseSettings, *, port: int | None = None, ui_port: int | None = None, worker: bool = True
) -> AsyncIterator[LocalStack]:
    """Start the dev server, the example downstream systems and (unless ``worker`` is false) one worker; the
    ledger is ``base.ledger_url``, or in ``base.data_dir`` when that is the default relative path."""
    data_dir = base.data_dir.resolve()
    if ui_port is None:
        with bind_loopback() as probe:
            ui_port = probe.getsockname()[1]
    data_dir.mkdir(parents=True, exist_ok=True)
    server_log = data_dir / SERVER_LOG
    async with AsyncExitStack() as stack:
        with _stdout_to(server_log):
            env = await stack.enter_async_context(dev_server(data_dir, port=port, ui_port=ui_port))
        key = None if base.fencing_key is None else base.fencing_key.get_secret_value().encode("utf-8")
        downstream = await stack.enter_async_context(running_downstream(data_dir, fencing_key=key))
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
                "sql_allowed_tables": list(TARGET_TABLES),
                "publish_base_url": downstream.publish_base_url,
                "smtp_host": downstream.smtp_host,
                "smtp_port": downstream.smtp_port,
                "migrate_on_start": True,
            }
        )
        if worker:
            await stack.enter_async_context(running_worker(settings))
        else:  # the workers started elsewhere find the ledger at the newest schema
            ledger = Ledger.from_url(settings.ledger_url)
            try:
                await upgrade(ledger.database)
            finally:
                await ledger.close()
        yield LocalStack(env=env, settings=settings, ui_url=f"http://127.0.0.1:{ui_port}", server_log=server_log)
