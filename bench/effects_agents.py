"""The effect-safety benchmark's agents, models and prompts (imported by its workflows through the sandbox).

Each agent's scripted model calls ``issue_refund`` once (the target and amount are in the prompt,
:func:`bench.effects_tools.refund_prompt`), then answers with what the tool returned. The OpenAI Agents SDK's model is
the scripted one of :mod:`agentlease.demo.agents.openai_agent` (served by the client's plugin); Pydantic
AI's is :func:`_follow` here. The native tools keep their framework's default retry policy
(Temporal's: unlimited attempts, 1 s initial interval, doubling); they get the
``start_to_close_timeout`` of 60 s that Pydantic AI uses by default and a ``heartbeat_timeout`` equal
to the leased tool's lease TTL, so that a dead attempt is found as soon as a lapsed lease is
(without one it would wait out the 60 s). The leased tool keeps agentlease's defaults.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import FunctionToolset
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentlease.pydantic_ai import LeasedToolset
from bench.effects_tools import LEASE_TTL, NATIVE_START_TO_CLOSE, REFUND_TOOL, issue_refund

INSTRUCTIONS = "Issue the refund you are asked for with issue_refund, then say what the service answered."


def _follow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Pydantic AI's scripted model: the prompt's one call, then the tool's answer as the final text."""
    returned = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(json.dumps(returned[-1].content, default=str))])
    prompt = next(str(part.content) for part in messages[0].parts if part.part_kind == "user-prompt")
    [call] = json.loads(prompt)["turns"][0]
    return ModelResponse(parts=[ToolCallPart(call["tool"], call["arguments"])])


_native_tools: FunctionToolset[Any] = FunctionToolset([issue_refund], id="refunds")
pydantic_native_agent = PydanticAgent(
    FunctionModel(_follow, model_name="scripted"),
    name="effects_native",
    toolsets=[_native_tools],
    capabilities=[
        TemporalDurability(
            toolset_activity_config={
                "refunds": {"start_to_close_timeout": NATIVE_START_TO_CLOSE, "heartbeat_timeout": LEASE_TTL}
            }
        )
    ],
)
leased_tools = LeasedToolset([REFUND_TOOL])
pydantic_leased_agent = PydanticAgent(
    FunctionModel(_follow, model_name="scripted"),
    name="effects_leased",
    toolsets=[leased_tools],
    capabilities=[TemporalDurability()],
)

__all__ = [
    "INSTRUCTIONS",
    "leased_tools",
    "pydantic_leased_agent",
    "pydantic_native_agent",
]
