"""Leased tool calls for agents on the OpenAI Agents SDK (extra ``agentlease[openai-agents]``).

In the agent's workflow (``temporalio.openai_agents.OpenAIAgentsPlugin`` on the client)::

    with workflow.unsafe.imports_passed_through():
        from agents import Agent
        from agentlease.openai_agents import leased_tool, run_agent
        from agentlease.workflow import leased_calls
        import mytools

    @workflow.defn
    class Triage:
        @workflow.init
        def __init__(self, prompt: str) -> None:
            self._calls = leased_calls()  # the status query and the decision updates answer from the start

        @workflow.run
        async def run(self, prompt: str) -> str:
            agent = Agent(name="triage", instructions="...", tools=[leased_tool(mytools.open_ticket)])
            result = await run_agent(agent, prompt)  # ends the run's status too
            return str(result.final_output)

and on the worker :class:`agentlease.plugin.AgentLeasePlugin` with ``tools=["mytools"]``. The tools are
``@tool`` tools or functions leased as they are (``agentlease.leased``); outside a workflow the
agent still runs, each ``leased`` tool called directly without a lease. See
:mod:`agentlease.openai_agents._tools` for what the model reads back, approvals, and the
``key=`` of actions that must stay unique across a workflow reset.
"""

from __future__ import annotations

from agentlease.openai_agents._tools import (
    DeclaredTool,
    KeyFunction,
    StepIdFunction,
    leased_run_config,
    leased_tool,
    run_agent,
    tool_output,
)

__all__ = [
    "DeclaredTool",
    "KeyFunction",
    "StepIdFunction",
    "leased_run_config",
    "leased_tool",
    "run_agent",
    "tool_output",
]
