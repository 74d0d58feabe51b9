"""The run's search attributes (what the Temporal UI lists and filters) on the real dev server.

The upserts of one workflow task are coalesced (``LeasedToolCalls._set_state``): a step's end and
the next step's start, in the same task, upsert once or not at all. What visibility shows must
not change: while a step waits for a person, ``AgentLeaseStatus`` is ``waiting`` and
``AgentLeaseWaitingReason`` names it; when a run ends, its final status, tool and stage.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from agentlease.decisions.table import CancelRequest
from agentlease.observability import search_attributes as sa
from agentlease.records import RunStatus
from agentlease.runtime.names import STATUS_QUERY
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow
from tests.eventually import assert_eventually
from tests.integration.test_lease_on_temporal import _plan, _worker, opened_ledger

pytestmark = pytest.mark.timeout(120)


async def shown(handle: WorkflowHandle) -> dict[str, str | None]:
    """The attributes every run shows (the live lease ones: ``test_operator_views.py``)."""
    attributes = (await handle.describe()).typed_search_attributes
    return {
        key.name: attributes.get(key) for key in (sa.RUN_STATUS, sa.WAITING_REASON, sa.CURRENT_TOOL, sa.CURRENT_STAGE)
    }


async def upserts(handle: WorkflowHandle) -> int:
    """Upserts of the run's own attributes (not the SDK's ``TemporalChangeVersion`` of each patch marker)."""
    history = await handle.fetch_history()
    return sum(
        e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        and set(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
        != {"TemporalChangeVersion"}
        for e in history.events
    )


async def test_a_completed_run_shows_its_end_with_one_upsert_per_tool(
    client: Client, settings: AgentLeaseSettings
) -> None:
    run_id = f"sa-{uuid.uuid4().hex[:8]}"
    plan = _plan(run_id, *((f"s{i}", "quick", {}) for i in range(4)))
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "w1"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)
        result = await handle.result()
    assert [t.status.value for t in result.tasks] == ["settled"] * 4
    assert await shown(handle) == {
        sa.RUN_STATUS.name: "completed",
        sa.WAITING_REASON.name: "",
        sa.CURRENT_TOOL.name: "quick",
        sa.CURRENT_STAGE.name: "settled",
    }
    # Running (with its tool), the live claim of each quick call (its generation and owner,
    # docs/operator-views.md), then the end: not one upsert per stage change of every step.
    assert await upserts(handle) <= 3 + 4


async def test_a_waiting_run_shows_why_until_it_is_cancelled(client: Client, settings: AgentLeaseSettings) -> None:
    run_id = f"sa-{uuid.uuid4().hex[:8]}"
    plan = _plan(run_id, ("fetch", "quick", {}), ("push", "always_permanent", {}))
    async with opened_ledger(settings) as ledger, _worker(client, ledger, settings, "w1"):
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=settings.task_queue)

        async def waiting() -> None:
            status = await handle.query(STATUS_QUERY, result_type=RunStatus)
            assert status.status.value == "waiting", status
            assert (await shown(handle))[sa.WAITING_REASON.name] == "push: dead_lettered"

        await assert_eventually(waiting, timeout=60, message="the run waits for a person")
        assert (await shown(handle))[sa.RUN_STATUS.name] == "waiting"
        assert (await shown(handle))[sa.CURRENT_TOOL.name] == "always_permanent"
        await handle.execute_update("cancel", CancelRequest(by="carol", reason="not needed"))
        await handle.result()
    assert await shown(handle) == {
        sa.RUN_STATUS.name: "cancelled",
        sa.WAITING_REASON.name: "",
        sa.CURRENT_TOOL.name: "always_permanent",
        sa.CURRENT_STAGE.name: "",
    }
