"""An OpenAI Agents agent that refunds orders (issue 18), and a scripted model whose tool-call ids are new on
every model call, as a real model's are (after a ``temporal workflow reset`` the model is asked again and
answers with new ids). Loaded by a worker with ``AGENTLEASE_WORKFLOW_MODULES=tests.integration.refund_openai``
and ``AGENTLEASE_PLUGINS=tests.integration.refund_openai:fresh_ids_model_plugin``."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import ModelResponse
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.testing import TestModelProvider

    from agentlease.demo.agents.openai_agent import MODEL_ACTIVITY_TIMEOUT, AgentRequest, ScriptedModel, run_agent
    from agentlease.openai_agents._tools import leased_tool
    from agentlease.workflow._calls import leased_calls
    from tests.integration import refund_tools


class FreshIdsModel(ScriptedModel):
    """The example's scripted model, with a fresh suffix on every tool-call id it makes."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        response = await super().get_response(*args, **kwargs)
        nonce = uuid.uuid4().hex[:6]
        output = [
            item.model_copy(update={"call_id": f"{call_id}-{nonce}"})
            if (call_id := getattr(item, "call_id", None))
            else item
            for item in response.output
        ]
        return ModelResponse(output=output, usage=response.usage, response_id=response.response_id)


def fresh_ids_model_plugin() -> OpenAIAgentsPlugin:
    """The OpenAI Agents SDK's Temporal plugin serving :class:`FreshIdsModel`."""
    return OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=MODEL_ACTIVITY_TIMEOUT),
        model_provider=TestModelProvider(FreshIdsModel()),
    )


@workflow.defn
class RefundAgent:
    """Refunds what the model asks for with ``issue_refund``; returns the model's final answer."""

    @workflow.init
    def __init__(self, request: AgentRequest | dict[str, Any]) -> None:
        self._calls = leased_calls()

    @workflow.run
    async def run(self, request: AgentRequest | dict[str, Any]) -> str:
        return await run_agent(request, [leased_tool(refund_tools.issue_refund)], name="refund-agent")
