"""The support agent: a Pydantic AI agent run durably by Temporal (``TemporalDurability``)."""

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
    tools=[lookup_order, issue_refund],
    capabilities=[TemporalDurability()],
)


@workflow.defn
class SupportAgentWorkflow(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [support_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await support_agent.run(prompt)
        return result.output
