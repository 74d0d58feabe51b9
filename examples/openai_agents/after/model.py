"""A scripted stand-in for a real model, so that the example runs offline (no API key).

Turn 1 looks up the order named in the prompt, turn 2 refunds what it cost, turn 3 answers. For a
real model, leave ``model_provider`` out of ``worker.py`` and set ``OPENAI_API_KEY``.
"""

import json
import re
from typing import Any

from agents import Model, ModelResponse
from temporalio.openai_agents.testing import ResponseBuilders


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


class SupportModel(Model):
    """Follows the refund script; each answer is worked out from the conversation so far."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        order = re.search(r"order (\S+)", str(_field(items[0], "content")))
        order_id = order[1] if order else "A-1001"
        outputs = [str(_field(i, "output")) for i in items if _field(i, "type") == "function_call_output"]
        if not outputs:
            return ResponseBuilders.tool_call(json.dumps({"order_id": order_id}), "lookup_order", call_id="call_lookup")
        if len(outputs) == 1:
            amount = re.search(r"amount_cents\W+(\d+)", outputs[0])
            arguments = {"order_id": order_id, "amount_cents": int(amount[1]) if amount else 0}
            return ResponseBuilders.tool_call(json.dumps(arguments), "issue_refund", call_id="call_refund")
        return ResponseBuilders.output_message(f"Refunded order {order_id}: {outputs[-1]}")

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")
