"""Connect to Temporal and serve the support agent: ``python worker.py``."""

import asyncio
import os

from agentlease import AgentLeasePlugin
from temporalio.client import Client
from temporalio.google_adk import GoogleAdkPlugin
from temporalio.worker import Worker

from activities import issue_refund, lookup_order
from workflows import SupportAgentWorkflow

TEMPORAL_ADDRESS = os.environ.get("AGENTLEASE_TEMPORAL_ADDRESS", "localhost:7233")
TASK_QUEUE = os.environ.get("AGENTLEASE_TASK_QUEUE", "support-agent")


async def main() -> None:
    client = await Client.connect(TEMPORAL_ADDRESS, plugins=[GoogleAdkPlugin()])
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[SupportAgentWorkflow],
        plugins=[AgentLeasePlugin(tools=[lookup_order, issue_refund])],
    )
    print(f"worker polling {TASK_QUEUE}", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
