"""The effect-safety benchmark's LangGraph agent (``temporalio.langgraph``), native and leased.

The scripted model node (an activity) reads the trial's one call from the prompt (:func:`refund_prompt`) and
then answers with what the tool returned. ``langgraph-native``'s tools node is an activity of its own that calls
``issue_refund`` (with the native tools' ``start_to_close_timeout`` and a ``heartbeat_timeout`` equal to the lease
TTL, as the other native sides; the tool heartbeats while it holds); ``langgraph-leased``'s runs in the workflow
and makes each call a leased one (:func:`agentlease.langgraph.leased_tools_node`).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage, convert_to_messages
from langgraph.graph import START, MessagesState, StateGraph

from agentlease.langgraph import leased_tools_node, route_tools
from bench.effects_tools import LEASE_TTL, NATIVE_START_TO_CLOSE, REFUND_TOOL, issue_refund

GRAPH = "effects"
NATIVE_TOOLS_NODE = f"{GRAPH}.tools"
"""The native tools node's activity type (``<graph>.<node>``)."""


async def scripted_model(state: MessagesState) -> dict[str, list[AIMessage]]:
    """The prompt's one call, then the tool's answer as the final text."""
    messages = convert_to_messages(state["messages"])
    returned = [m for m in messages if isinstance(m, ToolMessage)]
    if returned:
        return {"messages": [AIMessage(content=str(returned[-1].content))]}
    [call] = json.loads(str(messages[0].content))["turns"][0]
    tool_call = {"name": call["tool"], "args": call["arguments"], "id": "call-1"}
    return {"messages": [AIMessage(content="", tool_calls=[tool_call])]}


async def native_tools(state: MessagesState) -> dict[str, list[ToolMessage]]:
    """The native tools node: each call of the model's last message, run here."""
    [last] = convert_to_messages(state["messages"][-1:])
    assert isinstance(last, AIMessage), last
    told = [
        ToolMessage(json.dumps(await issue_refund(**call["args"])), tool_call_id=call["id"]) for call in last.tool_calls
    ]
    return {"messages": told}


def effects_graph(leased: bool) -> StateGraph[Any, Any, Any, Any]:
    """A fresh graph (``LangGraphPlugin`` changes the one it is given)."""
    graph = StateGraph(MessagesState)
    model = {"execute_in": "activity", "start_to_close_timeout": NATIVE_START_TO_CLOSE}
    graph.add_node("agent", scripted_model, metadata=model)
    if leased:
        graph.add_node("tools", leased_tools_node([REFUND_TOOL]), metadata={"execute_in": "workflow"})
    else:
        native = {**model, "heartbeat_timeout": LEASE_TTL}
        graph.add_node("tools", native_tools, metadata=native)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route_tools)
    graph.add_edge("tools", "agent")
    return graph
