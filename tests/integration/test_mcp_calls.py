"""Leased MCP tool calls on the real dev server: a workflow calls the CRM's ``create_contact`` (a real MCP
server process, over stdio and over streamable HTTP) through ``call_tool``; a long tool reporting progress
keeps its lease past its TTL; the declaration is checked against the live ``tools/list``."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import Client

with workflow.unsafe.imports_passed_through():
    from agentlease.enums import EventKind, Stage, TaskStatus
    from agentlease.errors import ConfigurationError
    from agentlease.mcp import MCPServer, ToolPolicy, check_tools, mcp_tools
    from agentlease.settings import AgentLeaseSettings
    from agentlease.tools import ToolRegistry, ToolSpec
    from agentlease.worker import build_worker
    from agentlease.workflow import call_tool
    from tests.integration.mcp_crm import REPO, contacts_of, running_http_crm, server_env
    from tests.integration.test_lease_on_temporal import opened_ledger, renewed_stages

pytestmark = pytest.mark.timeout(180)

LEASE_TTL = timedelta(seconds=3)
"""The lease of the long tool that outlasts it by reporting progress."""
CALL_TTL = timedelta(seconds=15)
"""The lease of a call whose point is not the lease: long enough for a stdio server to start on a
loaded machine, so that the call takes one attempt."""


class CreateContact(BaseModel):
    name: str
    email: str


class ImportContacts(BaseModel):
    batch: str
    steps: int
    step_s: float


def crm_tools(server: MCPServer, lease_ttl: timedelta = LEASE_TTL) -> list[ToolSpec]:
    """The CRM's tools as a team declares them: a read-only default, ``create_contact`` fenced."""
    return mcp_tools(
        server,
        default=ToolPolicy(side_effect="read_only", lease_ttl=lease_ttl, start_to_close=timedelta(minutes=1)),
        tools={
            "create_contact": ToolPolicy(side_effect="fenced", args=CreateContact),
            "import_contacts": ToolPolicy(side_effect="idempotent", args=ImportContacts),
        },
        prefix="crm_",
    )


