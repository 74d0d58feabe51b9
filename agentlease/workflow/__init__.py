"""Leased tool calls from your own workflow, imported passed through the sandbox::

    with workflow.unsafe.imports_passed_through():
        from agentlease.workflow import call_tool
        import mytools

    @workflow.defn
    class Triage:
        @workflow.run
        async def run(self, ticket: str) -> str:
            done = await call_tool(mytools.open_ticket, {"title": ticket}, step_id="open")
            return "opened" if done.settled else f"not opened: {done.view.status.value}"

The worker needs :class:`agentlease.plugin.AgentLeasePlugin` (``docs/agents.md``, "The plugin").
"""

from __future__ import annotations

from typing import Any

from agentlease.records import ToolInfo
from agentlease.tools._declaration import ToolSpec
from agentlease.workflow._calls import CallOutcome, LeasedCallError, LeasedToolCalls, leased_calls

__all__ = ["CallOutcome", "LeasedCallError", "LeasedToolCalls", "call_tool", "leased_calls"]


async def call_tool(
    tool: ToolSpec | ToolInfo | str,
    arguments: dict[str, Any],
    *,
    step_id: str,
    idempotency_key: str | None = None,
    share_idempotency_key: bool = False,
) -> CallOutcome:
    """Run one leased tool call from workflow code until its task is final (waiting when a person must decide,
    ``docs/decisions.md``); returns how it ended (:class:`~agentlease.workflow._calls.CallOutcome`).

    Args:
        tool: a declared tool, its :class:`~agentlease.records.ToolInfo`, or the name of a tool the worker
            serves (its catalog then learnt once per run).
        arguments: the tool's arguments, checked by its argument model in the activity.
        step_id: unique within the run; 1-128 letters, digits, ``_ . -``.
        idempotency_key: the action's key, scoped to the run (``<workflow id>:<key>``); default
            ``<workflow id>:<step id>``.
        share_idempotency_key: share the key across runs (``shared:<key>``): another run's call with the same
            key, tool and arguments settles from this call's receipt (``docs/security.md``). Default false.

    Raises:
        LeasedCallError: ``step_id`` is already used in this run, ``tool`` is unknown, or the call is
            beyond the limits (a ``ValueError``; ``AgentLeasePlugin`` makes it fail the run).
    """
    info = tool.info() if isinstance(tool, ToolSpec) else tool
    calls = leased_calls([info] if isinstance(info, ToolInfo) else None)
    name = info.name if isinstance(info, ToolInfo) else info
    return await calls.call(
        name, arguments, step_id=step_id, idempotency_key=idempotency_key, share_idempotency_key=share_idempotency_key
    )
