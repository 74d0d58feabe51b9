"""The agent of the fault tests: the example's agent run (:func:`agentlease.demo.agents.openai_agent.run_agent`)
with the tools of :mod:`tests.acceptance.agent_tools`. Served by ``python -m agentlease.demo.agents.openai_agent``
with ``AGENTLEASE_WORKFLOW_MODULES=tests.acceptance.agent_workflows``."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agentlease.demo.agents.openai_agent import AgentRequest, run_agent
    from agentlease.openai_agents._tools import leased_tool
    from agentlease.workflow._calls import leased_calls
    from tests.acceptance import agent_tools


@workflow.defn
class FaultsAgent:
    """An agent whose model calls the matrix tools; returns its final answer."""

    @workflow.init
    def __init__(self, request: AgentRequest | dict[str, Any]) -> None:
        self._calls = leased_calls()

    @workflow.run
    async def run(self, request: AgentRequest | dict[str, Any]) -> str:
        tools = [leased_tool(agent_tools.agent_idempotent), leased_tool(agent_tools.agent_fenced)]
        return await run_agent(request, tools, name="faults-agent")
