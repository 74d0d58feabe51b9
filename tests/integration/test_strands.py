"""A Strands agent on Temporal (``StrandsPlugin``) whose tool uses are leased, on the real dev server: the
framework's plugin and ``AgentLeasePlugin`` on one worker (the ``strands`` extra, which needs ``mcp<2``)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from strands import tool as strands_tool
from strands.types.tools import ToolContext
from temporalio.client import Client
from temporalio.strands_agents import StrandsPlugin
from temporalio.worker import Replayer, Worker

from agentlease import AgentLeasePlugin, leased
from agentlease.enums import TaskStatus
from agentlease.errors import ConfigurationError
from agentlease.settings import AgentLeaseSettings
from tests.integration.file_refunds import REFUNDS_FILE, issue_refund
from tests.integration.strands_agents import MODEL, ScriptedRefunds, StrandsRefundWorkflow
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = [pytest.mark.strands, pytest.mark.timeout(240)]


async def test_each_tool_use_of_a_strands_agent_is_one_leased_call_keyed_by_its_id(
    client: Client, settings: AgentLeaseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refunds = tmp_path / "refunds.txt"
    monkeypatch.setenv(REFUNDS_FILE, str(refunds))
    run_id = f"strands-{uuid.uuid4().hex[:8]}"
    plugin = StrandsPlugin(models={MODEL: ScriptedRefunds})
    async with opened_ledger(settings) as ledger:
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[StrandsRefundWorkflow],
            plugins=[plugin, AgentLeasePlugin(settings=settings, ledger=ledger, tools=[issue_refund])],
        )
        async with worker:
            handle = await client.start_workflow(
                StrandsRefundWorkflow.run,
                "refund A-1 500; refund A-1 500; refund A-2 700",
                id=run_id,
                task_queue=settings.task_queue,
            )
            answer = await asyncio.wait_for(handle.result(), timeout=120)
            history = await handle.fetch_history()
        tasks = {task.step_id: task for task in await ledger.list_tasks(run_id)}

    assert sorted(refunds.read_text().splitlines()) == ["A-1 500 1", "A-2 700 1"]
    assert sorted(tasks) == ["issue_refund-call-1", "issue_refund-call-2", "issue_refund-call-3"]
    assert {task.status for task in tasks.values()} == {TaskStatus.SETTLED}
    assert tasks["issue_refund-call-3"].idempotency_key == f"{run_id}:refund:A-2"
    assert '{"order_id": "A-1", "refunded_cents": 500}' in answer and '{"settled": true, "note": ' in answer, answer

    replayer = Replayer(workflows=[StrandsRefundWorkflow], plugins=[StrandsPlugin(models={MODEL: ScriptedRefunds})])
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_strands_tool_is_leased_through_the_function_it_wraps() -> None:
    """Strands' ``@tool`` keeps its name and description; a function taking Strands' ``ToolContext`` is refused in
    one line (only Strands passes one)."""

    @strands_tool
    async def issue_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund an order through the refund service."""
        return {"refunded": order_id, "amount_cents": amount_cents}

    spec = leased(issue_refund, side_effect="idempotent", lease_ttl=timedelta(seconds=10))
    assert (spec.name, spec.description) == ("issue_refund", "Refund an order through the refund service.")
    assert await spec(order_id="A-1", amount_cents=5) == {"refunded": "A-1", "amount_cents": 5}

    @strands_tool(context=True)
    async def with_context(order_id: str, tool_context: ToolContext) -> str:
        return order_id

    with pytest.raises(ConfigurationError, match="takes a ToolContext") as refused:
        leased(with_context, side_effect="read_only", lease_ttl=timedelta(seconds=10))
    assert "\n" not in str(refused.value)
