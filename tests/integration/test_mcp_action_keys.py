"""An MCP tool declared as fully as a Python one, on the real dev server with the test CRM as a process over stdio:
its argument schema comes from the server's recorded ``tools/list`` (:mod:`tests.integration.mcp_recorded`), the
same contact asked twice under two step ids is created once (``action_key``, as ``issue_refund`` in
:mod:`tests.integration.test_action_keys`), and an import above the approval rule waits for a person while one
below runs (as the refund of :mod:`tests.integration.test_approval_rules`). The probe after a kill:
:mod:`tests.acceptance.test_mcp_faults`."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.client import Client

from agentlease.decisions.table import DecisionRequest
from agentlease.enums import EventKind, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.mcp import MCPServer, check_tools, record_server_tools
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.settings import AgentLeaseSettings
from agentlease.tools import ToolRegistry, ToolSpec
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.integration import mcp_recorded
from tests.integration.mcp_crm import REPO, contacts_of, server_env
from tests.integration.test_bound_approvals import waiting_on
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(180)

RECORDED = Path(mcp_recorded.__file__).with_name("crm.tools.json")


def stdio_crm(database_url: str) -> MCPServer:
    return MCPServer.stdio(
        "crm", "python", ["-m", "tests.integration.mcp_crm"], env=server_env(database_url), cwd=str(REPO)
    )


@asynccontextmanager
async def worker(client: Client, settings: AgentLeaseSettings, tools: list[ToolSpec]) -> AsyncIterator[Ledger]:
    async with (
        opened_ledger(settings) as ledger,
        build_worker(client, ledger, ToolRegistry(tools), settings, identity="worker-mcp-keys"),
    ):
        yield ledger


async def test_the_tools_are_declared_from_the_recorded_listing_which_is_what_the_server_lists(tmp_path: Path) -> None:
    server = stdio_crm(f"sqlite:///{tmp_path / 'crm.db'}")
    tools = {spec.name: spec for spec in mcp_recorded.crm_tools(server)}
    recorded = json.loads(RECORDED.read_text())
    listed = {tool["name"]: tool for tool in recorded["tools"]}

    assert list(tools) == ["crm_create_contact", "crm_find_contact", "crm_import_contacts"]  # the named ones only
    create = tools["crm_create_contact"]
    assert create.args_model.model_json_schema() == listed["create_contact"]["inputSchema"]
    assert create.description == "Create a contact in the CRM."
    assert list(create.args_model.model_fields) == ["email", "name"]
    await check_tools(list(tools.values()))  # the live server fits the declaration
    # Recording again gives the committed file: the recording is current.
    again = await record_server_tools(server, tmp_path / "crm.tools.json")
    assert json.loads(again.read_text()) == recorded


async def test_the_same_contact_asked_twice_under_two_step_ids_is_created_once(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'crm.db'}"
    email = f"{uuid.uuid4().hex[:8]}@example.com"
    run_id = f"mcp-keys-{uuid.uuid4().hex[:8]}"
    args = {"name": "Ada", "email": email}
    plan = AgentRunPlan(
        agent_run_id=run_id,
        steps=[PlanStep(step_id=step, tool="crm_create_contact", arguments=args) for step in ("first", "again")],
    )
    async with worker(client, settings, mcp_recorded.crm_tools(stdio_crm(database_url))) as ledger:
        status = await client.execute_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        tasks = await ledger.list_tasks(run_id)
        again = await ledger.events(f"{run_id}/again")

    key = f"{run_id}:contact:{email}"
    assert [(v.step_id, v.idempotency_key, v.settled_by) for v in status.tasks] == [
        ("first", key, None),
        ("again", key, "earlier_receipt"),
    ], status
    assert {t.status for t in tasks} == {TaskStatus.SETTLED} and tasks[0].receipt == tasks[1].receipt, tasks
    assert tasks[0].receipt is not None and tasks[0].receipt.external_id == key  # the guard's readback, by key
    [contact] = await contacts_of(database_url, email)  # one effect
    assert (contact["idempotency_key"], contact["generation"]) == (key, 1)
    assert not [e for e in again if (e.reason or "").startswith("tools/call")], again  # never sent again


async def test_an_import_above_the_rule_waits_for_a_person_and_one_below_runs(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    run_id = f"mcp-rule-{uuid.uuid4().hex[:8]}"
    tool = "crm_import_contacts"
    plan = AgentRunPlan(
        agent_run_id=run_id,
        steps=[
            PlanStep(step_id="small", tool=tool, arguments={"batch": "b1", "steps": 2, "step_s": 0}),
            PlanStep(step_id="large", tool=tool, arguments={"batch": "b2", "steps": 50, "step_s": 0}),
        ],
    )
    async with worker(
        client, settings, mcp_recorded.crm_tools(stdio_crm(f"sqlite:///{tmp_path / 'crm.db'}"))
    ) as ledger:
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        run = await waiting_on(handle, TaskStatus.SETTLED)  # the small import ran without a person
        assert run.tasks[1].status is TaskStatus.AWAITING_APPROVAL, run
        request = DecisionRequest(step_id="large", by="alice", reason="a large import, checked")
        await handle.execute_update("approve", request, result_type=RunStatus)
        done = await asyncio.wait_for(handle.result(), 60)
        small, large = await ledger.events(f"{run_id}/small"), await ledger.events(f"{run_id}/large")

    assert done.status == "completed" and [t.status for t in done.tasks] == [TaskStatus.SETTLED] * 2, done
    assert EventKind.AWAITING_APPROVAL not in [e.kind for e in small], small
    [asked] = [e for e in large if e.kind is EventKind.AWAITING_APPROVAL]
    assert asked.reason == f"{tool} requires approval: steps 50 is above 10 (rule: steps above 10)"
    assert asked.details is not None and asked.details["rule"] == {"field": "steps", "above": 10}, asked
