"""Ask the support agent for a refund and print its answer: ``python starter.py "Refund order A-1001"``."""

import asyncio
import os
import sys
import uuid

from temporalio.client import Client

TEMPORAL_ADDRESS = os.environ.get("AGENTLEASE_TEMPORAL_ADDRESS", "localhost:7233")
TASK_QUEUE = os.environ.get("AGENTLEASE_TASK_QUEUE", "support-agent")


async def main(prompt: str) -> None:
    client = await Client.connect(TEMPORAL_ADDRESS)
    answer = await client.execute_workflow(
        "SupportAgentWorkflow", prompt, id=f"support-{uuid.uuid4().hex[:8]}", task_queue=TASK_QUEUE, result_type=str
    )
    print(answer)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "Refund order A-1001"))
