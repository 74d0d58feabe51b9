"""The support agent: a Strands agent run durably by Temporal (``StrandsPlugin``)."""

from datetime import timedelta

from agentlease.strands import leased_tool, run_agent
from temporalio import workflow
from temporalio.strands_agents import TemporalAgent

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
                leased_tool(lookup_order),
                leased_tool(issue_refund),
            ],
            callback_handler=None,
        )
        result = await run_agent(agent, prompt)
        return str(result)
