"""A Pydantic AI agent that refunds orders (issue 18). Its scripted model (the tests' ``follow_prompt``) makes
the calls its prompt lists; Pydantic AI gives each call a new random tool-call id, in the model request's
activity, so a ``temporal workflow reset`` that asks the model again gets new ids."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.models.function import FunctionModel

    from agentlease.pydantic_ai._toolset import LeasedToolset, run_agent
    from tests.integration import refund_tools
    from tests.integration.pydantic_ai_agents import follow_prompt

TOOLSET = LeasedToolset([refund_tools.issue_refund], id="refunds")

refund_agent = Agent(
    FunctionModel(follow_prompt, model_name="scripted"),
    name="refund_agent",
    toolsets=[TOOLSET],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name="RefundPydanticWorkflow")
class RefundPydanticWorkflow(PydanticAIWorkflow):
    """Runs the refund agent on a ``prompt_for`` prompt; returns what the model was told (JSON)."""

    __pydantic_ai_agents__ = [refund_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.init
    def __init__(self, prompt: str) -> None:
        self.calls = TOOLSET.leased_calls()

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await run_agent(refund_agent, prompt)).output
