"""A Pydantic AI agent whose tools are the CRM's leased MCP tools (:mod:`tests.acceptance.mcp_fault_tools`).

The model is the scripted one of :mod:`tests.integration.pydantic_ai_agents` (the prompt lists the
calls; the answer is what the model was told). Served by ``python -m agentlease.demo.agents.pydantic_ai_agent``
with ``AGENTLEASE_TOOL_MODULES=tests.acceptance.mcp_fault_tools`` and
``AGENTLEASE_WORKFLOW_MODULES=tests.acceptance.mcp_pydantic_ai_agent``.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.models.function import FunctionModel

    from agentlease.pydantic_ai import LeasedToolset, run_agent
    from tests.acceptance.mcp_fault_tools import crm_create_contact, crm_import_contacts
    from tests.integration.pydantic_ai_agents import follow_prompt

WORKFLOW = "McpPydanticAgent"

TOOLSET = LeasedToolset([crm_create_contact, crm_import_contacts])

crm_agent = Agent(
    FunctionModel(follow_prompt, model_name="scripted"),
    name="mcp_crm_agent",
    toolsets=[TOOLSET],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name=WORKFLOW)
class McpPydanticAgent(PydanticAIWorkflow):
    """Runs the CRM agent on a ``prompt_for`` prompt; returns what the model was told (JSON)."""

    __pydantic_ai_agents__ = [crm_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.run
    async def run(self, prompt: str) -> str:
        return (await run_agent(crm_agent, prompt)).output
