"""The agent benchmark's models, tools and agents (imported by its workflows through the sandbox).

Each agent asks its scripted model for ``calls`` tool calls, one per turn, then for a final answer;
the plain side's tool is the framework's own way to run a tool as an activity (the OpenAI Agents
SDK's ``activity_as_tool``, Pydantic AI's ``FunctionToolset`` wrapped by ``TemporalDurability``),
the leased side's is agentlease's adapter over :data:`bench.tools.BENCH_TOOL`. Both tools
heartbeat the same three stages; only the lease differs. Workflow code: re-imported in the sandbox.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from agents import Model, ModelResponse, Usage
    from pydantic import BaseModel
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai import FunctionToolset
    from pydantic_ai.durable_exec.temporal import TemporalDurability
    from pydantic_ai.messages import ModelMessage, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.messages import ModelResponse as PydanticResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from temporalio.openai_agents.testing import ResponseBuilders

    from agentlease.pydantic_ai._toolset import LeasedToolset
    from agentlease.tools._context import LeaseHeartbeat
    from bench.tools import BENCH_TOOL, LEASE_TTL, STAGES


class AgentBatch(BaseModel):
    """Input of every benchmark agent: how many tool calls its model asks for."""

    calls: int


@activity.defn(name="bench_plain_tool")
async def bench_plain_tool(index: int) -> str:
    """The plain side's tool: the same three stages as heartbeats, no ledger."""
    ttl = activity.info().heartbeat_timeout or LEASE_TTL
    for stage, reason in STAGES:
        heartbeat = LeaseHeartbeat(
            task_id=f"plain/{index}",
            claim_generation=1,
            stage=stage,
            reason=reason,
            lease_expires_at=datetime.now(UTC) + ttl,
        )
        activity.heartbeat(heartbeat.model_dump(mode="json"))
    return json.dumps({"index": index})


# -- the OpenAI Agents SDK -----------------------------------------------------------------------


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


class CallingModel(Model):
    """Asks for ``calls`` (read from the prompt) tool calls, one per turn, then answers."""

    async def get_response(
        self, system_instructions: Any, input: Any, model_settings: Any, tools: list[Any], *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        calls = json.loads(str(_field(items[0], "content")))["calls"]
        done = sum(_field(item, "type") == "function_call_output" for item in items)
        if done < calls:
            call = ResponseBuilders.tool_call(json.dumps({"index": done}), tools[0].name, call_id=f"call_{done}")
            return ModelResponse(output=call.output, usage=Usage(), response_id=None)
        return ResponseBuilders.output_message(f"made {done} calls")

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


# -- Pydantic AI ---------------------------------------------------------------------------------


def _script(messages: list[ModelMessage], info: AgentInfo) -> PydanticResponse:
    calls = json.loads(str(messages[0].parts[-1].content))["calls"]  # type: ignore[union-attr]
    done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
    if done < calls:
        name = info.function_tools[0].name
        return PydanticResponse(parts=[ToolCallPart(name, {"index": done}, tool_call_id=f"call_{done}")])
    return PydanticResponse(parts=[TextPart(f"made {done} calls")])


_plain_tools = FunctionToolset(id="bench_plain")


@_plain_tools.tool_plain(name="bench_plain")
async def _plain_tool(index: int) -> str:
    """The plain side's tool (run as Pydantic AI's own toolset activity): heartbeats the three stages."""
    return await bench_plain_tool(index)


pydantic_plain_agent = PydanticAgent(
    FunctionModel(_script, model_name="bench-plain"),
    name="bench_plain",
    toolsets=[_plain_tools],
    capabilities=[TemporalDurability()],
)
leased_tools = LeasedToolset([BENCH_TOOL])
pydantic_leased_agent = PydanticAgent(
    FunctionModel(_script, model_name="bench-leased"),
    name="bench_leased",
    toolsets=[leased_tools],
    capabilities=[TemporalDurability()],
)
