"""Agents on the OpenAI Agents SDK whose tool calls are leased, on the real dev server.

The agent is the example's restock assistant (:mod:`agentlease.demo.agents.openai_agent`): a workflow run by
``temporalio.openai_agents`` with its scripted model (no API key), served by one worker that carries
``AgentLeasePlugin`` and, from the client, ``OpenAIAgentsPlugin``; its tools call the demo's real
downstream systems (file server, SQL table, publishing service, SMTP server). Operators decide with
the ``agentlease`` console script, as a user does.

Every agent run here is replayed afterwards, with the OpenAI plugin, without a non-determinism
error; histories committed under ``tests/histories/openai_*.json`` replay too. Record them anew
after a deliberate change of the workflow with
``AGENTLEASE_RECORD_HISTORIES=1 pytest tests/integration/test_openai_agents.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio.openai_agents", reason="needs the openai-agents extra")

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer

from agentlease.demo import mail, publishing
from agentlease.demo.agents import openai_agent as example
from agentlease.demo.agents import scripted_prompt
from agentlease.demo.agents.openai_agent import AgentRequest, RestockAgent
from agentlease.demo.downstream import TARGET_TABLES, Downstream, running_downstream
from agentlease.enums import EventKind, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, RunStatus, TaskRecord
from agentlease.runtime.names import STATUS_QUERY
from agentlease.runtime.temporal import connect
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.runner import Cli
from tests.eventually import assert_eventually
from tests.integration.openai_workflows import CallerIdsAgent, KeyedNotesAgent
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(180)

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
RECORD = os.environ.get("AGENTLEASE_RECORD_HISTORIES") == "1"
HISTORY_PREFIX = "openai_"


@pytest.fixture(autouse=True, scope="module")
def _no_trace_export() -> Iterator[None]:
    """The scripted model has no API key: the SDK's trace exporter would only complain."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
        yield


@dataclass
class Stack:
    """A running agent stack: its settings, a client with the OpenAI plugin, the ledger, the downstreams."""

    settings: AgentLeaseSettings
    client: Client
    ledger: Ledger
    downstream: Downstream
    cli: Cli

    async def start(
        self, name: str, *turns: list[dict[str, Any]], agent: Any = RestockAgent
    ) -> WorkflowHandle[Any, str]:
        run_id = f"oa-{name}-{uuid.uuid4().hex[:8]}"
        request = AgentRequest(prompt=scripted_prompt(name, *turns))
        return await self.client.start_workflow(agent.run, request, id=run_id, task_queue=self.settings.task_queue)

    async def tasks(self, run_id: str) -> dict[str, TaskRecord]:
        return {record.step_id: record for record in await self.ledger.list_tasks(run_id)}

    def agentlease(self, *args: str) -> Any:
        """Run the console script (in a thread: the worker shares this event loop)."""
        env = {
            "AGENTLEASE_TEMPORAL_ADDRESS": self.settings.temporal_address,
            "AGENTLEASE_LEDGER_URL": self.settings.ledger_url,
        }
        return asyncio.to_thread(self.cli, *args, env=env)


