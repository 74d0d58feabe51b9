"""The test CRM's tools (:mod:`tests.integration.mcp_crm`) declared as a team declares them once it has recorded
the server's ``tools/list``: ``crm.tools.json`` beside this module, written by ``record_server_tools``, gives each
tool's argument schema and description; the policies say only what the listing cannot (class, lease, action key,
approval rule, probe)."""

from __future__ import annotations

from datetime import timedelta

from agentlease.mcp import MCPServer, ToolPolicy, mcp_tools
from agentlease.records import ApprovalRule
from agentlease.tools import ToolSpec
from agentlease.tools._probe import Probe

LEASE_TTL = timedelta(seconds=15)
"""Long enough for a stdio server to start on a loaded machine."""

STEPS_RULE = ApprovalRule(field="steps", above=10)
"""An import of more than 10 steps waits for a person."""


def crm_tools(server: MCPServer, *, lease_ttl: timedelta = LEASE_TTL, probe: Probe | None = None) -> list[ToolSpec]:
    """``crm_create_contact`` (fenced, one action per email, ``probe`` asked after an attempt that may have
    acted), ``crm_find_contact`` (read only), ``crm_import_contacts`` (idempotent, :data:`STEPS_RULE`)."""
    return mcp_tools(
        server,
        default=ToolPolicy(lease_ttl=lease_ttl, start_to_close=timedelta(minutes=2)),
        tools={
            "create_contact": ToolPolicy(side_effect="fenced", action_key="contact:{email}", probe=probe),
            "find_contact": ToolPolicy(side_effect="read_only"),
            "import_contacts": ToolPolicy(side_effect="idempotent", requires_approval=STEPS_RULE),
        },
        prefix="crm_",
    )
