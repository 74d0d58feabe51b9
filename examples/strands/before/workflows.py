"""The support agent: a Strands agent run durably by Temporal (``StrandsPlugin``)."""

from datetime import timedelta

from temporalio import workflow
from temporalio.strands_agents import TemporalAgent
from temporalio.strands_agents.workflow import activity_as_tool

with workflow.unsafe.imports_passed_through():
    from activities import issue_refund, lookup_order
    from model import MODEL

INSTRUCTION = "You handle refund requests: look the order up, then refund what it cost."


@workflow.defn
class SupportAgentWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        agent = TemporalAgent(
            model=MODEL,
            system_prompt=INSTRUCTION,
            start_to_close_timeout=timedelta(seconds=60),
            tools=[
                activity_as_tool(lookup_order, start_to_close_timeout=timedelta(seconds=30)),
                activity_as_tool(issue_refund, start_to_close_timeout=timedelta(seconds=30)),
            ],
            callback_handler=None,
        )
        result = await agent.invoke_async(prompt)
        return str(result)
