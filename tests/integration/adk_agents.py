"""A Google ADK refunds agent on Temporal for the tests: a scripted model (registered with ADK's model registry,
run by ``TemporalModel`` as an activity) and leased tools.

The model asks for the refunds its prompt lists (``refund A-1 500; refund A-2 700``) in one turn, then answers
with what each call told it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from google.adk import Agent
    from google.adk.models import BaseLlm, LLMRegistry
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import InMemoryRunner
    from google.genai import types
    from temporalio.google_adk import TemporalModel

    from agentlease.google_adk import leased_tool, run_agent
    from tests.integration.file_refunds import issue_refund

MODEL = "scripted-refunds"


class ScriptedRefunds(BaseLlm):
    """The refunds script: the prompt's refunds as function calls, then an answer from their responses."""

    @classmethod
    def supported_models(cls) -> list[str]:
        return [MODEL]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        parts = [part for content in llm_request.contents for part in content.parts or []]
        told = [part.function_response for part in parts if part.function_response is not None]
        if told:
            answer = " | ".join(f"{r.name}: {json.dumps(r.response, sort_keys=True)}" for r in told)
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=answer)]))
            return
        prompt = " ".join(part.text or "" for part in parts)
        calls = [
            types.Part(
                function_call=types.FunctionCall(
                    id=f"call-{n}", name="issue_refund", args={"order_id": order, "amount_cents": int(cents)}
                )
            )
            for n, (order, cents) in enumerate(re.findall(r"refund (\S+) (\d+)", prompt), 1)
        ]
        yield LlmResponse(content=types.Content(role="model", parts=calls))


LLMRegistry.register(ScriptedRefunds)


@workflow.defn
class AdkRefundWorkflow:
    @workflow.run
    async def run(self, prompt: str) -> str:
        agent = Agent(name="refunds", model=TemporalModel(MODEL), tools=[leased_tool(issue_refund)])
        runner = InMemoryRunner(agent=agent, app_name="refunds")
        session = await runner.session_service.create_session(app_name="refunds", user_id="u")
        message = types.Content(role="user", parts=[types.Part(text=prompt)])
        events: list[Any] = await run_agent(runner, user_id="u", session_id=session.id, new_message=message)
        texts = [part.text for e in events if e.content for part in e.content.parts or [] if part.text]
        return texts[-1] if texts else ""
