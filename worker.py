"""This deployment's worker: connect, then serve its agent workflows and tools with agentlease.

``python worker.py`` reads the ``AGENTLEASE_*`` settings (``docs/settings.md``). It serves the plan
runner and the built-in tools (what ``agentlease run`` sends) beside this repository's own
``workflows/`` and ``activities/``. On SIGTERM or SIGINT it stops polling and lets running tools
finish within ``AGENTLEASE_SHUTDOWN_GRACE``.
"""

import asyncio

from temporalio.client import Client
from temporalio.worker import Worker

from activities.stock import low_stock
from agentlease import AgentLeasePlugin, AgentLeaseSettings
from agentlease.worker import stop_event
from workflows.restock import RestockWorkflow


async def main() -> None:
    settings = AgentLeaseSettings()
    client = await Client.connect(settings.temporal_address, namespace=settings.namespace)
    plugin = AgentLeasePlugin(settings=settings, tools=[low_stock], builtins=True, agent_run_workflow=True)
    stop = stop_event()
    async with Worker(client, task_queue=settings.task_queue, workflows=[RestockWorkflow], plugins=[plugin]):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
