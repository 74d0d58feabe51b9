"""Leased tool calls for Pydantic AI agents on Temporal (extra ``agentlease[pydantic-ai]``)::

    agent = Agent(model, name="restock", toolsets=[LeasedToolset([http_get, sql_upsert])],
                  capabilities=[TemporalDurability()])

End the workflow's run with :func:`run_agent`; ``AgentLeasePlugin(...)`` on the worker (``docs/pydantic-ai.md``).
"""

from __future__ import annotations

import importlib.util

if any(importlib.util.find_spec(name) is None for name in ("pydantic_ai",)):  # found, not imported: cheap
    raise ImportError("agentlease.pydantic_ai needs the 'pydantic-ai' extra: pip install 'agentlease[pydantic-ai]'")

from agentlease.pydantic_ai._toolset import DeclaredTool, KeyFunction, LeasedToolset, StepIdFunction, run_agent

__all__ = ["DeclaredTool", "KeyFunction", "LeasedToolset", "StepIdFunction", "run_agent"]
