"""Leased tools for a Google ADK agent on Temporal (``temporalio.google_adk``), workflow code: :func:`leased_tool`
(``docs/agents.md``).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from google.adk.tools import BaseTool, ToolContext
    from google.genai import types

    from agentlease.adapters._core import AdaptedTool, ArgumentsKey, StepIdFunction, adapted
    from agentlease.tools._declaration import DeclaredTool
    from agentlease.workflow._calls import leased_calls


class LeasedTool(BaseTool):
    """An ADK tool whose every call is one leased call of the running workflow, keyed by ADK's function-call id
    (recorded by the model activity, so the same on every retry and on replay). Made by :func:`leased_tool`."""

    def __init__(self, adapted: AdaptedTool) -> None:
        super().__init__(name=adapted.name, description=adapted.description)
        self._adapted = adapted

    def _get_declaration(self) -> types.FunctionDeclaration:
        schema = self._adapted.schema()
        return types.FunctionDeclaration(name=self.name, description=self.description, parameters_json_schema=schema)

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        reply = await self._adapted.call(args, tool_context.function_call_id or "call")
        return reply.output if reply.ok else {"error": reply.error}


def leased_tool(
    tool: DeclaredTool,
    *,
    name: str | None = None,
    description: str | None = None,
    step_id: StepIdFunction | None = None,
    key: ArgumentsKey | None = None,
) -> LeasedTool:
    """An ADK tool for ``tool`` whose calls are leased tool calls of the running workflow (the worker serves the
    tool with :class:`agentlease.plugin.AgentLeasePlugin`). Outside a workflow a ``leased`` tool runs unleased.

    Args:
        tool: a declared tool (``@tool`` or ``@leased``); its argument model is the schema the model sees.
        name / description: what the model calls it and reads. Default the tool's name and description.
        step_id: ``(name, function_call_id) -> step id`` text (made valid and unique in the run). Default
            ``<name>-<function_call_id>``.
        key: ``(validated arguments) -> idempotency key``, over the tool's ``action_key``.

    Returns:
        The tool: a call returns the settled output, or ``{"error": "<one line>"}`` (bad arguments, rejected,
        abandoned, cancelled, failed).

    Raises:
        ConfigurationError: ``tool`` is not a declared tool.
    """
    return LeasedTool(adapted(tool, "leased_tool", name=name, description=description, step_id=step_id, key=key))


async def run_agent(runner: Any, **run_kwargs: Any) -> list[Any]:
    """Every event of ``runner.run_async(**run_kwargs)`` (an ADK ``Runner``), then end the run's leased calls
    (``completed``; ``failed`` when it raised, re-raised). Outside a workflow it only collects the events."""

    async def events() -> list[Any]:
        return [event async for event in runner.run_async(**run_kwargs)]

    if not workflow.in_workflow():
        return await events()
    return await leased_calls().run_to_end(events)
