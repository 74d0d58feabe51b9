"""Leased tool calls for a Pydantic AI agent that runs durably on Temporal (``TemporalDurability``), workflow code:
:class:`LeasedToolset` and :func:`run_agent` (``docs/pydantic-ai.md``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, TypeAdapter
    from pydantic_ai import AbstractToolset, RunContext, ToolDefinition, ToolsetTool
    from pydantic_ai.agent import AbstractAgent, AgentRunResult
    from pydantic_ai.exceptions import ToolFailed

    from agentlease.adapters._core import call_leased, declared
    from agentlease.records import ToolInfo
    from agentlease.tools._declaration import DeclaredTool
    from agentlease.workflow._calls import LeasedToolCalls, leased_calls

OutputT = TypeVar("OutputT")

DEFAULT_MAX_RETRIES = 1
"""How many times the model may correct a call whose arguments failed the tool's model. Default 1."""

StepIdFunction = Callable[[str, str], str]
"""``(tool name, tool-call id) -> text`` a step id is made from (made valid and unique in the run)."""

KeyFunction = Callable[[str, dict[str, Any]], str | None]
"""``(tool name, validated arguments) -> idempotency key``; ``None``: the default ``<workflow id>:<step id>``."""


class _ArgsValidator:
    """Validates a call's arguments with the tool's model (an error is a retry prompt to the model), as JSON."""

    def __init__(self, model: type[BaseModel]) -> None:
        self._adapter = TypeAdapter(model)

    def validate_json(
        self,
        input: str | bytes | bytearray,
        *,
        allow_partial: bool | Literal["off", "on", "trailing-strings"] = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        value = self._adapter.validate_json(
            input or "{}", experimental_allow_partial=allow_partial, context=kwargs.get("context")
        )
        return value.model_dump(mode="json")

    def validate_python(
        self, input: Any, *, allow_partial: bool | Literal["off", "on", "trailing-strings"] = False, **kwargs: Any
    ) -> dict[str, Any]:
        value = self._adapter.validate_python(
            input or {}, experimental_allow_partial=allow_partial, context=kwargs.get("context")
        )
        return value.model_dump(mode="json")


def _default_step_id(tool: str, tool_call_id: str) -> str:
    return f"{tool}-{tool_call_id}"


class LeasedToolset(AbstractToolset[Any]):
    """Declared agentlease tools as a Pydantic AI toolset whose calls are leased activities (``docs/pydantic-ai.md``).
    Outside a workflow each call runs a ``leased`` tool's function directly, without a lease.

    Args:
        tools: the declared tools; names must be unique.
        id: the toolset's id among the agent's toolsets. Default ``"agentlease"``.
        step_id: a :data:`StepIdFunction`, deterministic (workflow code). Default ``"<tool>-<tool_call_id>"``.
        key: a :data:`KeyFunction` over the tool's declared ``action_key``, deterministic. Default ``None``: the
            declared action key, else ``<workflow id>:<step id>``.
        max_retries: how often the model may correct bad arguments. Default 1.

    Raises:
        ValueError: two tools share a name.
        ConfigurationError: an item is not a declared tool (an MCP toolset, say: ``docs/mcp.md``).
    """

    def __init__(
        self,
        tools: Sequence[DeclaredTool],
        *,
        id: str = "agentlease",
        step_id: StepIdFunction | None = None,
        key: KeyFunction | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        for tool in tools:
            declared(tool, "LeasedToolset")
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"two tools of a LeasedToolset share a name: {sorted(names)}")
        self._id = id
        self._tools = {tool.name: tool for tool in tools}
        self._infos = {tool.name: tool.info() for tool in tools}
        self._step_id = step_id or _default_step_id
        self._key = key
        self._definitions = {
            tool.name: ToolDefinition(
                name=tool.name,
                description=tool.description or inspect.getdoc(tool.args_model),
                parameters_json_schema=tool.args_model.model_json_schema(),
                metadata={"agentlease": self._infos[tool.name].side_effect_class.value},
            )
            for tool in tools
        }
        self._validators = {tool.name: _ArgsValidator(tool.args_model) for tool in tools}
        self._max_retries = max_retries

    @property
    def id(self) -> str:
        return self._id

    @property
    def infos(self) -> list[ToolInfo]:
        """The tools' declarations as the workflow schedules them."""
        return list(self._infos.values())

    def leased_calls(self) -> LeasedToolCalls:
        """The running workflow's :class:`LeasedToolCalls` with these tools registered (workflow code)."""
        return leased_calls(self.infos)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            name: ToolsetTool(
                toolset=self, tool_def=definition, max_retries=self._max_retries, args_validator=self._validators[name]
            )
            for name, definition in self._definitions.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run the call as a leased activity until it is final (outside a workflow: unleased, its output;
        ``ConfigurationError`` for a ``@tool`` tool). ``ToolFailed``: it did not settle (the model is told why)."""
        key_of = self._key

        def key(args: BaseModel) -> str | None:
            return key_of(name, args.model_dump(mode="json")) if key_of is not None else None

        reply = await call_leased(
            self._tools[name],
            tool_args,
            name=name,
            call_id=ctx.tool_call_id or name,
            step_id=self._step_id,
            key=key,
        )
        if reply.ok:
            return reply.output
        raise ToolFailed(reply.error)


async def run_agent(agent: AbstractAgent[Any, OutputT], *args: Any, **kwargs: Any) -> AgentRunResult[OutputT]:
    """``agent.run(*args, **kwargs)`` from workflow code, then end the run's leased calls
    (:meth:`~agentlease.workflow.LeasedToolCalls.run_to_end`: what it raises propagates, the run ``failed``).
    Outside a workflow it is ``agent.run``."""
    if not workflow.in_workflow():
        return await agent.run(*args, **kwargs)
    return await leased_calls().run_to_end(agent.run, *args, **kwargs)


__all__ = ["DEFAULT_MAX_RETRIES", "DeclaredTool", "KeyFunction", "LeasedToolset", "StepIdFunction", "run_agent"]
