"""The recovery benchmark's agent on Pydantic AI (``python -m bench.recovery --agent pydantic``): a scripted
model (:func:`tests.integration.pydantic_ai_agents.follow_prompt`) whose one call is a holding tool of
:mod:`bench.recovery_tools`. Served by ``python -m agentlease.demo.agents.pydantic_ai_agent`` with
``AGENTLEASE_WORKFLOW_MODULES=bench.recovery_pydantic``."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.models.function import FunctionModel

    from agentlease.pydantic_ai._toolset import LeasedToolset, run_agent
    from bench import recovery_tools
    from tests.integration.pydantic_ai_agents import follow_prompt

WORKFLOW = "RecoveryPydanticAgent"

TOOLSET = LeasedToolset([getattr(recovery_tools, name) for name in recovery_tools.TOOL_OF_TTL.values()])

recovery_agent = Agent(
    FunctionModel(follow_prompt, model_name="scripted"),
    name="recovery_agent",
    toolsets=[TOOLSET],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name=WORKFLOW)
class RecoveryPydanticAgent(PydanticAIWorkflow):
    """Runs the agent on a ``prompt_for`` prompt; returns what the model was told (JSON)."""

    __pydantic_ai_agents__ = [recovery_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.init
    def __init__(self, prompt: str) -> None:
        self.calls = TOOLSET.leased_calls()

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await run_agent(recovery_agent, prompt)).output
