"""A scripted stand-in for a real model, so that the example runs offline (no API key): the graph's model node.

Turn 1 looks up the order named in the prompt, turn 2 refunds what it cost, turn 3 answers. For a real
model, call it here instead (``ChatOpenAI(...).bind_tools([...]).ainvoke(messages)``).
"""

import json
import re
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage, convert_to_messages
from langgraph.graph import MessagesState


async def support_model(state: MessagesState) -> dict[str, list[AIMessage]]:
    """The next turn, worked out from the conversation so far (messages arrive as dicts in an activity)."""
    messages = convert_to_messages(state["messages"])
    order = re.search(r"order (\S+)", str(messages[0].content))
    order_id = order[1] if order else "A-1001"
    returns = [message for message in messages if isinstance(message, ToolMessage)]
    if not returns:
        call = {"name": "lookup_order", "args": {"order_id": order_id}, "id": "lookup-1"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    if len(returns) == 1:
        looked_up: Any = json.loads(str(returns[0].content))  # what lookup_order returned
        amount = looked_up.get("amount_cents", 0) if isinstance(looked_up, dict) else 0
        call = {"name": "issue_refund", "args": {"order_id": order_id, "amount_cents": amount}, "id": "refund-1"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    return {"messages": [AIMessage(content=f"Refunded order {order_id}: {returns[-1].content}")]}
