"""Action keys declared on the tool (issue 18): an OpenAI Agents agent and a Pydantic AI agent whose model asks
for the same refund twice, under two tool-call ids, and again after a ``temporal workflow reset`` (which asks
the model again: new ids): one effect. Every caller keys the calls by the tool's ``action_key``
(``refund:{order_id}``, :mod:`tests.integration.refund_tools`), scoped to the run (the reset keeps the
workflow id); the calls after the first settle from its receipt, and the model reads that they did.

Each test runs one worker in this process on the real dev server; the plans' and ``call_tool``'s use of the
same declaration is tested at the end (a plan step by name, no framework).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("temporalio.openai_agents", reason="needs the openai-agents extra")

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer

from agentlease.demo.agents import scripted_prompt
from agentlease.demo.agents.openai_agent import AgentRequest
from agentlease.enums import EventKind, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, TaskRecord
from agentlease.runtime.devserver import temporal_binary
from agentlease.runtime.temporal import connect
from agentlease.settings import AgentLeaseSettings
from agentlease.tools._registry import load_registry
from agentlease.worker import build_worker, running_worker
from agentlease.workflow._plan import AgentRunWorkflow
from tests.integration import refund_tools
from tests.integration.pydantic_ai_agents import prompt_for
from tests.integration.refund_openai import RefundAgent, fresh_ids_model_plugin
from tests.integration.refund_pydantic import RefundPydanticWorkflow
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(240)

NOTE = "had already been done by an earlier call: it was not run again"


@pytest.fixture(autouse=True, scope="module")
def _no_trace_export() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
        yield


def reset(settings: AgentLeaseSettings, workflow_id: str) -> None:
    """``temporal workflow reset`` to the run's first workflow task, as an operator types it."""
    argv = [
        temporal_binary(),
        "workflow",
        "reset",
        "--address",
        settings.temporal_address,
        "--workflow-id",
        workflow_id,
        "--type",
        "FirstWorkflowTask",
        "--reason",
        "ask the model again",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"


async def result_after_reset(client: Client, settings: AgentLeaseSettings, handle: WorkflowHandle[Any, str]) -> str:
    first_run = (await handle.describe()).run_id
    await asyncio.to_thread(reset, settings, handle.id)
    latest = client.get_workflow_handle(handle.id, result_type=str)
    assert (await latest.describe()).run_id != first_run
    return await asyncio.wait_for(latest.result(), 120)


def order_id() -> str:
    return f"A-{uuid.uuid4().hex[:8]}"


async def all_one_action(ledger: Ledger, run_id: str, order: str, calls: int) -> list[TaskRecord]:
    """The run's tasks: ``calls`` of them, all keyed by the order, all settled; the tool ran in the first only."""
    tasks = await ledger.list_tasks(run_id)
    assert len(tasks) == calls, tasks
    assert {t.idempotency_key for t in tasks} == {f"{run_id}:refund:{order}"}, tasks
    assert {t.status for t in tasks} == {TaskStatus.SETTLED}, tasks
    assert all(t.receipt == tasks[0].receipt for t in tasks), tasks  # one receipt, the first's
    assert len({t.step_id for t in tasks}) == calls  # a task per tool-call id
    return tasks


# -- OpenAI Agents ---------------------------------------------------------------------------------------


@pytest.fixture
async def openai_stack(settings: AgentLeaseSettings) -> AsyncIterator[tuple[AgentLeaseSettings, Client, Ledger]]:
    configured = settings.model_copy(
        update={
            "tool_modules": ["tests.integration.refund_tools"],
            "workflow_modules": ["tests.integration.refund_openai"],
            "plugins": ["tests.integration.refund_openai:fresh_ids_model_plugin"],
        }
    )
    async with opened_ledger(configured) as ledger, running_worker(configured, identity="refund-worker"):
        yield configured, await connect(configured), ledger


def openai_lines(answer: str) -> list[dict[str, Any]]:
    return [json.loads(line.removeprefix("- issue_refund: ")) for line in answer.splitlines()[1:]]


async def test_an_openai_agent_asking_for_the_same_refund_again_refunds_once(
    openai_stack: tuple[AgentLeaseSettings, Client, Ledger],
) -> None:
    settings, client, ledger = openai_stack
    order = order_id()
    call = {"tool": "issue_refund", "arguments": {"order_id": order, "amount_cents": 100}}
    run_id = f"refund-oa-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow(
        RefundAgent.run,
        AgentRequest(prompt=scripted_prompt("refund twice", [call], [call])),
        id=run_id,
        task_queue=settings.task_queue,
    )
    first, again = openai_lines(await asyncio.wait_for(handle.result(), 120))
    assert first == {"order_id": order, "refunded_cents": 100, "refund_number": 1}
    assert again["settled"] is True and NOTE in again["note"] and f"refund:{order}" in again["note"], again
    await all_one_action(ledger, run_id, order, 2)

    after = openai_lines(await result_after_reset(client, settings, handle))
    assert all(line["settled"] is True and NOTE in line["note"] for line in after), after
    await all_one_action(ledger, run_id, order, 4)  # two more tool-call ids, the same action
    assert refund_tools.REFUNDS[order] == [100]  # one effect

    history = await client.get_workflow_handle(run_id).fetch_history()
    replayed = await Replayer(workflows=[RefundAgent], plugins=[fresh_ids_model_plugin()]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert replayed.replay_failure is None, replayed.replay_failure


# -- Pydantic AI ---------------------------------------------------------------------------------------------


@pytest.fixture
async def pydantic_stack(settings: AgentLeaseSettings) -> AsyncIterator[tuple[AgentLeaseSettings, Client, Ledger]]:
    configured = settings.model_copy(
        update={
            "tool_modules": ["tests.integration.refund_tools"],
            "workflow_modules": ["tests.integration.refund_pydantic"],
            "plugins": ["agentlease.demo.agents.pydantic_ai_agent:client_plugin"],
        }
    )
    async with opened_ledger(configured) as ledger:
        client = await connect(configured, identity="refund-worker")
        async with build_worker(client, ledger, load_registry(configured.tool_modules), configured):
            yield configured, client, ledger


async def test_a_pydantic_ai_agent_asking_for_the_same_refund_again_refunds_once(
    pydantic_stack: tuple[AgentLeaseSettings, Client, Ledger],
) -> None:
    settings, client, ledger = pydantic_stack
    order = order_id()
    refund = ("issue_refund", {"order_id": order, "amount_cents": 250})
    run_id = f"refund-pyd-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow(
        "RefundPydanticWorkflow",
        prompt_for([refund], [refund]),
        id=run_id,
        task_queue=settings.task_queue,
        result_type=str,
    )
    first, again = (entry["content"] for entry in json.loads(await asyncio.wait_for(handle.result(), 120)))
    assert first == {"order_id": order, "refunded_cents": 250, "refund_number": 1}
    assert NOTE in again["note"] and again["receipt"]["external_system"] == "issue_refund", again
    await all_one_action(ledger, run_id, order, 2)

    told = json.loads(await result_after_reset(client, settings, handle))
    assert all(NOTE in entry["content"]["note"] for entry in told), told
    await all_one_action(ledger, run_id, order, 4)
    assert refund_tools.REFUNDS[order] == [250]

    history = await client.get_workflow_handle(run_id).fetch_history()
    replayed = await Replayer(workflows=[RefundPydanticWorkflow], plugins=[PydanticAIPlugin()]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert replayed.replay_failure is None, replayed.replay_failure


# -- plans and call_tool: the declared key by the tool's name ------------------------------------------------


async def test_a_plan_keys_its_steps_by_the_tools_declared_action_key(settings: AgentLeaseSettings) -> None:
    """Two plan steps naming the tool (no key of their own) are one action; the second settles from the first."""
    configured = settings.model_copy(update={"tool_modules": ["tests.integration.refund_tools"]})
    order = order_id()
    run_id = f"refund-plan-{uuid.uuid4().hex[:8]}"
    args = {"order_id": order, "amount_cents": 75}
    plan = AgentRunPlan(
        agent_run_id=run_id,
        steps=[PlanStep(step_id=s, tool="issue_refund", arguments=args) for s in ("first", "again")],
    )
    async with opened_ledger(configured) as ledger:
        client = await connect(configured)
        async with build_worker(client, ledger, load_registry(configured.tool_modules), configured):
            status = await client.execute_workflow(
                AgentRunWorkflow.run, plan, id=run_id, task_queue=configured.task_queue
            )
        tasks = await all_one_action(ledger, run_id, order, 2)
        claims = [e for e in await ledger.events(agent_run_id=run_id) if e.kind is EventKind.CLAIMED]

    assert [(v.step_id, v.idempotency_key, v.settled_by) for v in status.tasks] == [
        ("first", f"{run_id}:refund:{order}", None),
        ("again", f"{run_id}:refund:{order}", "earlier_receipt"),
    ]
    assert refund_tools.REFUNDS[order] == [75]
    assert [t.step_id for t in tasks] == ["first", "again"] and len(claims) == 2
