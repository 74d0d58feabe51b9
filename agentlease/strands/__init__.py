"""Leased tool calls for Strands agents on Temporal (extra ``agentlease[strands]``): ``leased_tool`` for each tool
of a ``TemporalAgent``, ``run_agent`` to run it; ``StrandsPlugin`` and ``AgentLeasePlugin`` on one worker
(``docs/agents.md``). The extra cannot share an environment with ``agentlease[mcp]``: Strands' integration requires
``mcp<2``.
"""

from __future__ import annotations

import importlib.util

if any(importlib.util.find_spec(name) is None for name in ("strands", "temporalio.strands_agents")):
    raise ImportError("agentlease.strands needs the 'strands' extra: pip install 'agentlease[strands]'")

from agentlease.strands._tools import LeasedTool, leased_tool, run_agent

__all__ = ["LeasedTool", "leased_tool", "run_agent"]
