"""The support agent: an OpenAI Agents SDK agent run durably by Temporal, its tools activities."""

from datetime import timedelta

from agents import Agent, Runner
from temporalio import workflow
from temporalio.openai_agents.workflow import activity_as_tool

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
                activity_as_tool(lookup_order, start_to_close_timeout=timedelta(seconds=30)),
                activity_as_tool(issue_refund, start_to_close_timeout=timedelta(seconds=30)),
            ],
        )
        result = await Runner.run(agent, prompt)
        return str(result.final_output)
