"""Agents of the integration tests that give ``leased_tool`` their own ``key=`` and ``step_id=``, served
beside the example's agent through ``AGENTLEASE_WORKFLOW_MODULES``."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agentlease.demo.agents import notes
    from agentlease.demo.agents.openai_agent import AgentRequest, run_agent
    from agentlease.openai_agents._tools import leased_tool
    from agentlease.tools.builtin.http_get import http_get
    from agentlease.workflow._calls import leased_calls


@workflow.defn
class KeyedNotesAgent:
    """Publishes notes once per slug, whatever the model's call ids."""

    @workflow.init
    def __init__(self, request: AgentRequest | dict[str, Any]) -> None:
        self._calls = leased_calls()

    @workflow.run
    async def run(self, request: AgentRequest | dict[str, Any]) -> str:
        tools = [leased_tool(notes.post_note, key=lambda note: f"note:{note.slug}")]
        return await run_agent(request, tools, name="keyed-notes")


@workflow.defn
class CallerIdsAgent:
    """``fetch_once`` names every call's step ``fetch``; ``fetch_unkeyed`` makes an empty key."""

    @workflow.init
    def __init__(self, request: AgentRequest | dict[str, Any]) -> None:
        self._calls = leased_calls()

    @workflow.run
    async def run(self, request: AgentRequest | dict[str, Any]) -> str:
        tools = [
            leased_tool(http_get, name="fetch_once", step_id=lambda name, call_id: "fetch"),
            leased_tool(http_get, name="fetch_unkeyed", key=lambda args: ""),
        ]
        return await run_agent(request, tools, name="caller-ids")
