"""Connect to Temporal and serve the support agent: ``python worker.py``."""

import asyncio
import os

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client
from temporalio.worker import Worker

from workflows import SupportAgentWorkflow

TEMPORAL_ADDRESS = os.environ.get("AGENTLEASE_TEMPORAL_ADDRESS", "localhost:7233")
TASK_QUEUE = os.environ.get("AGENTLEASE_TASK_QUEUE", "support-agent")


async def main() -> None:
    client = await Client.connect(TEMPORAL_ADDRESS, plugins=[PydanticAIPlugin()])
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[SupportAgentWorkflow],
    )
    print(f"worker polling {TASK_QUEUE}", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
