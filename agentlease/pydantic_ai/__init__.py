"""Leased tool calls for Pydantic AI agents on Temporal (extra ``agentlease[pydantic-ai]``).

::

    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, PydanticAIWorkflow, TemporalDurability
    from agentlease.pydantic_ai import LeasedToolset

    agent = Agent(model, name="restock", toolsets=[LeasedToolset([http_get, sql_upsert])],
                  capabilities=[TemporalDurability()])

The tools are ``@tool`` tools or functions leased as they are (``agentlease.leased``); outside a
workflow the agent still runs, each ``leased`` tool called directly without a lease. End the
workflow's run with :func:`run_agent`. Put ``PydanticAIPlugin()`` on the client and
``AgentLeasePlugin(...)`` on the worker; see
:mod:`agentlease.pydantic_ai._toolset` for keys, approvals and what the model sees.
"""

from __future__ import annotations

import importlib.util

if any(importlib.util.find_spec(name) is None for name in ("pydantic_ai",)):  # found, not imported: cheap
    raise ImportError("agentlease.pydantic_ai needs the 'pydantic-ai' extra: pip install 'agentlease[pydantic-ai]'")

from agentlease.pydantic_ai._toolset import DeclaredTool, KeyFunction, LeasedToolset, StepIdFunction, run_agent

__all__ = ["DeclaredTool", "KeyFunction", "LeasedToolset", "StepIdFunction", "run_agent"]
