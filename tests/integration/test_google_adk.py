"""A Google ADK agent on Temporal (``GoogleAdkPlugin``) whose tool calls are leased, on the real dev server: the
framework's plugin and ``AgentLeasePlugin`` on one worker (the ``google-adk`` extra)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.google_adk import GoogleAdkPlugin
from temporalio.worker import Replayer, Worker

from agentlease import AgentLeasePlugin
from agentlease.enums import TaskStatus
from agentlease.settings import AgentLeaseSettings
from tests.integration.adk_agents import AdkRefundWorkflow
from tests.integration.file_refunds import REFUNDS_FILE, issue_refund
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(240)


async def test_each_function_call_of_an_adk_agent_is_one_leased_call_keyed_by_its_id(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refunds = tmp_path / "refunds.txt"
    monkeypatch.setenv(REFUNDS_FILE, str(refunds))
    run_id = f"adk-{uuid.uuid4().hex[:8]}"
    async with opened_ledger(settings) as ledger:
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[AdkRefundWorkflow],
            plugins=[GoogleAdkPlugin(), AgentLeasePlugin(settings=settings, ledger=ledger, tools=[issue_refund])],
        )
        async with worker:
            handle = await client.start_workflow(
                AdkRefundWorkflow.run,
                "refund A-1 500; refund A-1 500; refund A-2 700",
                id=run_id,
                task_queue=settings.task_queue,
            )
            answer = await asyncio.wait_for(handle.result(), timeout=120)
            history = await handle.fetch_history()
        tasks = {task.step_id: task for task in await ledger.list_tasks(run_id)}

    # One refund per action at the downstream: the repeated one settled from the first one's receipt.
    assert sorted(refunds.read_text().splitlines()) == ["A-1 500 1", "A-2 700 1"]
    assert sorted(tasks) == ["issue_refund-call-1", "issue_refund-call-2", "issue_refund-call-3"]
    assert {task.status for task in tasks.values()} == {TaskStatus.SETTLED}
    assert tasks["issue_refund-call-3"].idempotency_key == f"{run_id}:refund:A-2"
    first, again, second = answer.split(" | ")
    assert first == 'issue_refund: {"order_id": "A-1", "refunded_cents": 500}'
    assert again.startswith('issue_refund: {"note": "this action (idempotency key ')
    assert second == 'issue_refund: {"order_id": "A-2", "refunded_cents": 700}'

    replayer = Replayer(workflows=[AdkRefundWorkflow], plugins=[GoogleAdkPlugin()])
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure
