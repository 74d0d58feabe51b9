"""``agentlease ui``: a read-only web view of the ledger (Starlette).

Pages: the runs, a run's tasks, and each task's lease timeline (:mod:`agentlease.ui.timeline`),
linked to the Temporal UI's page of the run. JSON for scripts under ``/api``:

- ``GET /api/runs/{run_id}/tasks``: the run's tasks (the JSON of ``agentlease tasks --json``);
- ``GET /api/tasks/{task_id}``: one task; ``GET /api/events/{task_id}``: its evidence trail.

It reads the ledger only: every route is a ``GET``, and nothing it serves can renew, settle or
decide anything. Unknown runs and tasks are 404.
"""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from agentlease.errors import TaskNotFoundError
from agentlease.ledger.store import Ledger
from agentlease.records import TaskRecord
from agentlease.ui.timeline import timeline_page

_PAGE = (
    "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
    "<style>body{{font:14px/1.4 system-ui,sans-serif;margin:24px}}td,th{{padding:3px 8px;"
    "border-bottom:1px solid #e5e5ea;text-align:left}}table{{border-collapse:collapse}}</style></head>"
    "<body><h1>{title}</h1>{body}</body></html>"
)


def temporal_ui_link(base: str | None, namespace: str, workflow_id: str | None) -> str | None:
    """The Temporal UI's page of a workflow, or ``None`` without a UI address or workflow id."""
    if not base or not workflow_id:
        return None
    return f"{base.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"


def task_href(task_id: str) -> str:
    return f"/tasks/{quote(task_id, safe='/')}"


def _tasks_table(records: list[TaskRecord]) -> str:
    rows = "".join(
        f"<tr><td><a href='{task_href(r.task_id)}'>{html.escape(r.step_id)}</a></td><td>{html.escape(r.tool)}</td>"
        f"<td>{r.status.value}</td><td>{r.stage.value if r.stage else '-'}</td><td>{r.claim_generation}</td>"
        f"<td>{r.attempts}</td><td>{html.escape(r.lease_owner or '-')}</td></tr>"
        for r in records
    )
    return (
        "<table id='tasks'><tr><th>step</th><th>tool</th><th>status</th><th>stage</th><th>generation</th>"
        f"<th>attempts</th><th>owner</th></tr>{rows}</table>"
    )


def ui_app(ledger: Ledger, *, temporal_ui: str | None = None, namespace: str = "default") -> Starlette:
    """The web view over ``ledger`` (the caller owns and closes it).

    Args:
        temporal_ui: the Temporal UI's address (``http://127.0.0.1:8233``), for links; none: no links.
        namespace: the runs' Temporal namespace, for those links.
    """

    async def run_page(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        records = await ledger.list_tasks(run_id)
        if not records:
            return HTMLResponse(_PAGE.format(title="not found", body=f"no run {html.escape(run_id)!r}"), 404)
        link = temporal_ui_link(temporal_ui, namespace, records[0].trace.workflow_id or run_id)
        body = (f"<p><a href='{html.escape(link)}'>the run in the Temporal UI</a></p>" if link else "") + _tasks_table(
            records
        )
        return HTMLResponse(_PAGE.format(title=f"agent run {html.escape(run_id)}", body=body))

    async def task_page(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        try:
            task = await ledger.get_task(task_id)
        except TaskNotFoundError:
            return HTMLResponse(_PAGE.format(title="not found", body=f"no task {html.escape(task_id)!r}"), 404)
        events = await ledger.events(task_id)
        link = temporal_ui_link(temporal_ui, namespace, task.trace.workflow_id or task.agent_run_id)
        page = timeline_page(task, events, temporal_ui=link, back=f"/runs/{quote(task.agent_run_id, safe='')}")
        return HTMLResponse(page)

    async def run_tasks_json(request: Request) -> Response:
        records = await ledger.list_tasks(request.path_params["run_id"])
        if not records:
            return JSONResponse({"error": "no_such_run"}, 404)
        return JSONResponse([r.as_json() for r in records])

    async def task_json(request: Request) -> Response:
        try:
            return JSONResponse((await ledger.get_task(request.path_params["task_id"])).as_json())
        except TaskNotFoundError:
            return JSONResponse({"error": "no_such_task"}, 404)

    async def task_events_json(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        try:
            await ledger.get_task(task_id)
        except TaskNotFoundError:
            return JSONResponse({"error": "no_such_task"}, 404)
        events: list[dict[str, Any]] = [e.model_dump(mode="json") for e in await ledger.events(task_id)]
        return JSONResponse(events)

    return Starlette(
        routes=[
            Route("/runs/{run_id}", run_page, methods=["GET"]),
            Route("/tasks/{task_id:path}", task_page, methods=["GET"]),
            Route("/api/runs/{run_id}/tasks", run_tasks_json, methods=["GET"]),
            Route("/api/events/{task_id:path}", task_events_json, methods=["GET"]),
            Route("/api/tasks/{task_id:path}", task_json, methods=["GET"]),
        ]
    )
