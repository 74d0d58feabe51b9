"""The agent benchmark's workflows: one scripted agent per framework, with a plain or a leased tool.

Each agent asks its scripted model (:mod:`bench.agent_models`) for ``calls`` tool calls, one per
turn, then for a final answer; the plain side's tool is the framework's own way to run a tool as an
activity (the OpenAI Agents SDK's ``activity_as_tool``, Pydantic AI's ``FunctionToolset`` wrapped by
``TemporalDurability``), the leased side's is agentlease's adapter over :data:`bench.tools.BENCH_TOOL`.
Both tools heartbeat the same three stages; only the lease differs.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow
    from temporalio.openai_agents.workflow import activity_as_tool

    from agentlease.openai_agents._tools import leased_run_config, leased_tool
    from agentlease.workflow._calls import leased_calls
    from bench.agent_models import (
        AgentBatch,
        bench_plain_tool,
        leased_tools,
        pydantic_leased_agent,
        pydantic_plain_agent,
    )
    from bench.tools import BENCH_TOOL, LEASE_TTL

OPENAI_PLAIN = "agentlease.bench.OpenAIPlainAgent"
OPENAI_LEASED = "agentlease.bench.OpenAILeasedAgent"
PYDANTIC_PLAIN = "agentlease.bench.PydanticPlainAgent"
PYDANTIC_LEASED = "agentlease.bench.PydanticLeasedAgent"


async def _openai_run(batch: AgentBatch, tool: Any) -> str:
    agent: Agent[None] = Agent(name="bench", instructions="call the tool", tools=[tool])
    result = await Runner.run(
        agent, json.dumps({"calls": batch.calls}), run_config=leased_run_config(), max_turns=batch.calls + 2
    )
    return str(result.final_output)


@workflow.defn(name=OPENAI_PLAIN)
class OpenAIPlainAgent:
    @workflow.run
    async def run(self, batch: AgentBatch) -> str:
        tool = activity_as_tool(
            bench_plain_tool, start_to_close_timeout=timedelta(minutes=1), heartbeat_timeout=LEASE_TTL
        )
        return await _openai_run(batch, tool)


@workflow.defn(name=OPENAI_LEASED)
class OpenAILeasedAgent:
    @workflow.run
    async def run(self, batch: AgentBatch) -> str:
        leased_calls([BENCH_TOOL.info()])
        return await _openai_run(batch, leased_tool(BENCH_TOOL))


@workflow.defn(name=PYDANTIC_PLAIN)
class PydanticPlainAgent(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [pydantic_plain_agent]  # noqa: RUF012

    @workflow.run
    async def run(self, batch: AgentBatch) -> str:
        return (await pydantic_plain_agent.run(json.dumps({"calls": batch.calls}))).output


@workflow.defn(name=PYDANTIC_LEASED)
class PydanticLeasedAgent(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [pydantic_leased_agent]  # noqa: RUF012

    @workflow.init
    def __init__(self, batch: AgentBatch) -> None:
        self._calls = leased_tools.leased_calls()

    @workflow.run
    async def run(self, batch: AgentBatch) -> str:
        return (await pydantic_leased_agent.run(json.dumps({"calls": batch.calls}))).output
