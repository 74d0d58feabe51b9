"""A step whose tool no worker serves, recorded by its failing run: how the ledger's readers show it.

``record_unknown_tool`` (what the ``agentlease.record_unknown_tools`` activity writes) on SQLite and
PostgreSQL: the task ``cancelled`` by ``agentlease`` with the error class ``unknown_tool`` and the reason;
written again, nothing changes; a task that got further is left alone. ``run_pages`` (``agentlease runs``)
shows its run ``failed`` with why; ``agentlease ui`` too, on the front page (and its ``failed`` filter)
and the run's page. The end to end story, with a worker on Temporal, is
``tests/acceptance/test_unknown_tool_cli.py``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import httpx

from agentlease.enums import EventKind, LedgerRunState, SideEffectClass, TaskStatus
from agentlease.ledger.listing import collect, run_pages
from agentlease.ledger.store import Ledger
from agentlease.ledger.unknown_tools import UNKNOWN_TOOL_ERROR, UnknownTools, UnknownToolStep, record_unknown_tool
from agentlease.records import TaskSpec
from agentlease.ui.app import ui_app


def _spec(run: str, step: str, tool: str) -> TaskSpec:
    return TaskSpec(
        task_id=f"{run}/{step}",
        agent_run_id=run,
        step_id=step,
        tool=tool,
        side_effect_class=SideEffectClass.UNSAFE,
        idempotency_key=f"{run}:{step}",
        lease_ttl=timedelta(seconds=30),
    )


async def test_the_failed_run_in_the_ledger_runs_and_the_web_view(ledger: Ledger) -> None:
    run = f"failed-{uuid.uuid4().hex[:8]}"
    other = f"fine-{uuid.uuid4().hex[:8]}"
    request = UnknownTools(steps=[UnknownToolStep(step_id="export", tool="export_report")], known=["fetch_page"])
    why = request.reason_for(request.steps[0])
    assert why.startswith("unknown tool 'export_report' (step export): no worker of the run's task queue serves it")
    task = await record_unknown_tool(ledger, _spec(run, "export", "export_report"), why)
    again = await record_unknown_tool(ledger, _spec(run, "export", "export_report"), why)
    assert (task.status, task.error_class, task.last_error) == (TaskStatus.CANCELLED, UNKNOWN_TOOL_ERROR, why)
    assert again == task
    [entry] = await ledger.events(task.task_id)
    assert (entry.kind, (entry.details or {}).get("by"), entry.reason) == (EventKind.CANCELLED, "agentlease", why)

    claimed = await ledger.claim(_spec(other, "fetch", "fetch_page"), "worker-a")
    kept = await record_unknown_tool(ledger, _spec(other, "fetch", "fetch_page"), "not this one")
    assert (kept.status, kept.error_class, kept.claim_generation) == (TaskStatus.RUNNING, None, claimed.generation)

    runs = {r.agent_run_id: r for r in await collect(run_pages(ledger.database))}
    assert (runs[run].status, runs[run].error) == (LedgerRunState.FAILED, why)
    assert (runs[other].status, runs[other].error) == (LedgerRunState.RUNNING, None)

    transport = httpx.ASGITransport(app=ui_app(ledger))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        front = (await http.get("/")).text
        assert f"data-run='{run}' data-status='failed'" in front and "unknown tool &#x27;export_report&#x27;" in front
        only = (await http.get("/?status=failed")).text
        assert f"data-run='{run}'" in only and f"data-run='{other}'" not in only
        page = (await http.get(f"/runs/{run}")).text
        assert "id='run-status'>failed<" in page and "the run failed: unknown tool" in page
