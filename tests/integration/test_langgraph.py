"""A LangGraph agent on Temporal (``LangGraphPlugin``) whose tool calls are leased, on the real dev server: the
framework's plugin and ``AgentLeasePlugin`` on one worker (the ``langgraph`` extra)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.langgraph import LangGraphPlugin
from temporalio.worker import Replayer, Worker

from agentlease import AgentLeasePlugin
from agentlease.enums import TaskStatus
from agentlease.settings import AgentLeaseSettings
from tests.integration.file_refunds import REFUNDS_FILE, issue_refund
from tests.integration.langgraph_agents import (
    GRAPH,
    PIPELINE,
    RefundGraphWorkflow,
    RefundPipelineWorkflow,
    build_graph,
    build_pipeline,
)
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(240)


async def run_prompt(
    client: Client, settings: AgentLeaseSettings, prompt: str, refunds: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    monkeypatch.setenv(REFUNDS_FILE, str(refunds))
    run_id = f"graph-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger:
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[RefundGraphWorkflow],
            plugins=[
                LangGraphPlugin(graphs={GRAPH: build_graph()}),
                AgentLeasePlugin(settings=settings, ledger=ledger, tools=[issue_refund]),
            ],
        )
        async with worker:
            handle = await client.start_workflow(
                RefundGraphWorkflow.run, prompt, id=run_id, task_queue=settings.task_queue
            )
            answer = await asyncio.wait_for(handle.result(), timeout=120)
            history = await handle.fetch_history()
    replayer = Replayer(
        workflows=[RefundGraphWorkflow],
        plugins=[LangGraphPlugin(graphs={GRAPH: build_graph()})],
        data_converter=pydantic_data_converter,
    )
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure
    return run_id, answer


async def test_each_tool_call_of_a_graph_is_one_leased_call_keyed_by_its_tool_call_id(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refunds = tmp_path / "refunds.txt"
    run_id, answer = await run_prompt(
        client, settings, "refund A-1 500; refund A-2 700 and invent", refunds, monkeypatch
    )

    # One refund per call at the downstream, made by the first attempt.
    assert sorted(refunds.read_text().splitlines()) == ["A-1 500 1", "A-2 700 1"]
    async with opened_ledger(settings) as ledger:
        first = await ledger.get_task(f"{run_id}/issue_refund-call-1")
        second = await ledger.get_task(f"{run_id}/issue_refund-call-2")
    assert (first.status, second.status) == (TaskStatus.SETTLED, TaskStatus.SETTLED)
    assert (first.idempotency_key, second.idempotency_key) == (f"{run_id}:refund:A-1", f"{run_id}:refund:A-2")
    # The model read each output, and one error line for the tool it made up.
    assert answer.split(" | ") == [
        'issue_refund: {"order_id": "A-1", "refunded_cents": 500}',
        'issue_refund: {"order_id": "A-2", "refunded_cents": 700}',
        "wire_money: error: unknown tool 'wire_money'; the tools are: issue_refund",
    ]


async def test_a_repeated_action_settles_from_its_receipt_and_the_model_is_told(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refunds = tmp_path / "refunds.txt"
    _, answer = await run_prompt(client, settings, "refund A-1 500; refund A-1 500", refunds, monkeypatch)

    assert refunds.read_text().splitlines() == ["A-1 500 1"]  # the same action's key: one refund
    first, second = answer.split(" | ")
    assert first == 'issue_refund: {"order_id": "A-1", "refunded_cents": 500}'
    assert second.startswith('issue_refund: {"settled": true, "note": "this action (idempotency key ')
    assert "had already been done by an earlier call: it was not run again" in second


async def run_pipeline(client: Client, settings: AgentLeaseSettings, order: dict[str, Any]) -> tuple[str, Any]:
    """Run the two-node refund pipeline for ``order``: ``(run id, its result or the failure it raised)``."""
    run_id = f"pipeline-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger:
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[RefundPipelineWorkflow],
            plugins=[
                LangGraphPlugin(graphs={PIPELINE: build_pipeline()}),
                AgentLeasePlugin(settings=settings, ledger=ledger, tools=[issue_refund]),
            ],
        )
        async with worker:
            handle = await client.start_workflow(
                RefundPipelineWorkflow.run, order, id=run_id, task_queue=settings.task_queue
            )
            try:
                return run_id, await asyncio.wait_for(handle.result(), timeout=120)
            except WorkflowFailureError as failure:
                return run_id, failure


async def test_a_graph_without_a_tools_node_leases_a_nodes_side_effect(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``leased_node``s refund the same order: two tasks of the run, one refund at the downstream, the second
    node's state settled from the first's receipt."""
    refunds = tmp_path / "refunds.txt"
    monkeypatch.setenv(REFUNDS_FILE, str(refunds))
    run_id, result = await run_pipeline(client, settings, {"order_id": "A-7", "amount_cents": 300})

    assert refunds.read_text().splitlines() == ["A-7 300 1"]
    assert result["refund"] == {"order_id": "A-7", "refunded_cents": 300}, result
    assert result["again"]["settled"] is True, result
    async with opened_ledger(settings) as ledger:
        tasks = {task.step_id: task for task in await ledger.list_tasks(run_id)}
    assert sorted(tasks) == ["issue_refund", "issue_refund-2"]
    assert {task.idempotency_key for task in tasks.values()} == {f"{run_id}:refund:A-7"}


async def test_a_leased_node_that_cannot_run_fails_the_run_in_one_line(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arguments the tool refuses: nothing runs, and the run fails with the node's one line."""
    refunds = tmp_path / "refunds.txt"
    monkeypatch.setenv(REFUNDS_FILE, str(refunds))
    _, result = await run_pipeline(client, settings, {"order_id": "A-8", "amount_cents": "many"})

    assert isinstance(result, WorkflowFailureError), result
    message = str(result.cause)
    assert message.startswith("LeasedCallError: invalid arguments for issue_refund, nothing was run: amount_cents:"), (
        message
    )
    assert "\n" not in message
    assert not refunds.exists()
