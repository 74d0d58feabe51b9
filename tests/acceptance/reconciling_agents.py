"""The OpenAI Agents agent of the cancel test (issue 18): the example's agent run
(:func:`agentlease.demo.agents.openai_agent.run_agent`) with ``chatty_send``
(:mod:`tests.acceptance.reconciling_tools`). Served by ``python -m agentlease.demo.agents.openai_agent`` with
``AGENTLEASE_WORKFLOW_MODULES=tests.acceptance.reconciling_agents``."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agentlease.demo.agents.openai_agent import AgentRequest, run_agent
    from agentlease.openai_agents._tools import leased_tool
    from agentlease.workflow._calls import leased_calls
    from tests.acceptance import reconciling_tools


@workflow.defn
class ChattyAgent:
    """An agent whose model calls ``chatty_send``, which sends until it is stopped; returns its final answer."""

    @workflow.init
    def __init__(self, request: AgentRequest | dict[str, Any]) -> None:
        self._calls = leased_calls()

    @workflow.run
    async def run(self, request: AgentRequest | dict[str, Any]) -> str:
        return await run_agent(request, [leased_tool(reconciling_tools.chatty_send)], name="chatty-agent")
