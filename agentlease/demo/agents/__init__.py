"""Agents on Temporal's framework integrations whose tools are leased (scripted test models, no API key)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from agentlease.settings import AgentLeaseSettings


def with_example(settings: AgentLeaseSettings, *, plugin: str, workflows: str, tools: str) -> AgentLeaseSettings:
    """``settings`` with an example agent's client plugin, workflow module and tool module added (once each)."""
    update = {}
    for name, value in {"plugins": plugin, "workflow_modules": workflows, "tool_modules": tools}.items():
        values = getattr(settings, name)
        update[name] = values if value in values else [*values, value]
    return settings.model_copy(update=update)


class ScriptedCall(BaseModel):
    """One tool call of the script: the tool's name and its arguments (a JSON string is sent as is)."""

    tool: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class Script(BaseModel):
    """What the scripted model does: the task, then the tool calls of each turn (a turn's calls run together)."""

    task: str
    turns: list[list[ScriptedCall]]


def scripted_prompt(task: str, *turns: Sequence[ScriptedCall | dict[str, Any]]) -> str:
    """A prompt the scripted model follows: ``task``, then one model turn per element of ``turns``."""
    script = Script(task=task, turns=[[ScriptedCall.model_validate(call) for call in turn] for turn in turns])
    return script.model_dump_json()