@workflow.defn
class CallOneTool:
    """Calls one tool by name through ``call_tool``; returns how the call ended."""

    @workflow.run
    async def run(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        done = await call_tool(tool, arguments, step_id="call")
        return {"status": done.view.status.value, "generation": done.view.claim_generation, "output": done.output}


@asynccontextmanager
async def crm(transport: str, database_url: str) -> AsyncIterator[MCPServer]:
    env = server_env(database_url)
    if transport == "stdio":
        yield MCPServer.stdio("crm", "python", ["-m", "tests.integration.mcp_crm"], env=env, cwd=str(REPO))
    else:
        async with running_http_crm(env) as url:
            yield MCPServer.http("crm", url)


async def run_one(
    client: Client, settings: AgentLeaseSettings, tools: list[ToolSpec], tool: str, arguments: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    run_id = f"mcp-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger:
        worker = build_worker(
            client, ledger, ToolRegistry(tools), settings, identity="worker-M", workflows=[CallOneTool]
        )
        async with worker:
            handle = await client.start_workflow(
                CallOneTool.run, args=[tool, arguments], id=run_id, task_queue=settings.task_queue
            )
            result: dict[str, Any] = await asyncio.wait_for(handle.result(), timeout=120)
    return run_id, result


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
async def test_a_workflow_creates_one_contact_through_a_guarded_mcp_server_and_settles_from_its_readback(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, transport: str
) -> None:
    database_url = f"sqlite:///{tmp_path / 'crm.db'}"
    email = f"{uuid.uuid4().hex[:8]}@example.com"
    async with crm(transport, database_url) as server:
        tools = crm_tools(server, CALL_TTL)
        await check_tools(tools)  # the declaration fits what the server lists
        run_id, result = await run_one(client, settings, tools, "crm_create_contact", {"name": "Ada", "email": email})
        async with opened_ledger(settings) as ledger:
            task = await ledger.get_task(f"{run_id}/call")
            events = await ledger.events(task.task_id)

    assert (result["status"], result["generation"]) == ("settled", 1), result
    assert result["output"]["email"] == email and isinstance(result["output"]["id"], int)
    # One contact, written under the call's key and generation: they travelled in _meta, not as arguments.
    [contact] = await contacts_of(database_url, email)
    assert (contact["idempotency_key"], contact["generation"], contact["name"]) == (f"{run_id}:call", 1, "Ada")
    # The receipt comes from reading the call back by key at the server (the guard's stored result).
    assert task.status is TaskStatus.SETTLED and task.receipt is not None
    receipt = task.receipt
    assert (receipt.external_system, receipt.external_id, receipt.status) == ("mcp:crm", f"{run_id}:call", "applied")
    assert receipt.details == {
        "tool": "create_contact",
        "generation": 1,
        "read_back": True,
        "replayed": False,
    }
    stages = renewed_stages(events)
    assert stages == [Stage.PREFLIGHT, Stage.EXTERNAL_CALL, Stage.COMMIT, Stage.VERIFY], stages
    external = next(e for e in events if e.stage is Stage.EXTERNAL_CALL)
    assert external.reason == f"tools/call create_contact on crm with key {run_id}:call, generation 1"


async def test_a_long_mcp_tool_reporting_progress_keeps_its_lease_past_its_ttl(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'crm.db'}"
    steps, step_s = 6, 1.0  # 6 s of work under a 3 s lease
    async with crm("stdio", database_url) as server:
        run_id, result = await run_one(
            client,
            settings,
            crm_tools(server),
            "crm_import_contacts",
            {"batch": "b1", "steps": steps, "step_s": step_s},
        )
        async with opened_ledger(settings) as ledger:
            task = await ledger.get_task(f"{run_id}/call")
            events = await ledger.events(task.task_id)

    # One attempt, one claim: the lease was renewed while the server worked, never lost.
    assert (result["status"], result["generation"], result["output"]) == (
        "settled",
        1,
        {"batch": "b1", "steps": steps},
    )
    assert task.attempts == 1
    assert [e.kind for e in events if e.kind in (EventKind.CLAIMED, EventKind.EXPIRED, EventKind.LEASE_LOST)] == [
        EventKind.CLAIMED
    ]
    waiting = [e for e in events if e.kind is EventKind.RENEWED and (e.reason or "").startswith("awaiting")]
    assert waiting, [e.reason for e in events]
    assert any("progress" in (e.reason or "") and "of b1" in (e.reason or "") for e in waiting), [
        e.reason for e in waiting
    ]
    claimed = next(e for e in events if e.kind is EventKind.CLAIMED)
    settled = next(e for e in events if e.kind is EventKind.SETTLED)
    assert settled.at - claimed.at > LEASE_TTL, (claimed.at, settled.at)
    # While the server worked, no gap between renewals reached the TTL.
    sent = next(e for e in events if e.stage is Stage.EXTERNAL_CALL)
    times = [sent.at, *(e.at for e in waiting), settled.at]
    assert max(b - a for a, b in itertools.pairwise(times)) < LEASE_TTL


async def test_the_worker_check_refuses_a_declaration_the_server_does_not_fit(tmp_path: Path) -> None:
    server = MCPServer.stdio(
        "crm",
        "python",
        ["-m", "tests.integration.mcp_crm"],
        env=server_env(f"sqlite:///{tmp_path}/c.db"),
        cwd=str(REPO),
    )
    declared = mcp_tools(
        server,
        default=ToolPolicy(side_effect="read_only", lease_ttl=LEASE_TTL),
        tools={
            "delete_contact": ToolPolicy(input_schema={"type": "object"}),
            "create_contact": ToolPolicy(args=ImportContacts),
        },
    )
    with pytest.raises(ConfigurationError) as refused:
        await check_tools(declared)
    message = str(refused.value)
    assert "crm lists no tool 'delete_contact'" in message
    assert "crm/create_contact: the server requires ['email', 'name'], which the declared schema lacks" in message
