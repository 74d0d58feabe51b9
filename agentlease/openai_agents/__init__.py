"""Leased tool calls for agents on the OpenAI Agents SDK (extra ``agentlease[openai-agents]``): ``leased_tool``
for each tool and ``await run_agent(agent, prompt)`` in the workflow, ``AgentLeasePlugin`` on the worker
(``docs/agents.md``).
"""

from __future__ import annotations

import importlib.util

if any(
    importlib.util.find_spec(name) is None for name in ("agents", "temporalio.openai_agents")
):  # found, not imported: cheap
    raise ImportError(
        "agentlease.openai_agents needs the 'openai-agents' extra: pip install 'agentlease[openai-agents]'"
    )

from agentlease.openai_agents._tools import (
    DeclaredTool,
    KeyFunction,
    StepIdFunction,
    leased_run_config,
    leased_tool,
    run_agent,
    tool_output,
)

__all__ = [
    "DeclaredTool",
    "KeyFunction",
    "StepIdFunction",
    "leased_run_config",
    "leased_tool",
    "run_agent",
    "tool_output",
]
