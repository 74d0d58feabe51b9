"""The support agent: a LangGraph graph run durably by Temporal (``LangGraphPlugin``)."""

import json
from datetime import timedelta

from langchain_core.messages import HumanMessage, ToolMessage, convert_to_messages
from langgraph.graph import START, MessagesState, StateGraph
from temporalio import workflow
from temporalio.langgraph import graph

with workflow.unsafe.imports_passed_through():
    from activities import issue_refund, lookup_order
    from model import support_model

TOOLS = {"lookup_order": lookup_order, "issue_refund": issue_refund}
NODE = {"start_to_close_timeout": timedelta(seconds=60)}


async def run_tools(state: MessagesState) -> dict[str, list[ToolMessage]]:
    """The tools node: run each tool call of the model's last message."""
    calls = convert_to_messages(state["messages"][-1:])[0].tool_calls
    told = [ToolMessage(json.dumps(await TOOLS[c["name"]](**c["args"])), tool_call_id=c["id"]) for c in calls]
    return {"messages": told}


async def route(state: MessagesState) -> str:
    """After the model: its tool calls, or the end."""
    return "tools" if convert_to_messages(state["messages"][-1:])[0].tool_calls else "__end__"


def support_graph() -> StateGraph:
    agent = StateGraph(MessagesState)
    agent.add_node("agent", support_model, metadata={"execute_in": "activity", **NODE})
    agent.add_node("tools", run_tools, metadata={"execute_in": "activity", **NODE})
    agent.add_edge(START, "agent")
    agent.add_conditional_edges("agent", route)
    agent.add_edge("tools", "agent")
    return agent


@workflow.defn
class SupportAgentWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        state = await graph("support").compile().ainvoke({"messages": [HumanMessage(prompt)]})
        return str(state["messages"][-1].content)
