"""The agentlease worker (``agentlease worker`` or ``python worker.py``): on SIGTERM, SIGINT or SIGHUP it stops
polling, lets running tools finish within ``AGENTLEASE_SHUTDOWN_GRACE`` and releases the rest (``shutdown``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from pydantic import ValidationError
from temporalio.client import Client
from temporalio.worker import Worker

from agentlease.errors import AgentLeaseError, ConfigurationError
from agentlease.ledger.migrate import require_current, upgrade
from agentlease.ledger.store import Ledger
from agentlease.observability.metrics import LeaseMetrics, serving_metrics
from agentlease.plugin import AgentLeasePlugin
from agentlease.runtime.shutdown import exit_process, stop_event
from agentlease.runtime.temporal import connect, prometheus_runtime
from agentlease.settings import AgentLeaseSettings, default_identity, settings_error
from agentlease.tools._registry import ToolRegistry, load_registry

logger = logging.getLogger("agentlease.worker")


def load_workflows(module_names: list[str]) -> list[type]:
    """The ``@workflow.defn`` classes defined at the top level of the named modules (``ConfigurationError``: a
    module cannot be imported, or defines no workflow)."""
    found: list[type] = []
    for name in module_names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import workflow module {name!r}: {exc}") from None
        classes = [
            value
            for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == module.__name__ and workflow_definition(value)
        ]
        if not classes:
            raise ConfigurationError(f"workflow module {name!r} defines no @workflow.defn class")
        found.extend(classes)
    return found


def workflow_definition(cls: type) -> bool:
    """Whether ``cls`` is a workflow (decorated with ``@workflow.defn``)."""
    return hasattr(cls, "__temporal_workflow_definition")


def build_worker(
    client: Client,
    ledger: Ledger,
    registry: ToolRegistry,
    settings: AgentLeaseSettings,
    *,
    identity: str | None = None,
    workflows: list[type] | None = None,
) -> Worker:
    """A Temporal worker serving ``AgentRunWorkflow``, ``workflows`` (default those of
    ``settings.workflow_modules``) and every tool of ``registry``, through
    :class:`~agentlease.plugin.AgentLeasePlugin` with its opt-ins on; the caller owns and closes ``ledger``."""
    identity = identity or settings.worker_identity or default_identity()
    plugin = AgentLeasePlugin(
        settings=settings, ledger=ledger, tools=registry, identity=identity, builtins=True, agent_run_workflow=True
    )
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=load_workflows(settings.workflow_modules) if workflows is None else workflows,
        plugins=[plugin],
        identity=identity,
        max_concurrent_activities=settings.max_concurrent_activities,
        graceful_shutdown_timeout=settings.shutdown_grace,
    )


@asynccontextmanager
async def running_worker(
    settings: AgentLeaseSettings, *, registry: ToolRegistry | None = None, identity: str | None = None
) -> AsyncIterator[Worker]:
    """Connect, check (or, with ``migrate_on_start``, migrate) the ledger, and run a worker until the
    block exits, serving the metrics at ``settings.metrics_address`` meanwhile (``docs/metrics.md``).

    Raises:
        TemporalUnavailableError: Temporal is unreachable.
        LedgerUnavailableError: the ledger cannot be reached, or its schema is not this version's.
        ConfigurationError: a tool module cannot be loaded, the metrics address cannot be bound, or
            the search attributes are missing and this worker may not register them.
    """
    registry = registry or load_registry(settings.tool_modules)
    identity = identity or settings.worker_identity or default_identity()
    runtime, forward = None, None
    if settings.metrics_address is not None and settings.temporal_metrics:
        runtime, forward = prometheus_runtime()
    with serving_metrics(settings.metrics_address, forward=forward):
        scoped = LeaseMetrics(namespace=settings.namespace, task_queue=settings.task_queue)
        ledger = Ledger.from_url(settings.ledger_url, pool_size=settings.ledger_pool_size, metrics=scoped)
        try:
            await (upgrade if settings.migrate_on_start else require_current)(ledger.database)
            client = await connect(settings, identity=identity, runtime=runtime)
            async with build_worker(client, ledger, registry, settings, identity=identity) as worker:
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


def main(configure: Callable[[AgentLeaseSettings], AgentLeaseSettings] | None = None) -> int:
    """``python worker.py``: serve with the ``AGENTLEASE_*`` settings, changed by ``configure`` if given (an
    example adds its workflow, tools and plugin); one line on stderr if it cannot."""
    try:
        settings = AgentLeaseSettings()
        asyncio.run(serve(configure(settings) if configure is not None else settings))
    except ValidationError as exc:
        print(f"error: {settings_error(exc)}", file=sys.stderr)
        return 2
    except AgentLeaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigurationError) else 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    exit_process(main())


__all__ = ["build_worker", "load_workflows", "main", "running_worker", "serve", "stop_event"]