@pytest.fixture
async def stack(settings: AgentLeaseSettings, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_downstream(tmp_path / "downstream") as downstream:
        settings = settings.model_copy(
            update={
                "tool_modules": [],
                "workflow_modules": ["tests.integration.openai_workflows"],
                "http_base_url": downstream.http_base_url,
                "sql_target_url": downstream.sql_target_url,
                "sql_allowed_tables": list(TARGET_TABLES),
                "publish_base_url": downstream.publish_base_url,
                "smtp_host": downstream.smtp_host,
                "smtp_port": downstream.smtp_port,
            }
        )
        async with opened_ledger(settings) as ledger, example.running_agent_worker(settings, identity="agent-worker"):
            client = await connect(example.agent_settings(settings))
            (tmp_path / "cli").mkdir()
            yield Stack(settings, client, ledger, downstream, Cli(cwd=tmp_path / "cli", data_dir=tmp_path / "data"))


def replayer() -> Replayer:
    """A replayer as a deployed worker replays: the OpenAI plugin (converter, sandbox, runner) and the workflow."""
    return Replayer(workflows=[RestockAgent, KeyedNotesAgent], plugins=[example.scripted_model_plugin()])


async def assert_replays(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """The run's history replays without a non-determinism error; recorded with AGENTLEASE_RECORD_HISTORIES=1."""
    history = await handle.fetch_history()
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    if RECORD:
        (HISTORIES / f"{HISTORY_PREFIX}{name}.json").write_text(history.to_json())


RECORDED = ("restock", "bad_input", "approved", "rejected", "keyed")
"""The committed histories, one per scenario below."""


def test_recorded_openai_histories_exist() -> None:
    assert sorted(p.stem for p in HISTORIES.glob(f"{HISTORY_PREFIX}*.json")) == sorted(
        f"{HISTORY_PREFIX}{name}" for name in RECORDED
    )


@pytest.mark.parametrize("name", RECORDED)
async def test_recorded_openai_histories_replay(name: str) -> None:
    path = HISTORIES / f"{HISTORY_PREFIX}{name}.json"
    history = WorkflowHistory.from_json(f"recorded-{name}", path.read_text())
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_agent_calls_leased_tools_and_answers_with_their_outputs(stack: Stack) -> None:
    """G4, G6: each model tool call is a settled task with a receipt, keyed by the run and the model's call id;
    the final answer carries what the tools returned; the downstreams hold one effect each."""
    handle = await stack.client.start_workflow(
        RestockAgent.run,
        AgentRequest(prompt=example.restock_prompt("A-1002", 25)),
        id=f"oa-restock-{uuid.uuid4().hex[:8]}",
        task_queue=stack.settings.task_queue,
    )
    answer = await asyncio.wait_for(handle.result(), timeout=120)
    run_id = handle.id

    tasks = await stack.tasks(run_id)
    assert sorted(tasks) == ["http_get-call_0_0", "post_note-call_1_1", "sql_upsert-call_1_0"], tasks
    for step_id, record in tasks.items():
        assert (record.status, record.claim_generation) == (TaskStatus.SETTLED, 1), record
        assert record.receipt is not None, record
        assert record.idempotency_key == f"{run_id}:{step_id}"
    note = tasks["post_note-call_1_1"].receipt
    assert note is not None
    post_id = int(note.external_id)

    lines = answer.splitlines()
    assert lines[0] == "scripted model, task: reserve 25 units of A-1002 and tell the team", answer
    outputs = {line.split(": ", 1)[0]: json.loads(line.split(": ", 1)[1]) for line in lines[1:]}
    assert outputs["- http_get"]["status_code"] == 200 and "A-1002" in outputs["- http_get"]["preview"]
    assert outputs["- sql_upsert"] == {"record_key": "reservation:A-1002", "written": True}
    assert outputs["- post_note"] == {"post_id": post_id, "url": f"/posts/{post_id}", "written": True}
    key = tasks["post_note-call_1_1"].idempotency_key
    assert await publishing.count_publications(stack.downstream.publish_database_url, key) == 1

    status = await handle.query(STATUS_QUERY, result_type=RunStatus)
    assert (status.status.value, status.closed) == ("completed", True)
    await assert_replays(handle, "restock")


async def test_bad_input_comes_back_to_the_model_and_the_agent_recovers(stack: Stack) -> None:
    """Arguments that fail the tool's model, arguments that are not JSON and a tool the model made up:
    each gets one clear error line back, nothing is recorded for it, no workflow task fails, and the
    agent's next call settles on the same worker."""
    handle = await stack.start(
        "bad_input",
        [
            {"tool": "http_get", "arguments": {"url": ""}},
            {"tool": "http_get", "arguments": "{not json"},
            {"tool": "no_such_tool", "arguments": {}},
        ],
        [{"tool": "http_get", "arguments": {"url": "files/runbook.md"}}],
    )
    answer = await asyncio.wait_for(handle.result(), timeout=120)
    lines = answer.splitlines()[1:]
    refused = "- http_get: error: invalid arguments for http_get, nothing was run"
    assert lines[0] == f"{refused}: url: String should have at least 1 character", answer
    assert lines[1].startswith(f"{refused}: Invalid JSON"), answer
    assert "no_such_tool" in lines[2] and "not found" in lines[2], answer
    assert json.loads(lines[3].removeprefix("- http_get: "))["status_code"] == 200, answer

    tasks = await stack.tasks(handle.id)
    assert [(step, record.status) for step, record in tasks.items()] == [("http_get-call_1_0", TaskStatus.SETTLED)]
    history = await handle.fetch_history()
    failed = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert failed == [], failed
    await assert_replays(handle, "bad_input")


SEND = [{"tool": "smtp_send", "arguments": {"to": ["ops@example.com"], "subject": "restocked", "body": "A-1002"}}]
STEP = "smtp_send-call_0_0"


async def awaiting_approval(stack: Stack, handle: WorkflowHandle[Any, str]) -> None:
    """The unsafe call waits for a person, and ``agentlease waiting`` lists it with the commands that decide."""

    async def parked() -> None:
        record = (await stack.tasks(handle.id)).get(STEP)
        assert record is not None and record.status is TaskStatus.AWAITING_APPROVAL, record

    await assert_eventually(parked, timeout=60, message="smtp_send awaits approval")
    listed = await stack.agentlease("waiting", "--json")
    assert listed.returncode == 0, listed
    waiting = [(t["agent_run_id"], t["step_id"], t["status"]) for t in json.loads(listed.stdout)]
    assert waiting == [(handle.id, STEP, "awaiting_approval")], listed
    shown = await stack.agentlease("waiting")
    assert f"agentlease approve {handle.id} {STEP}" in shown.stdout, shown
    status = await handle.query(STATUS_QUERY, result_type=RunStatus)
    assert status.status.value == "waiting", status


async def test_unsafe_tool_waits_for_approval_and_runs_once(stack: Stack) -> None:
    """G7: an unsafe call waits for ``agentlease approve``, then runs exactly once."""
    handle = await stack.start("approved", SEND)
    await awaiting_approval(stack, handle)
    assert await mail.received_messages(stack.downstream.mail_database_url) == []

    approved = await stack.agentlease("approve", handle.id, STEP, "--by", "alice", "--reason", "ticket OPS-12")
    assert approved.returncode == 0, approved
    answer = await asyncio.wait_for(handle.result(), timeout=120)

    received = await mail.received_messages(stack.downstream.mail_database_url)
    assert [m.subject for m in received] == ["restocked"], received
    output = json.loads(answer.splitlines()[1].removeprefix("- smtp_send: "))
    assert output["message_id"] == received[0].message_id, answer
    record = (await stack.tasks(handle.id))[STEP]
    assert (record.status, record.attempts) == (TaskStatus.SETTLED, 1), record
    await assert_replays(handle, "approved")


async def test_rejected_call_never_runs_and_the_model_is_told(stack: Stack) -> None:
    """A rejected call never runs (no claim, no mail); the model reads who refused it and why."""
    handle = await stack.start("rejected", SEND)
    await awaiting_approval(stack, handle)

    rejected = await stack.agentlease("reject", handle.id, STEP, "--by", "bob", "--reason", "wrong recipient")
    assert rejected.returncode == 0, rejected
    answer = await asyncio.wait_for(handle.result(), timeout=120)

    assert answer.splitlines()[1] == (
        "- smtp_send: error: smtp_send was refused by an operator: it did not run and will not run"
        " (rejected by bob: wrong recipient)"
    )
    assert await mail.received_messages(stack.downstream.mail_database_url) == []
    events = await stack.ledger.events(f"{handle.id}/{STEP}")
    assert [e.kind for e in events] == [EventKind.AWAITING_APPROVAL, EventKind.REJECTED], events
    await assert_replays(handle, "rejected")


async def test_one_worker_serves_agents_and_plans(stack: Stack) -> None:
    """One worker with AgentLeasePlugin and (from the client) OpenAIAgentsPlugin runs an agent and a plan
    side by side; the plan's client is the agent's, with the SDK's converter."""
    plan = AgentRunPlan(
        agent_run_id=f"oa-plan-{uuid.uuid4().hex[:8]}",
        steps=[PlanStep(step_id="fetch", tool="http_get", arguments={"url": "files/inventory.csv"})],
    )
    planned = await stack.client.start_workflow(
        AgentRunWorkflow.run, plan, id=f"{plan.agent_run_id}", task_queue=stack.settings.task_queue
    )
    agent = await stack.start("together", [{"tool": "http_get", "arguments": {"url": "files/runbook.md"}}])
    run, answer = await asyncio.wait_for(asyncio.gather(planned.result(), agent.result()), timeout=120)

    assert [(t.step_id, t.status.value) for t in run.tasks] == [("fetch", "settled")], run
    assert json.loads(answer.splitlines()[1].removeprefix("- http_get: "))["status_code"] == 200, answer
    claims = [e for run_id in (planned.id, agent.id) for e in await stack.ledger.events(agent_run_id=run_id)]
    assert {e.lease_owner for e in claims if e.kind is EventKind.CLAIMED} == {"agent-worker"}, claims


async def test_a_key_over_the_arguments_keeps_an_action_unique_across_call_ids(stack: Stack) -> None:
    """G4, G6 with ``key=``: two calls with different call ids (as after a workflow reset) publish the
    same note; the second is not run, it settles from the first's receipt, which the model reads."""
    note = {"slug": "restock-b-2040", "title": "Restock: B-2040", "body": "40 units of B-2040 reserved."}
    turn = [{"tool": "post_note", "arguments": note}]
    handle = await stack.start("keyed", turn, turn, agent=KeyedNotesAgent)
    answer = await asyncio.wait_for(handle.result(), timeout=120)

    first, again = (json.loads(line.removeprefix("- post_note: ")) for line in answer.splitlines()[1:])
    assert first["written"] is True, answer
    assert again["settled"] is True and again["receipt"]["external_id"] == str(first["post_id"]), answer
    tasks = await stack.tasks(handle.id)
    assert [(t.step_id, t.idempotency_key, t.status) for t in tasks.values()] == [
        ("post_note-call_0_0", f"{handle.id}:note:restock-b-2040", TaskStatus.SETTLED),
        ("post_note-call_1_0", f"{handle.id}:note:restock-b-2040", TaskStatus.SETTLED),
    ], tasks
    assert (
        await publishing.count_publications(stack.downstream.publish_database_url, f"{handle.id}:note:restock-b-2040")
        == 1
    )
    claims = [e for e in await stack.ledger.events(agent_run_id=handle.id) if e.kind is EventKind.CLAIMED]
    assert len(claims) == 2, claims
    await assert_replays(handle, "keyed")


async def test_step_ids_and_keys_of_the_callers_functions_that_cannot_be_used_come_back_to_the_model(
    stack: Stack,
) -> None:
    """A step id the caller's function makes twice, and a key that is not a valid key: the model reads why
    the call was not run, nothing is recorded for it, and the run completes."""
    fetch = {"url": "files/runbook.md"}
    handle = await stack.start(
        "caller_ids",
        [{"tool": "fetch_once", "arguments": fetch}],
        [{"tool": "fetch_once", "arguments": fetch}, {"tool": "fetch_unkeyed", "arguments": fetch}],
        agent=CallerIdsAgent,
    )
    answer = await asyncio.wait_for(handle.result(), timeout=120)
    first, again, unkeyed = answer.splitlines()[1:]
    assert json.loads(first.removeprefix("- fetch_once: "))["status_code"] == 200, answer
    assert again == "- fetch_once: error: fetch_once was not run: step id 'fetch' is already used in this run"
    assert unkeyed == (
        "- fetch_unkeyed: error: fetch_unkeyed was not run: idempotency_key: String should have at least 1 character"
    )
    assert [(t.step_id, t.status) for t in (await stack.tasks(handle.id)).values()] == [("fetch", TaskStatus.SETTLED)]


async def test_a_request_that_does_not_validate_fails_the_run_at_once(stack: Stack) -> None:
    run_id = f"oa-bad-request-{uuid.uuid4().hex[:8]}"
    with pytest.raises(WorkflowFailureError) as failed:
        await stack.client.execute_workflow(
            RestockAgent.run, {"prompt": ""}, id=run_id, task_queue=stack.settings.task_queue
        )
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and (cause.type, cause.non_retryable) == ("InvalidPlan", True)
    assert cause.message == "bad agent request payload: prompt: String should have at least 1 character"
