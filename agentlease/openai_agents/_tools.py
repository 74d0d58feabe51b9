"""Leased tools for the OpenAI Agents SDK on Temporal (workflow code): :func:`leased_tool` and :func:`run_agent`.
Keys, approvals and what the model reads: ``docs/agents.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, FunctionTool, RunConfig, Runner, RunResult, TResponseInputItem
    from agents.exceptions import UserError
    from agents.strict_schema import ensure_strict_json_schema
    from agents.tool_context import ToolContext

    from agentlease.adapters._core import StepIdFunction, adapted, declared, told
    from agentlease.tools._declaration import DeclaredTool
    from agentlease.workflow._calls import CallOutcome, leased_calls

KeyFunction = Callable[[Any], str]
"""``(the validated arguments, an instance of the tool's argument model) -> idempotency key``."""


def leased_tool(
    tool: DeclaredTool,
    *,
    name: str | None = None,
    description: str | None = None,
    step_id: StepIdFunction | None = None,
    key: KeyFunction | None = None,
    strict: bool | None = None,
) -> FunctionTool:
    """An ``agents`` function tool whose calls are leased tool calls of the running workflow (the worker serves
    the tool with :class:`agentlease.plugin.AgentLeasePlugin`). Outside a workflow a ``leased`` tool runs unleased.

    Args:
        tool: a declared tool; its argument model is the JSON schema the model sees.
        name / description: what the model calls it and reads. Default the tool's name and the first
            paragraph of its description.
        step_id: ``(name, tool_call_id) -> step id``, unique in the run and the same on replay. Default
            ``<name>-<tool_call_id>``, ``-2``, ``-3``... appended when a later turn repeats a call id.
        key: ``(validated arguments) -> idempotency key``, over the tool's ``action_key``. Default the
            declared action key, else ``<workflow id>:<step id>``.
        strict: a strict JSON schema. Default: when the argument model allows it (a free ``dict`` does not).

    Returns:
        The tool: its invocation returns the settled output as JSON text, or one ``error:`` line (bad
        arguments, rejected, abandoned, cancelled, failed); outside a workflow, the function's output.

    Raises:
        ConfigurationError: ``tool`` is not a declared tool (an MCP server, say: ``docs/mcp.md``).
    """
    description = description or _first_paragraph(declared(tool, "leased_tool").description)
    shown = adapted(tool, "leased_tool", name=name, description=description, step_id=step_id, key=key)
    schema = shown.schema()
    if strict is None:
        try:
            ensure_strict_json_schema(json.loads(json.dumps(schema)))
            strict = True
        except UserError:
            strict = False

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:  # the SDK passes the call's own context
        reply = await shown.call(arguments, ctx.tool_call_id or "call", exact_step_id=step_id is not None)
        return reply.as_text()

    return FunctionTool(
        name=shown.name,
        description=shown.description,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=strict,
    )


def tool_output(name: str, outcome: CallOutcome) -> str:
    """What the model reads after a leased call: the output as JSON, or one ``error:`` line; a call that settled
    without an output in this run reads ``{"settled": true, "note": ..., "receipt": {...}}`` (``docs/agents.md``)."""
    return told(name, outcome).as_text()


def leased_run_config(**options: Any) -> RunConfig:
    """A ``RunConfig`` (with further ``options``) that tells the model about a tool it made up instead of failing
    the run (the SDK's default raises ``ModelBehaviorError``, whose workflow task then fails on every retry)."""
    return RunConfig(**{"tool_not_found_behavior": "return_error_to_model", **options})


async def run_agent(agent: Agent[Any], input: str | list[TResponseInputItem], **runner_kwargs: Any) -> RunResult:
    """``Runner.run(agent, input, ...)`` with :func:`leased_run_config`, then end the run's leased calls
    (:meth:`~agentlease.workflow.LeasedToolCalls.run_to_end`). Outside a workflow it is ``Runner.run``.

    ``runner_kwargs``: further ``Runner.run`` arguments (a ``run_config`` given is used as it is). Whatever
    ``Runner.run`` raises propagates, after the run's state is recorded as ``failed``.
    """
    run_config = runner_kwargs.pop("run_config", None) or leased_run_config()
    if not workflow.in_workflow():
        return await Runner.run(agent, input, run_config=run_config, **runner_kwargs)
    return await leased_calls().run_to_end(Runner.run, agent, input, run_config=run_config, **runner_kwargs)


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())
