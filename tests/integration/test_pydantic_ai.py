"""Pydantic AI agents whose tool calls are leased, on the real dev server (the ``pydantic-ai`` extra).

Every test runs one worker built the way ``python -m agentlease.demo.agents.pydantic_ai_agent`` builds
it (:func:`agentlease.demo.agents.pydantic_ai_agent.agent_settings`: ``PydanticAIPlugin`` on the client,
``AgentLeasePlugin`` on the worker), against the demo's real downstream systems (file server, SQL
table, publishing service, SMTP server). The agents' models are scripted (``FunctionModel``): the
restock example, and :mod:`tests.integration.pydantic_ai_agents`, which makes the calls its prompt
lists and answers with what it was told.

Each scenario's history is replayed (``Replayer`` with ``PydanticAIPlugin``) right after the run;
the committed histories ``tests/histories/pydantic_ai_*.json`` are replayed too. Record them anew
with ``AGENTLEASE_RECORD_HISTORIES=1 pytest tests/integration/test_pydantic_ai.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from sqlalchemy import MetaData, select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.exceptions import CancelledError
from temporalio.worker import Replayer

from agentlease.decisions.table import CancelRequest
from agentlease.demo import mail, publishing
from agentlease.demo.agents.pydantic_ai_agent import WORKFLOW, RestockAgentWorkflow, agent_settings, run_scripted_agent
from agentlease.demo.downstream import TARGET_TABLES, Downstream, running_downstream
from agentlease.enums import EventKind, Stage, TaskStatus
from agentlease.ledger.engine import create_async_database_engine
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, RunStatus, TaskRecord
from agentlease.runtime.names import STATUS_QUERY
from agentlease.runtime.temporal import connect
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.tools.builtin.sql_upsert import records_table
from agentlease.worker import build_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.runner import Cli
from tests.eventually import assert_eventually
from tests.integration.pydantic_ai_agents import Call, ScriptedAgentWorkflow, prompt_for
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(240)

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
HISTORY_PREFIX = "pydantic_ai_"
RECORD = os.environ.get("AGENTLEASE_RECORD_HISTORIES") == "1"
SCENARIOS = ("restock", "retry_prompts", "decisions", "cancelled")
"""The runs whose histories are committed (``tests/histories/pydantic_ai_<name>.json``)."""

TEST_AGENTS = "tests.integration.pydantic_ai_agents"


@dataclass(frozen=True)
class Stack:
    """A worker serving the agents and the plans, its ledger, the downstream systems, the CLI."""

    settings: AgentLeaseSettings
    ledger: Ledger
    downstream: Downstream
    cli: Cli

    def cli_env(self) -> dict[str, str]:
        return {
            "AGENTLEASE_TEMPORAL_ADDRESS": self.settings.temporal_address,
            "AGENTLEASE_TASK_QUEUE": self.settings.task_queue,
            "AGENTLEASE_LEDGER_URL": self.settings.ledger_url,
        }

    async def tasks(self, run_id: str) -> list[TaskRecord]:
        return await self.ledger.list_tasks(run_id)

    async def rows(self, table: str = "inventory") -> list[dict[str, Any]]:
        engine = create_async_database_engine(self.downstream.sql_target_url, pool_size=1)
        try:
            async with engine.connect() as conn:
                result = await conn.execute(select(records_table(table, MetaData())))
                return [dict(row._mapping) for row in result]
        finally:
            await engine.dispose()


@asynccontextmanager
async def agent_stack(settings: AgentLeaseSettings, tmp_path: Path) -> AsyncIterator[Stack]:
    """The downstream systems and one worker for both agents and ``AgentRunWorkflow``."""
    async with running_downstream(tmp_path / "downstream") as downstream:
        configured = agent_settings(
            settings.model_copy(
                update={
                    "workflow_modules": [TEST_AGENTS],
                    "http_base_url": downstream.http_base_url,
                    "sql_target_url": downstream.sql_target_url,
                    "sql_allowed_tables": list(TARGET_TABLES),
                    "publish_base_url": downstream.publish_base_url,
                    "smtp_host": downstream.smtp_host,
                    "smtp_port": downstream.smtp_port,
                }
            )
        )
        async with opened_ledger(configured) as ledger:
            client = await connect(configured, identity="pydantic-ai-worker")  # PydanticAIPlugin from the settings
            registry = load_registry(configured.tool_modules)
            async with build_worker(client, ledger, registry, configured, identity="pydantic-ai-worker"):
                yield Stack(configured, ledger, downstream, Cli(cwd=tmp_path, data_dir=tmp_path / "cli"))


def replayer() -> Replayer:
    return Replayer(workflows=[RestockAgentWorkflow, ScriptedAgentWorkflow], plugins=[PydanticAIPlugin()])


async def replays(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """The run's history replays without a non-determinism error (and is recorded when asked)."""
    history = await handle.fetch_history()
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    if RECORD:
        (HISTORIES / f"{HISTORY_PREFIX}{name}.json").write_text(history.to_json())


