"""A LangGraph refunds agent on Temporal for the tests: a scripted model node (an activity) and a leased tools node.

The model asks for the refunds its prompt lists (``refund A-1 500; refund A-2 700``) in one turn, plus a call of
a tool that does not exist when the prompt says ``and invent``, then answers with what each call told it.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, TypedDict

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, convert_to_messages
    from langgraph.graph import END, START, MessagesState, StateGraph
    from temporalio.langgraph import graph

    from agentlease.langgraph import leased_node, leased_tools_node, route_tools, run_graph
    from tests.integration.file_refunds import issue_refund

GRAPH = "refunds"


async def scripted_model(state: MessagesState) -> dict[str, list[AIMessage]]:
    """The model's turn: tool calls for the prompt's refunds first, then an answer from what the tools said."""
    messages = convert_to_messages(state["messages"])  # they cross the activity boundary as dicts
    told = [m for m in messages if isinstance(m, ToolMessage)]
    if told:
        return {"messages": [AIMessage(content=" | ".join(f"{m.name}: {m.content}" for m in told))]}
    prompt = str(messages[0].content)
    calls = [
        {"name": "issue_refund", "args": {"order_id": order, "amount_cents": int(cents)}, "id": f"call-{n}"}
        for n, (order, cents) in enumerate(re.findall(r"refund (\S+) (\d+)", prompt), 1)
    ]
    if "and invent" in prompt:
        calls.append({"name": "wire_money", "args": {}, "id": "call-x"})
    return {"messages": [AIMessage(content="", tool_calls=calls)]}


def build_graph() -> StateGraph[Any, Any, Any, Any]:
    """The agent's graph: the model as an activity, the leased tools node in the workflow."""
    built = StateGraph(MessagesState)
    built.add_node(
        "agent", scripted_model, metadata={"execute_in": "activity", "start_to_close_timeout": timedelta(seconds=30)}
    )
    built.add_node("tools", leased_tools_node([issue_refund]), metadata={"execute_in": "workflow"})
    built.add_edge(START, "agent")
    built.add_conditional_edges("agent", route_tools)
    built.add_edge("tools", "agent")
    return built


@workflow.defn
class RefundGraphWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        app = graph(GRAPH).compile()
        state = await run_graph(app, {"messages": [HumanMessage(prompt)]})
        [answer] = convert_to_messages(state["messages"][-1:])
        return str(answer.content)


PIPELINE = "refund-pipeline"


class RefundOrder(TypedDict, total=False):
    """A pipeline's state: the order, then what each refund node wrote."""

    order_id: str
    amount_cents: int
    refund: Any
    again: Any


def build_pipeline() -> StateGraph[Any, Any, Any, Any]:
    """A graph with no model and no tools node: two nodes that each refund the order (one action, one key)."""
    built = StateGraph(RefundOrder)
    order = lambda state: {"order_id": state["order_id"], "amount_cents": state["amount_cents"]}  # noqa: E731
    built.add_node("refund", leased_node(issue_refund, order, output_key="refund"), metadata={"execute_in": "workflow"})
    built.add_node("again", leased_node(issue_refund, order, output_key="again"), metadata={"execute_in": "workflow"})
    built.add_edge(START, "refund")
    built.add_edge("refund", "again")
    built.add_edge("again", END)
    return built


@workflow.defn
class RefundPipelineWorkflow:
    @workflow.run
    async def run(self, order: dict[str, Any]) -> dict[str, Any]:
        state = await run_graph(graph(PIPELINE).compile(), order)
        return {"refund": state["refund"], "again": state["again"]}
