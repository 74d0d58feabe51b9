"""Leased tools for a Strands agent on Temporal (``temporalio.strands_agents``), workflow code: :func:`leased_tool`
(``docs/agents.md``).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from strands.types._events import ToolResultEvent
    from strands.types.tools import AgentTool, ToolGenerator, ToolResult, ToolSpec, ToolUse

    from agentlease.adapters._core import AdaptedTool, ArgumentsKey, StepIdFunction, adapted
    from agentlease.tools._declaration import DeclaredTool
    from agentlease.workflow._calls import leased_calls


class LeasedTool(AgentTool):
    """A Strands tool whose every use is one leased call of the running workflow, keyed by the model's
    ``toolUseId`` (recorded by the model activity, so the same on every retry and on replay)."""

    def __init__(self, adapted: AdaptedTool) -> None:
        super().__init__()
        self._adapted = adapted
        schema = {"json": adapted.schema()}
        self._spec: ToolSpec = {"name": adapted.name, "description": adapted.description, "inputSchema": schema}

    @property
    def tool_name(self) -> str:
        return self._adapted.name

    @property
    def tool_spec(self) -> ToolSpec:
        return self._spec

    @property
    def tool_type(self) -> str:
        return "agentlease_leased"

    async def stream(self, tool_use: ToolUse, invocation_state: dict[str, Any], **kwargs: Any) -> ToolGenerator:
        call_id = tool_use["toolUseId"]
        reply = await self._adapted.call(dict(tool_use["input"] or {}), call_id)
        status = "success" if reply.ok else "error"
        yield ToolResultEvent(ToolResult(toolUseId=call_id, status=status, content=[{"text": reply.as_text()}]))


def leased_tool(
    tool: DeclaredTool,
    *,
    name: str | None = None,
    description: str | None = None,
    step_id: StepIdFunction | None = None,
    key: ArgumentsKey | None = None,
) -> LeasedTool:
    """A Strands tool for ``tool`` whose uses are leased tool calls of the running workflow (the worker serves the
    tool with :class:`agentlease.plugin.AgentLeasePlugin`), in place of ``activity_as_tool``.

    Args:
        tool: a declared tool (``@tool`` or ``@leased``); its argument model is the schema the model sees.
        name / description: what the model calls it and reads. Default the tool's name and description.
        step_id: ``(name, toolUseId) -> step id`` text (made valid and unique in the run).
        key: ``(validated arguments) -> idempotency key``, over the tool's ``action_key``.

    Returns:
        The tool: a use's result is the settled output as JSON text, or one ``error:`` line (status ``error``).

    Raises:
        ConfigurationError: ``tool`` is not a declared tool.
    """
    return LeasedTool(adapted(tool, "leased_tool", name=name, description=description, step_id=step_id, key=key))


async def run_agent(agent: Any, prompt: Any, **invoke_kwargs: Any) -> Any:
    """``await agent.invoke_async(prompt, **invoke_kwargs)`` (a ``TemporalAgent``), then end the run's leased calls
    (``completed``; ``failed`` when it raised, re-raised). Outside a workflow it only runs the agent."""
    if not workflow.in_workflow():
        return await agent.invoke_async(prompt, **invoke_kwargs)
    return await leased_calls().run_to_end(agent.invoke_async, prompt, **invoke_kwargs)
