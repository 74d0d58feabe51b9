"""The agentlease worker: connects to Temporal and the ledger, registers the workflow and the tools.

Run it with ``agentlease worker`` or ``python worker.py``; it reads ``AGENTLEASE_*`` settings. On
SIGTERM or SIGINT it stops polling, lets running tools finish within ``AGENTLEASE_SHUTDOWN_GRACE``,
and releases what remains with error class ``shutdown``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio.client import Client
from temporalio.worker import Worker

from activities.decisions import DecisionActivities
from agentlease import search_attributes
from activities.leased import LeasedActivities
from activities.tool import ToolRegistry, load_registry
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.metrics import serving_metrics
from agentlease.shutdown import stop_event
from agentlease.settings import AgentLeaseSettings
from agentlease.temporal import connect
from workflows.agent_run import AgentRunWorkflow


logger = logging.getLogger("agentlease.worker")


def default_identity() -> str:
    """``<hostname>:<pid>``: the lease owner and Temporal identity of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def build_worker(
    client: Client,
    ledger: Ledger,
    registry: ToolRegistry,
    settings: AgentLeaseSettings,
    *,
    identity: str | None = None,
) -> Worker:
    """A Temporal worker serving ``AgentRunWorkflow`` and every tool of ``registry``."""
    identity = identity or settings.worker_identity or default_identity()
    leased = LeasedActivities(ledger, registry, identity, settings)
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[AgentRunWorkflow],
        activities=[*leased.activities(), *DecisionActivities(ledger).activities()],
        identity=identity,
        max_concurrent_activities=settings.max_concurrent_activities,
        graceful_shutdown_timeout=settings.shutdown_grace,
    )


@asynccontextmanager
async def running_worker(
    settings: AgentLeaseSettings, *, registry: ToolRegistry | None = None, identity: str | None = None
) -> AsyncIterator[Worker]:
    """Connect, migrate the ledger, and run a worker until the block exits (then shut it down).

    With ``settings.metrics_address`` the process's lease metrics are served there meanwhile.

    Raises:
        TemporalUnavailableError: Temporal is unreachable.
        LedgerUnavailableError: the ledger cannot be reached or migrated.
        ConfigurationError: a tool module cannot be loaded, or the metrics address cannot be bound.
    """
    registry = registry or load_registry(settings.tool_modules)
    identity = identity or settings.worker_identity or default_identity()
    with serving_metrics(settings.metrics_address):
        ledger = Ledger.from_url(settings.ledger_url)
        try:
            await upgrade(ledger.database)
            client = await connect(settings, identity=identity)
            problem = await search_attributes.ensure_registered(client, settings.namespace)
            if problem is not None:
                logger.warning(problem)
            worker = build_worker(client, ledger, registry, settings, identity=identity)
            async with worker:
                yield worker
        finally:
            await ledger.close()


async def serve(settings: AgentLeaseSettings, *, ready: asyncio.Event | None = None) -> None:
    """Run a worker until SIGTERM, SIGINT or SIGHUP (see :func:`running_worker`)."""
    stop = stop_event()
    async with running_worker(settings):
        if ready is not None:
            ready.set()
        await stop.wait()


if __name__ == "__main__":
    from agentlease.cli.app import main

    main(["worker"])
