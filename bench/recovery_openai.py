"""The recovery benchmark's agent on the OpenAI Agents SDK (``python -m bench.recovery --agent openai``): the
example's scripted agent run whose one tool is a holding tool of :mod:`bench.recovery_tools`. Served by
``python -m agentlease.demo.agents.openai_agent`` with ``AGENTLEASE_WORKFLOW_MODULES=bench.recovery_openai``."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agentlease.demo.agents.openai_agent import AgentRequest, run_agent
    from agentlease.openai_agents._tools import leased_tool
    from agentlease.workflow._calls import leased_calls
    from bench import recovery_tools


@workflow.defn
class RecoveryOpenAIAgent:
    """An agent whose scripted model calls one holding tool; returns its final answer."""

    @workflow.init
    def __init__(self, request: AgentRequest | dict[str, Any]) -> None:
        self._calls = leased_calls()

    @workflow.run
    async def run(self, request: AgentRequest | dict[str, Any]) -> str:
        tools = [leased_tool(getattr(recovery_tools, name)) for name in recovery_tools.TOOL_OF_TTL.values()]
        return await run_agent(request, tools, name="recovery-agent")
