"""Agents on Temporal's framework integrations whose tools are leased (scripted test models, no API key)."""

from __future__ import annotations

from agentlease.settings import AgentLeaseSettings


def with_example(settings: AgentLeaseSettings, *, plugin: str, workflows: str, tools: str) -> AgentLeaseSettings:
    """``settings`` with an example agent's client plugin, workflow module and tool module added (once each)."""
    update = {}
    for name, value in {"plugins": plugin, "workflow_modules": workflows, "tool_modules": tools}.items():
        values = getattr(settings, name)
        update[name] = values if value in values else [*values, value]
    return settings.model_copy(update=update)
