"""``temporal workflow reset`` of a run whose approval-gated step already settled, on the real dev server: the
reset run settles the step from its receipt (the tool does not run again, nobody is asked again) and completes."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client

from agentlease.enums import TaskStatus
from agentlease.records import SETTLED_BY_EARLIER_RECEIPT, RunStatus
from agentlease.settings import AgentLeaseSettings
from tests.integration import approval_tools
from tests.integration.test_action_keys import reset
from tests.integration.test_bound_approvals import _worker, approve, settings_for, start
from tests.integration.test_lease_on_temporal import opened_ledger

pytestmark = pytest.mark.timeout(180)


async def test_a_reset_run_settles_its_approved_step_from_the_receipt(
    client: Client, settings: AgentLeaseSettings
) -> None:
    settings = settings_for(settings)
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "worker-reset"):
        handle = await start(client, settings, "quick_send")
        await approve(handle)
        first = await asyncio.wait_for(handle.result(), 60)
        task_id = f"{handle.id}/send"
        assert first.status == "completed" and approval_tools.SENT[task_id] == 1, first

        await asyncio.to_thread(reset, settings, handle.id)
        latest = client.get_workflow_handle(handle.id, result_type=RunStatus)
        again = await asyncio.wait_for(latest.result(), 60)
        record = await ledger.get_task(task_id)

    assert again.status == "completed", again
    [step] = again.tasks
    assert step.status is TaskStatus.SETTLED and step.receipt == first.tasks[0].receipt, step
    assert step.settled_by == SETTLED_BY_EARLIER_RECEIPT, step
    assert approval_tools.SENT[task_id] == 1  # no second execution
    assert record.status is TaskStatus.SETTLED
