"""The effect-safety benchmark's Google ADK agent (``temporalio.google_adk``), native and leased.

The scripted model (registered with ADK's model registry, run by ``TemporalModel`` as an activity) reads the
trial's one call from the prompt (:func:`bench.effects_tools.refund_prompt`), then answers with what the tool
returned. ``adk-native`` runs the tool with ``activity_as_tool(refund_activity)`` (the native tools' timeouts);
``adk-leased`` with :func:`agentlease.google_adk.leased_tool`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from google.adk.models import BaseLlm, LLMRegistry
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

MODEL = "scripted-effects"


class ScriptedEffects(BaseLlm):
    """The prompt's one call, then the tool's answer as the final text."""

    @classmethod
    def supported_models(cls) -> list[str]:
        return [MODEL]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        parts = [part for content in llm_request.contents for part in content.parts or []]
        returned = [part.function_response for part in parts if part.function_response is not None]
        if returned:
            text = json.dumps(returned[-1].response, default=str)
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
            return
        prompt = next(part.text for part in parts if part.text)
        [call] = json.loads(prompt)["turns"][0]
        function_call = types.FunctionCall(id="call-1", name=call["tool"], args=call["arguments"])
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=function_call)]))


LLMRegistry.register(ScriptedEffects)
