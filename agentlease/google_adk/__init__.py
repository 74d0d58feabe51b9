"""Leased tool calls for Google ADK agents on Temporal (extra ``agentlease[google-adk]``): ``leased_tool`` for each
tool of the agent and ``await run_agent(runner, ...)`` in the workflow, ``GoogleAdkPlugin`` and ``AgentLeasePlugin``
on one worker (``docs/agents.md``).
"""

from __future__ import annotations

import importlib.util


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None  # found, not imported: cheap
    except (ImportError, ValueError):  # no parent package; a module set to None
        return True


if any(_missing(name) for name in ("google.adk", "temporalio.google_adk")):
    raise ImportError("agentlease.google_adk needs the 'google-adk' extra: pip install 'agentlease[google-adk]'")

from agentlease.google_adk._tools import LeasedTool, leased_tool, run_agent  # noqa: E402  (after the check)

__all__ = ["LeasedTool", "leased_tool", "run_agent"]
