"""Leased tool calls for LangGraph graphs on Temporal (extra ``agentlease[langgraph]``): ``leased_tools_node`` as
the graph's tools node (``execute_in="workflow"``) or ``leased_tool_messages`` inside your own, ``route_tools``
after the model's node, ``leased_node`` for one side effect of a graph without a tools node, and
``await run_graph(app, input)`` in the workflow; ``LangGraphPlugin`` and ``AgentLeasePlugin`` on one worker
(``docs/agents.md``).
"""

from __future__ import annotations

import importlib.util

if any(importlib.util.find_spec(name) is None for name in ("langgraph", "temporalio.langgraph")):
    raise ImportError("agentlease.langgraph needs the 'langgraph' extra: pip install 'agentlease[langgraph]'")

from agentlease.langgraph._node import leased_node, leased_tool_messages, leased_tools_node, route_tools, run_graph

__all__ = ["leased_node", "leased_tool_messages", "leased_tools_node", "route_tools", "run_graph"]
