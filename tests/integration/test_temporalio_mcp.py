"""Temporal's MCP integration (``temporalio-mcp``) and agentlease's on one worker and one guarded server, on the
real dev server: the documented move of one write from ``TemporalMCPClient.call_tool`` to a leased ``call_tool``
(``docs/mcp.md``). Both register their activities and open their own sessions without meeting; the leased call
sends the key, fencing token and lease in ``_meta``; the same write through ``temporalio.mcp`` sends none, and the
server's ``LeaseGuard`` refuses it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import mcp
    from temporalio.mcp import MCPPlugin, TemporalMCPClient

    from agentlease import AgentLeasePlugin
    from agentlease.enums import TaskStatus
    from agentlease.mcp import MCPServer
    from agentlease.settings import AgentLeaseSettings
    from agentlease.workflow import call_tool
    from tests.integration.mcp_crm import contacts_of, running_http_crm, server_env
    from tests.integration.test_lease_on_temporal import opened_ledger
    from tests.integration.test_mcp_calls import CALL_TTL, crm_tools

pytestmark = pytest.mark.timeout(180)


@workflow.defn
class BothClients:
    """Lists the CRM's tools and reads through ``temporalio.mcp``, writes leased; then tries the write unleased."""

    @workflow.run
    async def run(self, email: str) -> dict[str, Any]:
        crm = TemporalMCPClient("crm")
        listed = sorted(tool.name for tool in (await crm.list_tools()).tools)
        done = await call_tool("crm_create_contact", {"name": "Ada", "email": email}, step_id="contact")
        found = await crm.call_tool("find_contact", {"email": email})
        once = TemporalMCPClient("crm", activity_config={"retry_policy": RetryPolicy(maximum_attempts=1)})
        try:
            await once.call_tool("create_contact", {"name": "Eve", "email": f"eve-{email}"})
            refused = ""
        except ActivityError as exc:
            refused = str(exc.cause)
        return {
            "listed": listed,
            "leased": done.view.status.value,
            "found": found.structured_content,
            "refused": refused,
        }


async def test_temporals_mcp_client_and_leased_calls_share_a_worker_and_a_guarded_server(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'crm.db'}"
    email = f"{uuid.uuid4().hex[:8]}@example.com"
    run_id = f"both-{uuid.uuid4().hex[:8]}"
    async with running_http_crm(server_env(database_url)) as url, opened_ledger(settings) as ledger:
        tools = crm_tools(MCPServer.http("crm", url), CALL_TTL)
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[BothClients],
            plugins=[
                MCPPlugin({"crm": lambda: mcp.Client(url)}),
                AgentLeasePlugin(settings=settings, ledger=ledger, tools=tools),
            ],
        )
        async with worker:
            handle = await client.start_workflow(BothClients.run, email, id=run_id, task_queue=settings.task_queue)
            result = await asyncio.wait_for(handle.result(), timeout=120)
        task = await ledger.get_task(f"{run_id}/contact")

    assert {"create_contact", "find_contact"} <= set(result["listed"]), result
    assert result["leased"] == "settled" and task.status is TaskStatus.SETTLED, result
    assert [found["email"] for found in result["found"]["contacts"]] == [email], result
    # The leased write reached the server under its key and generation; the unleased one was refused, not run.
    [contact] = await contacts_of(database_url, email)
    assert (contact["idempotency_key"], contact["generation"]) == (f"{run_id}:contact", 1)
    assert "create_contact is guarded: send io.agentlease/idempotency-key" in result["refused"], result
    assert await contacts_of(database_url, f"eve-{email}") == []
