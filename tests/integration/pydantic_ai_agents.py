"""A Pydantic AI agent whose scripted model makes the tool calls its prompt lists (tests only).

The prompt is JSON (:func:`prompt_for`): a list of turns, each a list of ``[tool, arguments]``,
and optionally ``timeout_s``, a limit the workflow puts around ``agent.run`` (``asyncio.wait_for``;
it then answers ``"timed out"``).
Turn *n* of the model makes the calls of turn *n*; after the last turn it answers with JSON of
every tool result it saw (:func:`seen`): tool, outcome (``success``, ``failed``, ``retried``) and
content (a retry prompt as the model reads it), so a test reads what the model was told. Workers load the workflow with
``AGENTLEASE_WORKFLOW_MODULES=tests.integration.pydantic_ai_agents`` and the tools with
``AGENTLEASE_TOOL_MODULES=tests.integration.tools`` (``tests.acceptance`` agents reuse the script).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent, ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.messages import RetryPromptPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentlease.pydantic_ai._toolset import LeasedToolset, run_agent
    from agentlease.tools.builtin.http_get import http_get
    from agentlease.tools.builtin.smtp_send import smtp_send
    from agentlease.tools.builtin.sql_upsert import sql_upsert
    from tests.integration import tools

Call = tuple[str, dict[str, Any]]


def prompt_for(*turns: list[Call], timeout_s: float | None = None) -> str:
    """The prompt that makes the scripted model call ``turns`` (one list of calls per model turn)."""
    script: dict[str, Any] = {"turns": [[[tool, arguments] for tool, arguments in turn] for turn in turns]}
    if timeout_s is not None:
        script["timeout_s"] = timeout_s
    return json.dumps(script)


def seen(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """Every tool result the model was given, oldest first."""
    found: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                # A retry prompt as the model reads it (the errors and the instruction to fix them).
                content = part.model_response_str() if part.outcome == "retried" else part.content
                found.append({"tool": part.tool_name, "outcome": part.outcome, "content": content})
            elif isinstance(part, RetryPromptPart):
                found.append({"tool": part.tool_name, "outcome": "retried", "content": part.model_response()})
    return found


def follow_prompt(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model: the calls of the current turn, then the JSON of what it saw."""
    first = messages[0]
    assert isinstance(first, ModelRequest)
    prompt = next(str(part.content) for part in first.parts if part.part_kind == "user-prompt")
    turns = json.loads(prompt)["turns"]
    turn = sum(isinstance(message, ModelResponse) for message in messages)
    if turn < len(turns):
        return ModelResponse(parts=[ToolCallPart(tool, arguments) for tool, arguments in turns[turn]])
    return ModelResponse(parts=[TextPart(json.dumps(seen(messages), default=str))])


def upsert_key(tool: str, arguments: dict[str, Any]) -> str | None:
    """An idempotency key from the arguments: one per target row, whatever the model's call id."""
    if tool == "sql_upsert" and arguments.get("record_key"):
        return f"upsert:{arguments['table']}:{arguments['record_key']}"
    return None


TOOLSET = LeasedToolset([http_get, sql_upsert, smtp_send, tools.quick, tools.long_call], key=upsert_key)

scripted_agent = Agent(
    FunctionModel(follow_prompt, model_name="scripted"),
    name="scripted_agent",
    toolsets=[TOOLSET],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name="ScriptedAgentWorkflow")
class ScriptedAgentWorkflow(PydanticAIWorkflow):
    """Runs the scripted agent on a :func:`prompt_for` prompt; returns its answer (JSON of what it saw)."""

    __pydantic_ai_agents__ = [scripted_agent]  # noqa: RUF012  (read by PydanticAIPlugin)

    @workflow.init
    def __init__(self, prompt: str) -> None:
        self.calls = TOOLSET.leased_calls()

    @workflow.run
    async def run(self, prompt: str) -> str:
        limit = json.loads(prompt).get("timeout_s")
        if limit is None:
            return (await run_agent(scripted_agent, prompt)).output
        try:
            return (await asyncio.wait_for(run_agent(scripted_agent, prompt), limit)).output
        except TimeoutError:
            return json.dumps("timed out")
