"""An OpenAI Agents agent whose tool is the CRM's leased MCP ``create_contact``
(:mod:`tests.acceptance.mcp_fault_tools`), with the example's scripted model. Served by
``python -m agentlease.demo.agents.openai_agent`` with ``AGENTLEASE_TOOL_MODULES=tests.acceptance.mcp_fault_tools``
and ``AGENTLEASE_WORKFLOW_MODULES=tests.acceptance.mcp_openai_agent``."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agentlease.demo.agents.openai_agent import AgentRequest, run_agent
    from agentlease.openai_agents import leased_tool
    from tests.acceptance.mcp_fault_tools import crm_create_contact


@workflow.defn
class McpOpenAIAgent:
    """An agent whose model calls ``crm_create_contact``; returns its final answer."""

    @workflow.run
    async def run(self, request: AgentRequest | dict[str, Any]) -> str:
        return await run_agent(request, [leased_tool(crm_create_contact)], name="mcp-crm-agent")
