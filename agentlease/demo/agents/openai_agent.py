"""A restock assistant on the OpenAI Agents SDK whose four tool calls are leased, with a scripted model (no API
key) and a worker (``python -m agentlease.demo.agents.openai_agent``). ``docs/agents.md``."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Model, ModelResponse, Tool, Usage
    from pydantic import BaseModel, Field
    from temporalio.exceptions import ApplicationError
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.testing import ResponseBuilders, TestModelProvider
    from temporalio.worker import Worker

    from agentlease import worker as agentlease_worker
    from agentlease.demo.agents import Script, notes, scripted_prompt, with_example
    from agentlease.enums import FailureType, RunState
    from agentlease.openai_agents._tools import leased_tool
    from agentlease.openai_agents._tools import run_agent as run_leased_agent
    from agentlease.settings import AgentLeaseSettings
    from agentlease.tools.builtin.http_get import http_get
    from agentlease.tools.builtin.smtp_send import smtp_send
    from agentlease.tools.builtin.sql_upsert import sql_upsert
    from agentlease.workflow._calls import leased_calls
    from agentlease.workflow._handlers import parse_payload

MODULE = "agentlease.demo.agents.openai_agent"
"""This module's import path (also when it runs as ``python -m``)."""

MODEL_ACTIVITY_TIMEOUT = timedelta(seconds=60)
"""Bound of one model call (the plugin's model activity). Default 60s."""

INSTRUCTIONS = (
    "You help the operations team restock. Read files/inventory.csv with http_get, record reservations "
    "in the inventory table with sql_upsert, publish a note for the team with post_note, and mail people "
    "with smtp_send (an operator approves every mail). When a tool answers with 'error:', say so in your answer."
)


class AgentRequest(BaseModel):
    """Input of an agent run: the ``prompt`` (for the scripted model: :func:`scripted_prompt`), the ``model`` a
    real provider resolves, and the ``max_turns`` of model calls (default 10)."""

    prompt: str = Field(min_length=1)
    model: str | None = None
    max_turns: int = Field(default=10, ge=1, le=100)


async def run_agent(request: AgentRequest | dict[str, Any], tools: Sequence[Tool], *, name: str) -> str:
    """Run one agent with ``tools`` for ``request`` in the current workflow; its final answer. The run's state
    ends ``completed``, ``cancelled`` or ``failed``. ApplicationError: non-retryable ``InvalidPlan``."""
    calls = leased_calls()
    try:
        parsed = parse_payload(AgentRequest, request, "agent request")
    except ValueError as exc:
        calls.end(RunState.FAILED)
        raise ApplicationError(str(exc), type=FailureType.INVALID_PLAN.value, non_retryable=True) from None
    agent: Agent[None] = Agent(name=name, instructions=INSTRUCTIONS, model=parsed.model, tools=list(tools))
    result = await run_leased_agent(agent, parsed.prompt, max_turns=parsed.max_turns)  # ends the run's state
    await workflow.wait_condition(workflow.all_handlers_finished)
    return str(result.final_output)


@workflow.defn
class RestockAgent:
    """The restock assistant: takes an :class:`AgentRequest`, returns the agent's final answer."""

    @workflow.init
    def __init__(self, request: AgentRequest | dict[str, Any]) -> None:
        self._calls = leased_calls()  # the status query and the decision updates answer from the start

    @workflow.run
    async def run(self, request: AgentRequest | dict[str, Any]) -> str:
        tools = [leased_tool(http_get), leased_tool(sql_upsert), leased_tool(notes.post_note), leased_tool(smtp_send)]
        return await run_agent(request, tools, name="restock-assistant")


# -- the scripted model ----------------------------------------------------------------------------


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


class ScriptedModel(Model):
    """A model that follows the script in the prompt (:func:`scripted_prompt`), needing no API key; stateless
    (worked out from the tool outputs the input holds), so a retried model activity answers the same."""

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
        try:
            script = Script.model_validate_json(str(_field(items[0], "content")))
        except ValueError:
            return ResponseBuilders.output_message("scripted model: the prompt holds no script, so no tool was called")
        names = {_field(i, "call_id"): _field(i, "name") for i in items if _field(i, "type") == "function_call"}
        outputs = [i for i in items if _field(i, "type") == "function_call_output"]
        done = 0
        for turn, calls in enumerate(script.turns):
            if done == len(outputs):
                return ModelResponse(
                    output=[
                        ResponseBuilders.tool_call(
                            call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments),
                            call.tool,
                            call_id=f"call_{turn}_{n}",
                            item_id=f"fc_{turn}_{n}",
                        ).output[0]
                        for n, call in enumerate(calls)
                    ],
                    usage=Usage(),
                    response_id=None,
                )
            done += len(calls)
        lines = [f"- {names.get(_field(o, 'call_id'), '?')}: {_field(o, 'output')}" for o in outputs]
        return ResponseBuilders.output_message("\n".join([f"scripted model, task: {script.task}", *lines]))

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


def scripted_model_plugin() -> OpenAIAgentsPlugin:
    """The OpenAI Agents SDK's Temporal plugin serving the scripted model (for a real one leave out the provider)."""
    return OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=MODEL_ACTIVITY_TIMEOUT),
        model_provider=TestModelProvider(ScriptedModel()),
    )


# -- the worker, and one scripted run --------------------------------------------------------------


def agent_settings(settings: AgentLeaseSettings) -> AgentLeaseSettings:
    """``settings`` plus the scripted model's plugin, this module's workflow and the ``post_note`` tool; connect
    with them too (the plugin brings the converter the SDK requires)."""
    return with_example(settings, plugin=f"{MODULE}:scripted_model_plugin", workflows=MODULE, tools=notes.__name__)


@asynccontextmanager
async def running_agent_worker(settings: AgentLeaseSettings, *, identity: str | None = None) -> AsyncIterator[Worker]:
    """A worker serving :class:`RestockAgent`, ``AgentRunWorkflow`` and the tools, until the block exits; raises
    as :func:`agentlease.worker.running_worker`."""
    async with agentlease_worker.running_worker(agent_settings(settings), identity=identity) as running:
        yield running


def restock_prompt(sku: str = "A-1002", reserved: int = 25) -> str:
    """The demo's script: read the inventory, then reserve ``reserved`` units and post a note, together."""
    row = {"sku": sku, "reserved": reserved, "by": "restock-assistant"}
    reserve = {"table": "inventory", "record_key": f"reservation:{sku}", "row": row}
    note = {
        "slug": f"restock-{sku.lower()}",
        "title": f"Restock: {sku}",
        "body": f"{reserved} units of {sku} reserved.",
    }
    return scripted_prompt(
        f"reserve {reserved} units of {sku} and tell the team",
        [{"tool": "http_get", "arguments": {"url": "files/inventory.csv"}}],
        [{"tool": "sql_upsert", "arguments": reserve}, {"tool": "post_note", "arguments": note}],
    )


def main() -> int:
    """``python -m agentlease.demo.agents.openai_agent``: a worker for this agent, settings from ``AGENTLEASE_*``."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # the scripted model has no key to export traces
    return agentlease_worker.main(agent_settings)


if __name__ == "__main__":
    from agentlease.runtime.shutdown import exit_process

    exit_process(main())
