"""The CRM's MCP tools as the fault tests' workers declare them: the test CRM server
(:mod:`tests.integration.mcp_crm`) over streamable HTTP when ``MCP_CRM_URL`` is set, else over stdio
(started per attempt, with ``CRM_DATABASE_URL``, ``EDGE_CONTROL_DIR`` and ``EDGE_LOCK_TIMEOUT_S`` passed on). Loaded
by worker processes with ``AGENTLEASE_TOOL_MODULES=tests.acceptance.mcp_fault_tools``."""

from __future__ import annotations

import os
from datetime import timedelta

from pydantic import BaseModel

from agentlease.mcp import MCPServer, ToolPolicy, mcp_tools
from tests.integration.mcp_crm import REPO

LEASE_TTL = timedelta(seconds=5)
"""Lease TTL (= heartbeat timeout) of the CRM's tools."""


class CreateContact(BaseModel):
    name: str
    email: str


def crm_server() -> MCPServer:
    url = os.environ.get("MCP_CRM_URL")
    if url:
        return MCPServer.http("crm", url)
    env = {name: value for name, value in os.environ.items() if name.startswith(("CRM_", "EDGE_"))}
    return MCPServer.stdio("crm", "python", ["-m", "tests.integration.mcp_crm"], env=env, cwd=str(REPO))


crm_create_contact, crm_import_contacts = mcp_tools(
    crm_server(),
    default=ToolPolicy(lease_ttl=LEASE_TTL, start_to_close=timedelta(minutes=2)),
    tools={
        "create_contact": ToolPolicy(side_effect="fenced", args=CreateContact),
        "import_contacts": ToolPolicy(
            side_effect="idempotent",
            input_schema={
                "type": "object",
                "properties": {"batch": {"type": "string"}, "steps": {"type": "integer"}, "step_s": {"type": "number"}},
                "required": ["batch", "steps", "step_s"],
            },
        ),
    },
    prefix="crm_",
)
