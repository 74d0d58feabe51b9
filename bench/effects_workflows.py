"""The effect-safety benchmark's workflows: the same scripted agent with the native tool or the leased one.

- ``openai-native``: the OpenAI Agents SDK, the tool as ``activity_as_tool(refund_activity)``
  (``openai-native-keyed``: the same, its tool sending a key made from its activity);
- ``openai-leased``: the same agent with ``agentlease.openai_agents.leased_tool(REFUND_TOOL)``;
- ``pydantic-native``: Pydantic AI under ``TemporalDurability``, the function in a ``FunctionToolset``;
- ``pydantic-leased``: the same agent with ``agentlease.pydantic_ai.LeasedToolset([REFUND_TOOL])``;
- ``langgraph-native`` / ``langgraph-leased``: a LangGraph graph under ``LangGraphPlugin``
  (:mod:`bench.effects_graphs`), its tools node an activity or leased calls;
- ``adk-native`` / ``adk-leased``: a Google ADK agent under ``GoogleAdkPlugin`` (:mod:`bench.effects_adk`), the
  tool as ``activity_as_tool(refund_activity)`` or ``agentlease.google_adk.leased_tool(REFUND_TOOL)``.

Agents, models and timeouts are in :mod:`bench.effects_agents`. Workflow code: re-imported in the sandbox.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner
    from google.adk import Agent as AdkAgent
    from google.adk.runners import InMemoryRunner
    from google.genai import types
    from langchain_core.messages import HumanMessage
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow
    from temporalio.google_adk import TemporalModel
    from temporalio.google_adk.workflow import activity_as_tool as adk_activity_as_tool
    from temporalio.langgraph import graph
    from temporalio.openai_agents.workflow import activity_as_tool

    from agentlease.google_adk import leased_tool as adk_leased_tool
    from agentlease.google_adk import run_agent as run_adk_agent
    from agentlease.langgraph import run_graph
    from agentlease.openai_agents import leased_tool
    from agentlease.openai_agents import run_agent as run_openai_agent
    from agentlease.pydantic_ai import run_agent as run_pydantic_agent
    from agentlease.workflow import leased_calls
    from bench.effects_adk import MODEL as ADK_MODEL
    from bench.effects_agents import (
        INSTRUCTIONS,
        leased_tools,
        pydantic_leased_agent,
        pydantic_native_agent,
    )
    from bench.effects_tools import LEASE_TTL, NATIVE_START_TO_CLOSE, REFUND_TOOL, refund_activity


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


@workflow.defn(name="EffectsLangGraph")
class LangGraphAgent:
    """Both LangGraph sides: the worker's plugin holds the native or the leased graph."""

    @workflow.run
    async def run(self, prompt: str) -> str:
        state = await run_graph(graph("effects").compile(), {"messages": [HumanMessage(prompt)]})
        return str(state["messages"][-1].content)


async def _adk_answer(tool: Any, prompt: str) -> str:
    agent = AdkAgent(name="refunds", model=TemporalModel(ADK_MODEL), instruction=INSTRUCTIONS, tools=[tool])
    runner = InMemoryRunner(agent=agent, app_name="effects")
    session = await runner.session_service.create_session(app_name="effects", user_id="bench")
    message = types.Content(role="user", parts=[types.Part(text=prompt)])
    events = await run_adk_agent(runner, user_id="bench", session_id=session.id, new_message=message)
    return "".join(part.text or "" for part in events[-1].content.parts or [])


@workflow.defn(name="EffectsAdkNative")
class AdkNative:
    @workflow.run
    async def run(self, prompt: str) -> str:
        timeouts = {"start_to_close_timeout": NATIVE_START_TO_CLOSE, "heartbeat_timeout": LEASE_TTL}
        return await _adk_answer(adk_activity_as_tool(refund_activity, **timeouts), prompt)


@workflow.defn(name="EffectsAdkLeased")
class AdkLeased:
    @workflow.run
    async def run(self, prompt: str) -> str:
        return await _adk_answer(adk_leased_tool(REFUND_TOOL), prompt)


WORKFLOWS: dict[str, Any] = {
    "openai-native": OpenAINative,
    "openai-native-keyed": OpenAINative,  # the same agent; its workers make the tool send a key
    "openai-leased": OpenAILeased,
    "pydantic-native": PydanticNative,
    "pydantic-leased": PydanticLeased,
    "langgraph-native": LangGraphAgent,
    "langgraph-leased": LangGraphAgent,
    "adk-native": AdkNative,
    "adk-leased": AdkLeased,
}
"""Each system's workflow class, by the name the benchmark reports it under."""
