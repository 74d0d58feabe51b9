"""The support agent: an OpenAI Agents SDK agent run durably by Temporal, its tools activities."""

from agentlease.openai_agents import leased_tool, run_agent
from agents import Agent
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import issue_refund, lookup_order

INSTRUCTIONS = "You handle refund requests: look the order up, then refund what it cost."


@workflow.defn
class SupportAgentWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        agent = Agent(
            name="support",
            instructions=INSTRUCTIONS,
            tools=[
                leased_tool(lookup_order),
                leased_tool(issue_refund),
            ],
        )
        result = await run_agent(agent, prompt)
        return str(result.final_output)
