"""Leased MCP calls when the worker dies or pauses, with worker processes and a real MCP server process.

The CRM is :mod:`tests.integration.mcp_crm` (the example's server guarded by ``LeaseGuard``, the
official ``mcp`` SDK) in a SQLite file of the test; the ledger is PostgreSQL; Temporal is the session's
dev server. The CRM holds the first attempt's ``create_contact`` where the test needs it, outside the guard
(:mod:`tests.acceptance.edge_holds`, the contact's email naming the call):

- SIGKILL, through a Pydantic AI agent over stdio: the server applied and stored the call, its answer
  is held; the worker is killed; the retry on another worker (generation 2) gets the stored result
  replayed by key. One contact, the receipt from the readback.
- SIGSTOP, through an OpenAI Agents agent over streamable HTTP: the first attempt's call is held before
  the guard; its worker is stopped past the lease; the second worker takes over and creates the contact;
  the late call of generation 1 reaches the guard and is refused as a stale fencing token.
- A long MCP tool reporting progress keeps its lease past its TTL; killed, it is taken over within TTL
  plus the documented slack.
- SIGKILL, through a plan, over stdio, ``create_contact`` declared with an action key and a probe from the
  recorded listing (:mod:`tests.integration.mcp_recorded.probed`): the server committed the contact, its answer
  is held; the worker is killed; generation 2 asks the probe, which finds the contact, and settles from it
  without calling the tool again (as the Python tool of :mod:`tests.acceptance.test_probe_reconciliation`).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.enums import EventKind, Stage, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep, TaskRecord
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance import edge_holds
from tests.acceptance.fleet import Fleet, Worker, wait_polling
from tests.acceptance.mcp_fault_tools import LEASE_TTL
from tests.acceptance.runner import Cli
from tests.acceptance.test_pause_kill_matrix import WORKER_START_TIMEOUT_S, trail
from tests.acceptance.test_probe_reconciliation import reconciled_by_probe
from tests.eventually import assert_eventually
from tests.integration.mcp_crm import contacts_of, running_http_crm, server_env
from tests.integration.pydantic_ai_agents import prompt_for
from tests.lease_trail import assert_one_valid_lease_at_a_time

pytestmark = pytest.mark.timeout(300)

TOOLS = "tests.acceptance.mcp_fault_tools"
PYDANTIC_AI = ("-m", "agentlease.demo.agents.pydantic_ai_agent")
OPENAI = ("-m", "agentlease.demo.agents.openai_agent")
TAKEOVER_SLACK_S = 3.0
"""How much later than the TTL after its last renewal a killed holder's task may be claimed again
(``docs/ttl.md``: Temporal's heartbeat timeout, its retry and the claim on a loaded machine)."""


@pytest.fixture(scope="module")
def mcp_ledger_url(pg_module_database: Callable[[str], str]) -> str:
    return pg_module_database("ledger")


@dataclass
class Run:
    client: Client
    ledger: Ledger
    fleet: Fleet
    crm_url: str
    hold_dir: Path
    run_id: str
    email: str

    @property
    def queue(self) -> str:
        return f"mcp-{self.run_id}"

    async def worker(self, role: str, program: tuple[str, ...], workflows: str) -> Worker:
        started = self.fleet.start(
            self.queue,
            f"{self.run_id}-{role}",
            slots=4,
            program=Path(sys.executable),
            args=program,
            env={"AGENTLEASE_TOOL_MODULES": TOOLS, "AGENTLEASE_WORKFLOW_MODULES": workflows},
        )
        await wait_polling(self.client, self.queue, started, timeout=WORKER_START_TIMEOUT_S)
        return started

    async def task(self) -> TaskRecord:
        tasks = await self.ledger.list_tasks(self.run_id)
        assert len(tasks) == 1, f"expected the agent's one call, found {tasks}"
        return tasks[0]

    async def events(self) -> list[LeaseEvent]:
        return await self.ledger.events((await self.task()).task_id)

    async def held(self) -> None:
        await assert_eventually(
            lambda: edge_holds.is_held(self.hold_dir, self.email),
            timeout=WORKER_START_TIMEOUT_S,
            message="the CRM holds the first call",
        )

    def resume(self) -> None:
        edge_holds.resume(self.hold_dir, self.email)


@asynccontextmanager
async def mcp_run(
    temporal_address: str, ledger_url: str, tmp_path: Path, crm_env: dict[str, str], email: str = ""
) -> AsyncIterator[Run]:
    (tmp_path / "data").mkdir()
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir(exist_ok=True)
    ledger = Ledger.from_url(ledger_url)
    fleet = Fleet(temporal_address, ledger_url, Cli(cwd=tmp_path, data_dir=tmp_path / "data"), env=crm_env)
    try:
        await upgrade(ledger.database)
        client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
        run_id = f"mcp-{uuid.uuid4().hex[:8]}"
        yield Run(client, ledger, fleet, crm_env["CRM_DATABASE_URL"], hold_dir, run_id, email)
    finally:
        if email:
            edge_holds.resume(hold_dir, email)
        await fleet.stop_all()
        await ledger.close()


async def test_a_worker_killed_after_the_server_applied_create_contact_leaves_one_contact(
    temporal_address: str, mcp_ledger_url: str, tmp_path: Path
) -> None:
    """Pydantic AI agent, stdio: SIGKILL while the applied call's answer is on its way; the retry's call
    with the same key gets the stored result replayed, reads it back, and settles."""
    email = f"{uuid.uuid4().hex[:8]}@example.com"
    crm_env = server_env(f"sqlite:///{tmp_path / 'crm.db'}", control_dir=tmp_path / "hold")
    (tmp_path / "hold").mkdir()
    edge_holds.plan(tmp_path / "hold", email, "answered")
    async with mcp_run(temporal_address, mcp_ledger_url, tmp_path, crm_env, email) as run:
        first = await run.worker("first", PYDANTIC_AI, "tests.acceptance.mcp_pydantic_ai_agent")
        prompt = prompt_for([("crm_create_contact", {"name": "Ada", "email": email})])
        handle = await run.client.start_workflow(
            "McpPydanticAgent", prompt, id=run.run_id, task_queue=run.queue, result_type=str
        )
        await run.held()  # applied and stored at the server; the answer waits
        assert len(await contacts_of(run.crm_url, email)) == 1
        second = await run.worker("second", PYDANTIC_AI, "tests.acceptance.mcp_pydantic_ai_agent")
        first.signal(signal.SIGKILL)
        told = json.loads(await asyncio.wait_for(handle.result(), 120))
        task = await run.task()
        events = await run.events()
        contacts = await contacts_of(run.crm_url, email)

    claims = [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED]
    assert claims == [(1, first.identity), (2, second.identity)], trail(events)
    assert_one_valid_lease_at_a_time(events)
    # One contact: the first attempt's; the retry's call was answered from the stored result.
    assert [(c["idempotency_key"], c["generation"]) for c in contacts] == [(task.idempotency_key, 1)], contacts
    assert (task.status, task.claim_generation, task.lease_owner) == (TaskStatus.SETTLED, 2, second.identity)
    assert task.receipt is not None
    assert (task.receipt.external_system, task.receipt.status) == ("mcp:crm", "applied")
    assert task.receipt.details == {"tool": "create_contact", "generation": 2, "read_back": True, "replayed": True}
    expired = [e for e in events if e.kind is EventKind.EXPIRED and e.claim_generation == 1]
    assert [e.stage for e in expired] == [Stage.EXTERNAL_CALL], trail(events)
    [result] = told
    assert (result["tool"], result["outcome"]) == ("crm_create_contact", "success")
    assert (result["content"]["email"], result["content"]["id"]) == (email, contacts[0]["id"])


async def test_a_holder_paused_past_its_lease_cannot_apply_its_late_call(
    temporal_address: str, mcp_ledger_url: str, tmp_path: Path
) -> None:
    """OpenAI Agents agent, streamable HTTP: the first attempt's call is held before the guard and its
    worker SIGSTOPped; generation 2 creates the contact and settles; the late call of generation 1 is
    refused by the server's guard (stale fencing token)."""
    pytest.importorskip("temporalio.openai_agents", reason="needs the openai-agents extra")
    from agentlease.demo.agents import scripted_prompt
    from agentlease.demo.agents.openai_agent import AgentRequest

    email = f"{uuid.uuid4().hex[:8]}@example.com"
    hold_dir = tmp_path / "hold"
    crm_env = server_env(f"sqlite:///{tmp_path / 'crm.db'}", control_dir=hold_dir)
    hold_dir.mkdir()
    edge_holds.plan(hold_dir, email, "before")
    async with (
        running_http_crm(crm_env, log=tmp_path / "crm.log") as url,
        mcp_run(temporal_address, mcp_ledger_url, tmp_path, {**crm_env, "MCP_CRM_URL": url}, email) as run,
    ):
        first = await run.worker("first", OPENAI, "tests.acceptance.mcp_openai_agent")
        prompt = scripted_prompt(
            f"add {email}", [{"tool": "crm_create_contact", "arguments": {"name": "Ada", "email": email}}]
        )
        handle = await run.client.start_workflow(
            "McpOpenAIAgent", AgentRequest(prompt=prompt), id=run.run_id, task_queue=run.queue, result_type=str
        )
        await run.held()  # generation 1's call is at the server, not yet at the guard
        first.signal(signal.SIGSTOP)
        second = await run.worker("second", OPENAI, "tests.acceptance.mcp_openai_agent")

        async def taken_over() -> None:
            task = await run.task()
            assert (task.status, task.claim_generation) == (TaskStatus.SETTLED, 2), task

        await assert_eventually(taken_over, timeout=WORKER_START_TIMEOUT_S, message="generation 2 settled")
        answer = await asyncio.wait_for(handle.result(), 120)
        run.resume()  # the late call goes on to the guard, the holder still paused

        def answered() -> dict[str, Any]:
            late = [e for e in edge_holds.logged(hold_dir, email) if e["tool"] == "create_contact"]
            assert any(e["token"] == "1" for e in late), (tmp_path / "crm.log").read_text()[-3000:]
            found: dict[str, Any] = next(e for e in late if e["token"] == "1")["data"]
            return found

        refused = await assert_eventually(answered, timeout=60, message="the guard answered the late call")
        first.signal(signal.SIGCONT)  # the holder reads the refusal (or loses its lease at its next renewal)
        task = await run.task()
        events = await run.events()
        contacts = await contacts_of(run.crm_url, email)

    assert (refused["error"], refused["generation"], refused["current_generation"]) == ("stale_fencing_token", 1, 2)
    assert refused["resource"] == f"mcp/create_contact/{task.idempotency_key}"
    # One contact, generation 2's; generation 1's late call wrote nothing.
    assert [(c["idempotency_key"], c["generation"]) for c in contacts] == [(task.idempotency_key, 2)], contacts
    claims = [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED]
    assert claims == [(1, first.identity), (2, second.identity)], trail(events)
    assert_one_valid_lease_at_a_time(events)
    assert (task.status, task.lease_owner) == (TaskStatus.SETTLED, second.identity)
    assert task.receipt is not None and task.receipt.details["generation"] == 2
    assert task.receipt.status == "applied" and task.receipt.details["replayed"] is False
    assert email in answer, answer


async def test_a_long_mcp_tool_keeps_its_lease_and_a_killed_one_is_taken_over_within_ttl_and_slack(
    temporal_address: str, mcp_ledger_url: str, tmp_path: Path
) -> None:
    """``import_contacts`` reports progress for longer than its TTL: the first worker renews while the
    server works; killed mid-import, the task is claimed by the second within TTL plus slack of the
    last renewal, which reran the idempotent import and settled. The second worker starts while the first
    holds the lease (only the retry can reach it), so that a slow start cannot outlast the import."""
    crm_env = server_env(f"sqlite:///{tmp_path / 'crm.db'}")
    steps, step_s = 15, 1.0  # 15 s under a 5 s lease
    async with mcp_run(temporal_address, mcp_ledger_url, tmp_path, crm_env) as run:
        first = await run.worker("first", PYDANTIC_AI, "tests.acceptance.mcp_pydantic_ai_agent")
        prompt = prompt_for([("crm_import_contacts", {"batch": "b1", "steps": steps, "step_s": step_s})])
        handle = await run.client.start_workflow(
            "McpPydanticAgent", prompt, id=run.run_id, task_queue=run.queue, result_type=str
        )

        async def claimed_by_first() -> None:
            task = await run.task()
            assert (task.status, task.lease_owner) == (TaskStatus.RUNNING, first.identity), task

        async def renewed_past_ttl() -> None:
            events = await run.events()
            claimed = next(e for e in events if e.kind is EventKind.CLAIMED)
            waiting = [e for e in events if e.kind is EventKind.RENEWED and "progress" in (e.reason or "")]
            assert waiting and waiting[-1].at - claimed.at > LEASE_TTL, trail(events)

        await assert_eventually(claimed_by_first, timeout=WORKER_START_TIMEOUT_S, interval=0.2)
        second = await run.worker("second", PYDANTIC_AI, "tests.acceptance.mcp_pydantic_ai_agent")
        await assert_eventually(renewed_past_ttl, timeout=WORKER_START_TIMEOUT_S, interval=0.5)
        first.signal(signal.SIGKILL)
        told = json.loads(await asyncio.wait_for(handle.result(), 180))
        events = await run.events()
        task = await run.task()

    claims = [e for e in events if e.kind is EventKind.CLAIMED]
    assert [(e.claim_generation, e.lease_owner) for e in claims] == [(1, first.identity), (2, second.identity)]
    assert_one_valid_lease_at_a_time(events)
    last_renewal = max(e.at for e in events if e.kind is EventKind.RENEWED and e.claim_generation == 1)
    taken_over_after = (claims[1].at - last_renewal).total_seconds()
    assert LEASE_TTL.total_seconds() <= taken_over_after <= LEASE_TTL.total_seconds() + TAKEOVER_SLACK_S, trail(events)
    assert (task.status, task.claim_generation) == (TaskStatus.SETTLED, 2)
    [result] = told
    assert result["content"] == {"batch": "b1", "steps": steps}


async def test_a_worker_killed_after_the_server_committed_a_keyed_contact_settles_through_the_probe(
    temporal_address: str, mcp_ledger_url: str, tmp_path: Path
) -> None:
    """Plan run, stdio: SIGKILL after the server committed the contact, before it answers; generation 2 asks
    ``create_contact``'s probe, which finds the contact with ``find_contact``, and settles from its receipt:
    the tool is not called again, and no person is asked."""
    email = f"{uuid.uuid4().hex[:8]}@example.com"
    crm_env = server_env(f"sqlite:///{tmp_path / 'crm.db'}", control_dir=tmp_path / "hold")
    (tmp_path / "hold").mkdir()
    edge_holds.plan(tmp_path / "hold", email, "committed")
    async with mcp_run(temporal_address, mcp_ledger_url, tmp_path, crm_env, email) as run:

        async def worker(role: str) -> Worker:
            env = {"AGENTLEASE_TOOL_MODULES": "tests.integration.mcp_recorded.probed"}
            started = run.fleet.start(run.queue, f"{run.run_id}-{role}", env=env)
            await wait_polling(run.client, run.queue, started, timeout=WORKER_START_TIMEOUT_S)
            return started

        first = await worker("first")
        step = PlanStep(step_id="contact", tool="crm_create_contact", arguments={"name": "Ada", "email": email})
        plan = AgentRunPlan(agent_run_id=run.run_id, steps=[step])
        handle = await run.client.start_workflow(AgentRunWorkflow.run, plan, id=run.run_id, task_queue=run.queue)
        await run.held()  # committed at the server; the answer waits
        assert len(await contacts_of(run.crm_url, email)) == 1
        second = await worker("second")
        first.signal(signal.SIGKILL)
        done = await asyncio.wait_for(handle.result(), 120)
        task = await run.task()
        events = await run.events()
        contacts = await contacts_of(run.crm_url, email)

    claims = [(e.claim_generation, e.lease_owner) for e in events if e.kind is EventKind.CLAIMED]
    assert claims == [(1, first.identity), (2, second.identity)], trail(events)
    assert_one_valid_lease_at_a_time(events)
    settled = reconciled_by_probe(events)
    assert settled.claim_generation == 2, trail(events)
    assert settled.details is not None and settled.details["evidence"] == {"probe": "happened", "contacts": 1}
    # One contact, generation 1's, under the action's key; generation 2 never called the tool.
    key = f"{run.run_id}:contact:{email}"
    assert [(c["idempotency_key"], c["generation"]) for c in contacts] == [(key, 1)], contacts
    assert not [e for e in events if e.claim_generation == 2 and (e.reason or "").startswith("tools/call")], trail(
        events
    )
    assert (task.idempotency_key, task.status, task.claim_generation) == (key, TaskStatus.SETTLED, 2)
    assert task.receipt is not None
    assert (task.receipt.external_system, task.receipt.external_id, task.receipt.status) == (
        "crm",
        str(contacts[0]["id"]),
        "created",
    )
    assert (done.status, done.tasks[0].settled_by) == ("completed", "probe")
