"""A scripted stand-in for a real model, so that the example runs offline (no credentials).

Turn 1 looks up the order named in the prompt, turn 2 refunds what it cost, turn 3 answers. ``StrandsPlugin`` runs it
in its model activity, by the name ``workflows.py`` gives ``TemporalAgent``; for a real model, leave ``models=`` out of
``StrandsPlugin(...)`` in ``worker.py`` and ``model=`` out of ``TemporalAgent(...)`` (Amazon Bedrock, with AWS
credentials), or register another Strands model under a name of your own.
"""

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from strands.models.model import Model

MODEL = "scripted-support"


class SupportModel(Model):
    """Follows the refund script; each answer is worked out from the conversation so far."""

    def update_config(self, **model_config: Any) -> None:
        return None

    def get_config(self) -> dict[str, Any]:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model answers in text")

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        blocks = [block for message in messages for block in message["content"]]
        order = re.search(r"order (\S+)", " ".join(block.get("text", "") for block in blocks))
        order_id = order[1] if order else "A-1001"
        returns = [json.loads(block["toolResult"]["content"][0]["text"]) for block in blocks if "toolResult" in block]
        yield {"messageStart": {"role": "assistant"}}
        if len(returns) == 2:
            yield {"contentBlockDelta": {"delta": {"text": f"Refunded order {order_id}: {json.dumps(returns[-1])}"}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
            return
        if not returns:
            name, arguments = "lookup_order", {"order_id": order_id}
        else:
            name, arguments = "issue_refund", {"order_id": order_id, "amount_cents": returns[0]["amount_cents"]}
        yield {"contentBlockStart": {"start": {"toolUse": {"toolUseId": f"call_{name}", "name": name}}}}
        yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(arguments)}}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use"}}