async def start_scripted(client: Client, stack: Stack, prompt: str) -> WorkflowHandle[Any, str]:
    run_id = f"scripted-{uuid.uuid4().hex[:8]}"
    return await client.start_workflow(
        "ScriptedAgentWorkflow", prompt, id=run_id, task_queue=stack.settings.task_queue, result_type=str
    )


async def one_task_in(stack: Stack, run_id: str, status: TaskStatus) -> TaskRecord:
    """Wait until the run has exactly one task, in ``status``; return it."""

    async def check() -> TaskRecord:
        tasks = await stack.tasks(run_id)
        assert [t.status for t in tasks] == [status], tasks
        return tasks[0]

    return await assert_eventually(check, timeout=60, message=f"{run_id}: one task {status.value}")


# -- the restock example -------------------------------------------------------------------------


async def test_restock_agent_answers_from_its_leased_tool_outputs(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """The example agent reads the stock list, writes two reorders (idempotent) and a report (fenced);
    each call is a settled task with a receipt, made once at its downstream, and the answer uses the outputs."""
    async with agent_stack(settings, tmp_path) as stack:
        run_id = f"restock-{uuid.uuid4().hex[:8]}"
        answer = await asyncio.wait_for(run_scripted_agent(client, stack.settings.task_queue, run_id=run_id), 120)
        tasks = await stack.tasks(run_id)
        rows = await stack.rows()
        published = await publishing.count_publications(stack.downstream.publish_database_url)
        status = await client.get_workflow_handle(run_id).query(STATUS_QUERY, result_type=RunStatus)
        await replays(client.get_workflow_handle(run_id), "restock")

    assert sorted(t.tool for t in tasks) == ["http_get", "publish_restock_report", "sql_upsert", "sql_upsert"]
    for task in tasks:
        assert (task.status, task.claim_generation, task.attempts) == (TaskStatus.SETTLED, 1, 1), task
        assert task.receipt is not None
        assert task.task_id == f"{run_id}/{task.step_id}" and task.idempotency_key == f"{run_id}:{task.step_id}"
        assert task.step_id.startswith(f"{task.tool}-pyd_ai_"), task.step_id  # the model's tool-call id
    # Below 100 units in agentlease/demo/files/inventory.csv: B-2040 (12) and C-3300 (88).
    assert sorted((r["record_key"], r["payload"]["reorder"], r["claim_generation"]) for r in rows) == [
        ("reorder:B-2040", 188, 1),
        ("reorder:C-3300", 112, 1),
    ]
    assert {r["idempotency_key"] for r in rows} == {t.idempotency_key for t in tasks if t.tool == "sql_upsert"}
    assert published == 1
    [report] = [t for t in tasks if t.tool == "publish_restock_report"]
    assert report.receipt is not None
    post_id = report.receipt.external_id
    assert answer == (
        "Restock done: reorder recorded as reorder:B-2040; reorder recorded as reorder:C-3300; "
        f"report published as post {post_id} (restock-report)."
    )
    assert status.status == "completed" and [t.status for t in status.tasks] == ["settled"] * 4


async def test_one_worker_serves_the_agent_and_plan_runs(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """AgentLeasePlugin and PydanticAIPlugin compose: the same worker runs an agent and a plan at once."""
    async with agent_stack(settings, tmp_path) as stack:
        plan_id = f"plan-{uuid.uuid4().hex[:8]}"
        plan = AgentRunPlan(
            agent_run_id=plan_id,
            steps=[
                PlanStep(step_id="check-stock", tool="http_get", arguments={"url": "files/inventory.csv"}),
                PlanStep(
                    step_id="report",
                    tool="publish_restock_report",
                    arguments={
                        "slug": "plan-report",
                        "items": [{"sku": "B-2040", "name": "shelf", "quantity": 12, "reorder": 8}],
                    },
                ),
            ],
        )
        plan_run = await client.start_workflow(
            AgentRunWorkflow.run, plan, id=plan_id, task_queue=stack.settings.task_queue
        )
        agent_run = run_scripted_agent(client, stack.settings.task_queue, run_id=f"restock-{uuid.uuid4().hex[:8]}")
        answer, plan_status = await asyncio.wait_for(asyncio.gather(agent_run, plan_run.result()), 120)
        published = await publishing.count_publications(stack.downstream.publish_database_url)

    assert answer.startswith("Restock done: ") and "report published as post" in answer, answer
    assert plan_status.status == "completed"
    assert [(t.step_id, t.status) for t in plan_status.tasks] == [("check-stock", "settled"), ("report", "settled")]
    assert published == 2


# -- bad input -----------------------------------------------------------------------------------


async def test_bad_arguments_and_an_unknown_tool_get_a_retry_prompt_and_nothing_settles(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """Arguments that fail the tool's model and a tool nobody declared reach the model as retry prompts;
    no task is made for them; the model corrects its call, which settles; the worker carries on."""
    bad = ("sql_upsert", {"table": "Not A Table!", "row": "not an object"})
    unknown = ("launch_rockets", {"count": 3})
    good = ("sql_upsert", {"table": "inventory", "record_key": "reorder:A-1001", "row": {"reorder": 5}})
    async with agent_stack(settings, tmp_path) as stack:
        handle = await start_scripted(client, stack, prompt_for([bad, unknown], [good]))
        told = json.loads(await asyncio.wait_for(handle.result(), 120))
        tasks = await stack.tasks(handle.id)
        rows = await stack.rows()
        await replays(handle, "retry_prompts")

    retried = [entry for entry in told if entry["outcome"] == "retried"]
    assert [entry["tool"] for entry in retried] == ["sql_upsert", "launch_rockets"], told
    assert "table must be a lower-case SQL identifier" in retried[0]["content"], retried[0]
    assert "row" in retried[0]["content"] and "valid dictionary" in retried[0]["content"], retried[0]
    assert "Unknown tool name: 'launch_rockets'" in retried[1]["content"], retried[1]
    assert "'sql_upsert'" in retried[1]["content"] and "'smtp_send'" in retried[1]["content"], retried[1]
    [settled] = [entry for entry in told if entry["outcome"] == "success"]
    assert settled["content"] == {"record_key": "reorder:A-1001", "written": True}
    # Only the corrected call is a task; the key comes from its arguments (key=).
    assert [(t.tool, t.status, t.idempotency_key) for t in tasks] == [
        ("sql_upsert", TaskStatus.SETTLED, f"{handle.id}:upsert:inventory:reorder:A-1001")
    ]
    assert [r["record_key"] for r in rows] == ["reorder:A-1001"]


async def test_a_key_from_the_arguments_settles_a_repeated_action_from_its_receipt(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """G6 across tool calls: a second call for the same row (a new call id, as after a reset) has the
    same key, so it settles from the first call's receipt without writing again."""
    upsert = ("sql_upsert", {"table": "inventory", "record_key": "reorder:C-3300", "row": {"reorder": 112}})
    async with agent_stack(settings, tmp_path) as stack:
        handle = await start_scripted(client, stack, prompt_for([upsert], [upsert]))
        told = json.loads(await asyncio.wait_for(handle.result(), 120))
        first, second = await stack.tasks(handle.id)
        rows = await stack.rows()

    # The key made from the arguments is scoped to the run (``docs/security-review.md``).
    assert first.idempotency_key == second.idempotency_key == f"{handle.id}:upsert:inventory:reorder:C-3300"
    assert (first.status, second.status) == (TaskStatus.SETTLED, TaskStatus.SETTLED)
    assert first.receipt is not None and first.receipt == second.receipt
    assert [(r["record_key"], r["claim_generation"]) for r in rows] == [("reorder:C-3300", 1)]
    assert [entry["content"] for entry in told] == [
        {"record_key": "reorder:C-3300", "written": True},
        {
            "settled": True,
            "note": f"this action (idempotency key {first.idempotency_key}) had already been done by an earlier "
            "call: it was not run again; the receipt is the earlier one",
            "receipt": first.receipt.model_dump(mode="json", exclude={"verified_at"}),
        },
    ]


# -- approvals -----------------------------------------------------------------------------------

MAIL = {"to": ["ops@example.com"], "subject": "restock", "body": "B-2040 is low"}


async def test_unsafe_tool_waits_for_approval_and_runs_once_when_approved(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """An unsafe call parks as awaiting_approval; ``agentlease waiting`` lists it; ``agentlease approve``
    lets it run once (one message at the SMTP server), and the model gets its output."""
    async with agent_stack(settings, tmp_path) as stack:
        handle = await start_scripted(client, stack, prompt_for([("smtp_send", MAIL)]))
        task = await one_task_in(stack, handle.id, TaskStatus.AWAITING_APPROVAL)
        listed = await asyncio.to_thread(stack.cli, "waiting", "--json", env=stack.cli_env())
        assert listed.returncode == 0, listed
        assert [(t["agent_run_id"], t["step_id"], t["status"]) for t in json.loads(listed.stdout)] == [
            (handle.id, task.step_id, "awaiting_approval")
        ]
        assert await mail.received_messages(stack.downstream.mail_database_url) == []
        approved = await asyncio.to_thread(
            stack.cli,
            "approve",
            handle.id,
            task.step_id,
            "--by",
            "alice",
            "--reason",
            "ticket OPS-12",
            env=stack.cli_env(),
        )
        assert approved.returncode == 0, approved
        told = json.loads(await asyncio.wait_for(handle.result(), 120))
        messages = await mail.received_messages(stack.downstream.mail_database_url)
        record = await stack.ledger.get_task(task.task_id)

    # (The recording server keeps the folded header's leading space.)
    assert len(messages) == 1 and (messages[0].idempotency_key or "").strip() == task.idempotency_key
    assert (record.status, record.attempts) == (TaskStatus.SETTLED, 1)
    [result] = told
    assert (result["tool"], result["outcome"]) == ("smtp_send", "success")
    assert result["content"]["message_id"] == messages[0].message_id


async def test_rejected_unsafe_tool_never_runs_and_the_model_is_told_it_was_refused(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """Two unsafe calls in one turn: one approved, one rejected. The rejected one never runs (no
    attempt, no message); the model sees a failed result saying who refused it and why."""
    other = {**MAIL, "to": ["all-staff@example.com"]}
    async with agent_stack(settings, tmp_path) as stack:
        handle = await start_scripted(client, stack, prompt_for([("smtp_send", MAIL), ("smtp_send", other)]))

        async def both_wait() -> list[TaskRecord]:
            tasks = await stack.tasks(handle.id)
            assert [t.status for t in tasks] == [TaskStatus.AWAITING_APPROVAL] * 2, tasks
            return tasks

        keep, refuse = await assert_eventually(both_wait, timeout=60, message="both calls wait for approval")
        env = stack.cli_env()
        rejected = await asyncio.to_thread(
            stack.cli, "reject", handle.id, refuse.step_id, "--by", "bob", "--reason", "wrong list", env=env
        )
        assert rejected.returncode == 0, rejected
        approved = await asyncio.to_thread(
            stack.cli, "approve", handle.id, keep.step_id, "--by", "bob", "--reason", "ok", env=env
        )
        assert approved.returncode == 0, approved
        told = json.loads(await asyncio.wait_for(handle.result(), 120))
        messages = await mail.received_messages(stack.downstream.mail_database_url)
        refused = await stack.ledger.get_task(refuse.task_id)
        trail = await stack.ledger.events(refuse.task_id)
        await replays(handle, "decisions")

    # The two calls are recorded in either order: the one that ran is told by its idempotency key.
    assert len(messages) == 1 and (messages[0].idempotency_key or "").strip() == keep.idempotency_key
    assert (refused.status, refused.attempts, refused.claim_generation) == (TaskStatus.REJECTED, 0, 0)
    assert EventKind.CLAIMED not in {e.kind for e in trail}
    outcomes = sorted((entry["outcome"], str(entry["content"])) for entry in told)
    assert outcomes[1][0] == "success"
    assert outcomes[0] == (
        "failed",
        "smtp_send was refused by an operator: it did not run and will not run (rejected by bob: wrong list)",
    )


# -- cancellation --------------------------------------------------------------------------------


async def test_a_cancelled_call_stays_cancelled_and_the_model_is_told(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """G8 inside an agent run: ``cancel`` on a running call ends its claim in the ledger first, then
    the activity; the task never runs again, the model sees it was cancelled, the run completes. The call
    was inside ``external_call``: its effect may be in place, so it is cancelled with its effect unknown (G11)."""
    async with agent_stack(settings, tmp_path) as stack:
        handle = await start_scripted(client, stack, prompt_for([("long_call", {})], [("quick", {})]))
        task = await one_task_in(stack, handle.id, TaskStatus.RUNNING)
        request = CancelRequest(step_id=task.step_id, by="carol", reason="customer withdrew")
        answer = await handle.execute_update("cancel", request, result_type=RunStatus)
        told = json.loads(await asyncio.wait_for(handle.result(), 120))
        record = await stack.ledger.get_task(task.task_id)
        trail = await stack.ledger.events(task.task_id)
        await replays(handle, "cancelled")

    [view] = [t for t in answer.tasks if t.step_id == task.step_id]
    assert (view.status, view.error) == ("cancelled_effect_unknown", "cancelled by carol: customer withdrew")
    assert record.status is TaskStatus.CANCELLED_EFFECT_UNKNOWN
    assert [e.claim_generation for e in trail if e.kind is EventKind.CLAIMED] == [1]  # never claimed again
    assert told[0] == {
        "tool": "long_call",
        "outcome": "failed",
        "content": "long_call was cancelled after it may have reached its target: its effect is unknown; it will "
        "not run again (cancelled by carol: customer withdrew)",
    }
    assert told[1]["outcome"] == "success"  # the agent carried on with its next call


@pytest.mark.parametrize("how", ["workflow cancel", "timeout around agent.run"])
async def test_cancelling_the_agent_run_cancels_each_running_leased_call_once(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, how: str
) -> None:
    """Two leased calls run in parallel inside Pydantic AI's tool execution when the agent run is
    cancelled (the workflow is cancelled, or ``asyncio.wait_for`` around ``agent.run`` times out):
    each task is cancelled in the ledger (as ``agentlease cancel`` does), each activity gets one cancel
    request and acknowledges it before the run ends; nothing spins until the deadlock detector."""
    calls: list[Call] = [("long_call", {}), ("long_call", {})]
    timeout_s = 4.0 if how == "timeout around agent.run" else None
    async with agent_stack(settings, tmp_path) as stack:
        handle = await start_scripted(client, stack, prompt_for(calls, timeout_s=timeout_s))

        async def both_run() -> list[TaskRecord]:
            tasks = await stack.tasks(handle.id)
            assert [t.status for t in tasks] == [TaskStatus.RUNNING] * 2, tasks
            return tasks

        tasks = await assert_eventually(both_run, timeout=60, message="both calls run")
        if timeout_s is None:
            await handle.cancel()
            with pytest.raises(WorkflowFailureError) as failure:
                await asyncio.wait_for(handle.result(), 60)
            assert isinstance(failure.value.cause, CancelledError)
            described = await handle.describe()
            assert described.status == WorkflowExecutionStatus.CANCELED
        else:
            assert json.loads(await asyncio.wait_for(handle.result(), 60)) == "timed out"
        status = await handle.query(STATUS_QUERY, result_type=RunStatus)
        history = await handle.fetch_history()
        records = [await stack.ledger.get_task(t.task_id) for t in tasks]

    kinds = [event.event_type for event in history.events]
    assert kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED) == 2  # once per leased call
    assert kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED) == 2  # each acknowledged
    # Recorded before the run ended, as agentlease cancel records it: idempotent calls inside external_call,
    # so cancelled with their effect unknown (G11).
    assert [(r.status, r.lease_owner, r.stage) for r in records] == [
        (TaskStatus.CANCELLED_EFFECT_UNKNOWN, None, Stage.EXTERNAL_CALL)
    ] * 2
    assert status.status == "cancelled"


# -- recorded histories --------------------------------------------------------------------------


def test_recorded_histories_exist() -> None:
    assert sorted(p.stem for p in HISTORIES.glob(f"{HISTORY_PREFIX}*.json")) == sorted(
        f"{HISTORY_PREFIX}{name}" for name in SCENARIOS
    )


@pytest.mark.parametrize("name", SCENARIOS)
async def test_recorded_histories_replay(name: str) -> None:
    path = HISTORIES / f"{HISTORY_PREFIX}{name}.json"
    history = WorkflowHistory.from_json(f"recorded-{name}", path.read_text())
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
    assert history.events[0].workflow_execution_started_event_attributes.workflow_type.name in {
        WORKFLOW,
        "ScriptedAgentWorkflow",
    }


async def test_the_status_query_answers_while_the_agent_runs(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path
) -> None:
    """Queries during the run (what `agentlease status` and the demo's operator loop send) answer,
    also when the run is replayed in the same process for them: the run's state lives on its own
    workflow object, never in module state shared with another replay of the same run."""
    async with agent_stack(settings, tmp_path) as stack:
        run_id = f"queried-{uuid.uuid4().hex[:8]}"
        handle = await client.start_workflow(
            WORKFLOW, "Check the stock list", id=run_id, task_queue=stack.settings.task_queue, result_type=str
        )
        result = asyncio.ensure_future(handle.result())
        answered = 0
        while not result.done():
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            assert status.agent_run_id == run_id
            answered += 1
            await asyncio.wait([result], timeout=0.05)
        await result
        replayed = await replayer().replay_workflow(await handle.fetch_history(), raise_on_replay_failure=False)
    assert answered >= 1 and replayed.replay_failure is None
