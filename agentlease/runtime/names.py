"""Names agentlease gives things in Temporal (workflow and activity types, queries, updates, signals), read by
every side from here; tool activities are named after their tool."""

from __future__ import annotations

AGENT_RUN_WORKFLOW = "AgentRunWorkflow"
"""Workflow type of an agent run made from a plan (``agentlease.workflow._plan``)."""

DESCRIBE_TOOLS = "agentlease.describe_tools"
"""Local activity that returns the worker's tool catalog."""

DESCRIBE_RUN = "agentlease.describe_run"
"""Local activity that returns the worker's tool catalog and a new progress secret, ``{"tools": [...],
"progress_secret": "..."}``: one local activity where a run needs both (``docs/operator-views.md``)."""

RESERVED_PREFIX = "agentlease."
"""The prefix of agentlease's own activity and signal names: no tool is named with it."""

APPLY_DECISION = "agentlease.apply_decision"
"""Activity that writes an operator's decision to the ledger."""

STATUS_QUERY = "status"
"""Query answering a run's :class:`~agentlease.records.RunStatus`."""

SUBMIT_UPDATE = "submit"
"""Update adding a tool call to an open ``AgentRunWorkflow``."""

CLOSE_SIGNAL = "close"
"""Signal telling an open ``AgentRunWorkflow`` that no more tool calls come."""

LEASE_PROGRESS_SIGNAL = "agentlease.lease_progress"
"""Signal a leased activity sends its own run on claim and stage changes (a ``LeaseProgress``)."""

DECIDE_SIGNAL = "decide"
"""Signal carrying an operator decision, for clients that only signal (``docs/operator-views.md``)."""

RECORD_REFUSAL = "agentlease.record_refusal"
"""Activity that writes a refused decision signal to the task's evidence trail."""
