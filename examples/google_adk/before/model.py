"""A scripted stand-in for a real model, so that the example runs offline (no API key).

Turn 1 looks up the order named in the prompt, turn 2 refunds what it cost, turn 3 answers. ADK's model registry
finds it by name in the worker, where ``TemporalModel``'s activity runs it; for a real model, give
``TemporalModel`` a Gemini model name in ``workflows.py`` instead (``"gemini-2.5-flash"``, with ``GOOGLE_API_KEY``).
"""

import json
import re
from collections.abc import AsyncGenerator

from google.adk.models import BaseLlm, LLMRegistry
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

MODEL = "scripted-support"


class SupportModel(BaseLlm):
    """Follows the refund script; each answer is worked out from the conversation so far."""

    @classmethod
    def supported_models(cls) -> list[str]:
        return [MODEL]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        parts = [part for content in llm_request.contents for part in content.parts or []]
        order = re.search(r"order (\S+)", " ".join(part.text or "" for part in parts))
        order_id = order[1] if order else "A-1001"
        returns = [part.function_response for part in parts if part.function_response is not None]
        if not returns:
            call = types.FunctionCall(id="call_lookup", name="lookup_order", args={"order_id": order_id})
        elif len(returns) == 1:
            amount = (returns[0].response or {}).get("amount_cents", 0)
            arguments = {"order_id": order_id, "amount_cents": amount}
            call = types.FunctionCall(id="call_refund", name="issue_refund", args=arguments)
        else:
            answer = f"Refunded order {order_id}: {json.dumps(returns[-1].response)}"
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=answer)]))
            return
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))


LLMRegistry.register(SupportModel)
