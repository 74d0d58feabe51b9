"""A scripted stand-in for a real model, so that the example runs offline (no API key).

Turn 1 looks up the order named in the prompt, turn 2 refunds what it cost, turn 3 answers. For a
real model, give the agent in ``workflows.py`` a model name instead (``"openai:gpt-4.1-mini"``).
"""

import json
import re
from typing import Any

from pydantic_ai import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel


def support_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The next turn, worked out from the conversation so far."""
    parts = [part for message in messages if isinstance(message, ModelRequest) for part in message.parts]
    prompt = " ".join(str(part.content) for part in parts if isinstance(part, UserPromptPart))
    order = re.search(r"order (\S+)", prompt)
    order_id = order[1] if order else "A-1001"
    returns = [part for part in parts if isinstance(part, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": order_id})])
    if len(returns) == 1:
        looked_up: Any = returns[0].content  # what lookup_order returned
        amount = looked_up["amount_cents"] if isinstance(looked_up, dict) else 0
        return ModelResponse(parts=[ToolCallPart("issue_refund", {"order_id": order_id, "amount_cents": amount})])
    return ModelResponse(parts=[TextPart(f"Refunded order {order_id}: {json.dumps(returns[-1].content)}")])


MODEL = FunctionModel(support_script, model_name="scripted-support")
