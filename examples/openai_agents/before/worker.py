"""Connect to Temporal and serve the support agent: ``python worker.py``."""

import asyncio
import os
from datetime import timedelta

from temporalio.client import Client
from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
from temporalio.openai_agents.testing import TestModelProvider
from temporalio.worker import Worker

from activities import issue_refund, lookup_order
from model import SupportModel
from workflows import SupportAgentWorkflow

TEMPORAL_ADDRESS = os.environ.get("AGENTLEASE_TEMPORAL_ADDRESS", "localhost:7233")
TASK_QUEUE = os.environ.get("AGENTLEASE_TASK_QUEUE", "support-agent")


async def main() -> None:
    agents_plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=60)),
        model_provider=TestModelProvider(SupportModel()),  # a real model: leave this line out
    )
    client = await Client.connect(TEMPORAL_ADDRESS, plugins=[agents_plugin])
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[SupportAgentWorkflow],
        activities=[lookup_order, issue_refund],
    )
    print(f"worker polling {TASK_QUEUE}", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
