"""The effect-safety benchmark's workflows: the same scripted agent with the native tool or the leased one.

- ``openai-native``: the OpenAI Agents SDK, the tool as ``activity_as_tool(refund_activity)``
  (``openai-native-keyed``: the same, its tool sending a key made from its activity);
- ``openai-leased``: the same agent with ``agentlease.openai_agents.leased_tool(REFUND_TOOL)``;
- ``pydantic-native``: Pydantic AI under ``TemporalDurability``, the function in a ``FunctionToolset``;
- ``pydantic-leased``: the same agent with ``agentlease.pydantic_ai.LeasedToolset([REFUND_TOOL])``.

Agents, models and timeouts are in :mod:`bench.effects_agents`. Workflow code: re-imported in the sandbox.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow
    from temporalio.openai_agents.workflow import activity_as_tool

    from agentlease.openai_agents import leased_tool
    from agentlease.openai_agents import run_agent as run_openai_agent
    from agentlease.pydantic_ai import run_agent as run_pydantic_agent
    from agentlease.workflow import leased_calls
    from bench.effects_agents import (
        INSTRUCTIONS,
        NATIVE_START_TO_CLOSE,
        leased_tools,
        pydantic_leased_agent,
        pydantic_native_agent,
    )
    from bench.effects_tools import LEASE_TTL, REFUND_TOOL, refund_activity


@workflow.defn(name="EffectsOpenAINative")
class OpenAINative:
    @workflow.run
    async def run(self, prompt: str) -> str:
        tool = activity_as_tool(
            refund_activity, start_to_close_timeout=NATIVE_START_TO_CLOSE, heartbeat_timeout=LEASE_TTL
        )
        agent: Agent[None] = Agent(name="refunds", instructions=INSTRUCTIONS, tools=[tool])
        return str((await Runner.run(agent, prompt)).final_output)


@workflow.defn(name="EffectsOpenAILeased")
class OpenAILeased:
    @workflow.init
    def __init__(self, prompt: str) -> None:
        self._calls = leased_calls([REFUND_TOOL.info()])

    @workflow.run
    async def run(self, prompt: str) -> str:
        agent: Agent[None] = Agent(name="refunds", instructions=INSTRUCTIONS, tools=[leased_tool(REFUND_TOOL)])
        return str((await run_openai_agent(agent, prompt)).final_output)


@workflow.defn(name="EffectsPydanticNative")
class PydanticNative(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [pydantic_native_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await pydantic_native_agent.run(prompt)).output


@workflow.defn(name="EffectsPydanticLeased")
class PydanticLeased(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [pydantic_leased_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.init
    def __init__(self, prompt: str) -> None:
        self._calls = leased_tools.leased_calls()

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await run_pydantic_agent(pydantic_leased_agent, prompt)).output


WORKFLOWS: dict[str, Any] = {
    "openai-native": OpenAINative,
    "openai-native-keyed": OpenAINative,  # the same agent; its workers make the tool send a key
    "openai-leased": OpenAILeased,
    "pydantic-native": PydanticNative,
    "pydantic-leased": PydanticLeased,
}
"""Each system's workflow class, by the name the benchmark reports it under."""
