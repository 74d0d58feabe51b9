"""The agentlease worker: connects to Temporal and the ledger, registers the workflow and the tools.

Run it with ``agentlease worker`` or ``python worker.py``; it reads ``AGENTLEASE_*`` settings. On
SIGTERM, SIGINT or SIGHUP it stops polling, lets running tools finish within
``AGENTLEASE_SHUTDOWN_GRACE``, and releases what remains with error class ``shutdown``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import ValidationError
from temporalio.client import Client
from temporalio.worker import Worker

from activities.decisions import DecisionActivities
from activities.leased import LeasedActivities
from activities.registry import ToolRegistry, load_registry
from activities.resources import ToolResources
from agentlease import search_attributes
from agentlease.errors import AgentLeaseError, ConfigurationError, one_line
from agentlease.ledger.migrate import require_current, upgrade
from agentlease.ledger.store import Ledger
from agentlease.metrics import serving_metrics
from agentlease.settings import AgentLeaseSettings
from agentlease.shutdown import stop_event
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
    resources: ToolResources,
) -> Worker:
    """A Temporal worker serving ``AgentRunWorkflow`` and every tool of ``registry``.

    Args:
        resources: what the tools share; the caller closes it after the worker stops.
    """
    identity = identity or settings.worker_identity or default_identity()
    leased = LeasedActivities(ledger, registry, identity, settings, resources)
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
    """Connect, check (or, with ``migrate_on_start``, migrate) the ledger, and run a worker until the
    block exits (then shut it down).

    With ``settings.metrics_address`` the process's lease metrics are served there meanwhile.

    Raises:
        TemporalUnavailableError: Temporal is unreachable.
        LedgerUnavailableError: the ledger cannot be reached, or its schema is not this version's.
        ConfigurationError: a tool module cannot be loaded, or the metrics address cannot be bound.
    """
    registry = registry or load_registry(settings.tool_modules)
    identity = identity or settings.worker_identity or default_identity()
    resources = ToolResources()
    with serving_metrics(settings.metrics_address):
        ledger = Ledger.from_url(settings.ledger_url)
        try:
            await (upgrade if settings.migrate_on_start else require_current)(ledger.database)
            client = await connect(settings, identity=identity)
            problem = await search_attributes.ensure_registered(client, settings.namespace)
            if problem is not None:
                logger.warning(problem)
            async with build_worker(
                client, ledger, registry, settings, identity=identity, resources=resources
            ) as worker:
                yield worker
        finally:
            await resources.close()
            await ledger.close()


async def serve(settings: AgentLeaseSettings, *, ready: asyncio.Event | None = None) -> None:
    """Run a worker until SIGTERM, SIGINT or SIGHUP (see :func:`running_worker`)."""
    stop = stop_event()
    async with running_worker(settings):
        if ready is not None:
            ready.set()
        await stop.wait()


def main() -> int:
    """``python worker.py``: serve with the ``AGENTLEASE_*`` settings; one line on stderr if it cannot."""
    try:
        asyncio.run(serve(AgentLeaseSettings()))
    except ValidationError as exc:
        print(f"error: bad setting: {one_line(exc)}", file=sys.stderr)
        return 2
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except AgentLeaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
