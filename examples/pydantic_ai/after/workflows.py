"""The support agent: a Pydantic AI agent run durably by Temporal (``TemporalDurability``)."""

from agentlease.pydantic_ai import LeasedToolset, run_agent
from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import issue_refund, lookup_order
    from model import MODEL

support_agent = Agent(
    MODEL,
    name="support",
    instructions="You handle refund requests: look the order up, then refund what it cost.",
    toolsets=[LeasedToolset([lookup_order, issue_refund])],
    capabilities=[TemporalDurability()],
)


@workflow.defn
class SupportAgentWorkflow(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [support_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await run_agent(support_agent, prompt)
        return result.output
