"""Leased tool calls for a LangGraph graph on Temporal (``temporalio.langgraph``), workflow code: a tools node
whose every tool call is one leased call keyed by the model's tool-call id, an async router, and
:func:`run_graph` (``docs/agents.md``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, Protocol

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from langchain_core.messages import AIMessage, ToolMessage, convert_to_messages

    from agentlease.adapters._core import ArgumentsKey, Reply, StepIdFunction, call_leased, declared
    from agentlease.tools._declaration import DeclaredTool
    from agentlease.workflow._calls import LeasedCallError, leased_calls

MESSAGES = "messages"
"""The state key of the messages (LangGraph's ``MessagesState``)."""


class Node(Protocol):
    """A LangGraph node run in the workflow: ``state -> the state's update``."""

    def __call__(self, state: Any) -> Awaitable[dict[str, Any]]: ...


def _last_ai_message(state: Any, messages_key: str) -> AIMessage | None:
    """The last message of ``state`` when it is the model's (a dict, a LangGraph state object or a list)."""
    messages = (
        state
        if isinstance(state, list)
        else (state.get(messages_key, []) if isinstance(state, dict) else getattr(state, messages_key, []))
    )
    if not messages:
        return None
    [last] = convert_to_messages(messages[-1:])  # a message that crossed an activity may arrive as a dict
    return last if isinstance(last, AIMessage) else None


async def leased_tool_messages(
    tool_calls: Iterable[Mapping[str, Any]],
    tools: Iterable[DeclaredTool],
    *,
    step_id: StepIdFunction | None = None,
    key: ArgumentsKey | None = None,
) -> list[ToolMessage]:
    """Run the model's ``tool_calls`` (``AIMessage.tool_calls``: ``name``, ``args``, ``id``) as leased calls of the
    running workflow, side by side: the body of a tools node of your own (workflow code, ``execute_in="workflow"``).

    Each call is a task ``<run>/<tool>-<id>`` keyed ``<run>:<tool>-<id>`` (or by the tool's ``action_key``); the id
    comes out of the recorded model activity, so it is the same on every retry and on replay.

    Args:
        tools: declared tools (``@tool`` or ``@leased``) by their names.
        step_id: ``(tool, id) -> step id`` text (made valid and unique in the run).
        key: ``(validated arguments) -> idempotency key``, over the tool's ``action_key``.

    Returns:
        One ``ToolMessage`` per call, in order: the settled output as JSON, or (``status="error"``) one ``error:``
        line the model reads: a call that did not settle, bad arguments, a tool not among ``tools``.

    Raises:
        ConfigurationError: an item of ``tools`` is not a declared tool.
    """
    by_name = {declared(tool, "leased_tool_messages").name: tool for tool in tools}

    async def one(call: Mapping[str, Any]) -> ToolMessage:
        name, call_id = str(call.get("name")), str(call.get("id") or "call")
        tool = by_name.get(name)
        if tool is None:
            reply = Reply(False, error=f"unknown tool {name!r}; the tools are: {', '.join(sorted(by_name))}")
        else:
            reply = await call_leased(
                tool, call.get("args") or {}, name=name, call_id=call_id, step_id=step_id, key=key
            )
        status = "success" if reply.ok else "error"
        return ToolMessage(content=reply.as_text(), tool_call_id=call_id, name=name, status=status)

    return list(await asyncio.gather(*(one(call) for call in tool_calls)))


def leased_tools_node(
    tools: Iterable[DeclaredTool],
    *,
    messages_key: str = MESSAGES,
    step_id: StepIdFunction | None = None,
    key: ArgumentsKey | None = None,
) -> Node:
    """A LangGraph tools node: :func:`leased_tool_messages` for the tool calls of the state's last ``AIMessage``.
    Add it with ``metadata={"execute_in": "workflow"}``; the worker's ``AgentLeasePlugin`` serves the calls.

    Returns:
        The node: ``state -> {messages_key: [ToolMessage, ...]}``.

    Raises:
        ConfigurationError: an item of ``tools`` is not a declared tool.
    """
    chosen = list(tools)
    for tool in chosen:
        declared(tool, "leased_tools_node")

    async def tools_node(state: Any) -> dict[str, list[ToolMessage]]:
        last = _last_ai_message(state, messages_key)
        calls = last.tool_calls if last is not None else []
        return {messages_key: await leased_tool_messages(calls, chosen, step_id=step_id, key=key)}

    return tools_node


def leased_node(
    tool: DeclaredTool,
    arguments: Callable[[Any], Mapping[str, Any]],
    *,
    output_key: str,
    name: str | None = None,
    key: ArgumentsKey | None = None,
) -> Node:
    """A LangGraph node whose side effect is one leased call of ``tool``, for a graph with no model-driven tools
    node (a step of a pipeline: send the invoice, open the ticket). Add it with ``metadata={"execute_in":
    "workflow"}``.

    Each time the node runs is one task ``<run>/<name>`` (``<name>-2``, ``-3``... when it runs again in the run, in
    the run's deterministic order), keyed ``<run>:<name>`` (or by the tool's ``action_key``, or ``key``).

    Args:
        arguments: ``state -> the tool's arguments`` (validated by its argument model).
        output_key: the state key the settled output is written to.
        name: the step id's text; default the tool's name.
        key: ``(validated arguments) -> idempotency key``, over the tool's ``action_key``.

    Returns:
        The node: ``state -> {output_key: output}`` (``{"settled": true, ...}`` for a call settled from an earlier
        receipt). A call that did not settle (bad arguments, rejected, cancelled, failed) fails the run with its
        one line (``LeasedCallError``): there is no model to tell.

    Raises:
        ConfigurationError: ``tool`` is not a declared tool.
    """
    shown = name or declared(tool, "leased_node").name
    declared(tool, "leased_node")

    async def node(state: Any) -> dict[str, Any]:
        reply = await call_leased(
            tool, dict(arguments(state)), name=shown, call_id="", step_id=lambda text, _: text, key=key
        )
        if not reply.ok:
            raise LeasedCallError(reply.error)
        return {output_key: reply.output}

    return node


async def route_tools(state: Any) -> Literal["tools", "__end__"]:
    """The router after the model's node: ``"tools"`` when its last message calls tools, else the end. Async,
    as a router in a workflow must be (LangGraph runs a sync router on a thread, which the sandbox refuses)."""
    last = _last_ai_message(state, MESSAGES)
    return "tools" if last is not None and last.tool_calls else "__end__"


async def run_graph(graph: Any, input: Any, **kwargs: Any) -> Any:
    """``await graph.ainvoke(input, **kwargs)`` (a compiled graph) from workflow code, then end the run's leased
    calls (``completed``; ``failed`` when it raised, re-raised). Outside a workflow it is ``graph.ainvoke``."""
    if not workflow.in_workflow():
        return await graph.ainvoke(input, **kwargs)
    return await leased_calls().run_to_end(graph.ainvoke, input, **kwargs)
