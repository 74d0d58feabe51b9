"""``agentlease ui``: a read-only web view of the ledger (Starlette).

Pages: the runs, a run's tasks, and each task's lease timeline (:mod:`agentlease.ui.timeline`),
linked to the Temporal UI's page of the run. JSON for scripts under ``/api``:

- ``GET /api/runs/{run_id}/tasks``: the run's tasks (the JSON of ``agentlease tasks --json``);
- ``GET /api/tasks/{task_id}``: one task; ``GET /api/events/{task_id}``: its evidence trail.

Every page and list is bounded: a run's page shows :data:`TASKS_PER_PAGE` tasks and a timeline
:data:`EVENTS_PER_PAGE` entries of the trail, each with a link to the next page (``?after=``); the
JSON lists take ``?after=`` and ``?limit=`` (at most :data:`MAX_LIMIT`) and name the next page in a
``Link: <...>; rel="next"`` header. A trail of 200,000 entries is 400 pages, each read by one
index range.

It reads the ledger only: every route is a ``GET``, and nothing it serves can renew, settle or
decide anything. Unknown runs and tasks are 404; a malformed cursor or limit is 400. Who may read it
is :mod:`agentlease.ui.guard`'s (the ``Host`` check and the operator token).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from agentlease.clock import to_ms
from agentlease.errors import TaskNotFoundError
from agentlease.ledger.listing import TaskFilter, event_pages
from agentlease.ledger.statements import tasks_page
from agentlease.ledger.store import Ledger
from agentlease.records import LeaseEvent, TaskRecord
from agentlease.redaction import redact
from agentlease.ui.guard import LOOPBACK_NAMES, UiGuard
from agentlease.ui.timeline import timeline_page

TASKS_PER_PAGE = 200
"""Tasks a run's page (and a page of its JSON) shows."""

EVENTS_PER_PAGE = 500
"""Trail entries a timeline page (and a page of its JSON) shows."""

MAX_LIMIT = 1000
"""The largest ``?limit=`` of a JSON list."""

_PAGE = (
    "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
    "<style>body{{font:14px/1.4 system-ui,sans-serif;margin:24px}}td,th{{padding:3px 8px;"
    "border-bottom:1px solid #e5e5ea;text-align:left}}table{{border-collapse:collapse}}</style></head>"
    "<body><h1>{title}</h1>{body}</body></html>"
)

TaskCursor = tuple[int, str]
"""A run's tasks page cursor: ``created_at_ms`` and ``task_id`` of the last task shown."""


class BadQuery(ValueError):
    """A malformed ``?after=`` or ``?limit=``: answered 400."""


def temporal_ui_link(base: str | None, namespace: str, workflow_id: str | None) -> str | None:
    """The Temporal UI's page of a workflow, or ``None`` without a UI address or workflow id."""
    if not base or not workflow_id:
        return None
    return f"{base.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"


def task_href(task_id: str) -> str:
    return f"/tasks/{quote(task_id, safe='/')}"


def _tasks_table(records: list[TaskRecord]) -> str:
    rows = "".join(
        f"<tr><td><a href='{html.escape(task_href(r.task_id))}'>{html.escape(r.step_id)}</a></td>"
        f"<td>{html.escape(r.tool)}</td><td>{r.status.value}</td><td>{r.stage.value if r.stage else '-'}</td>"
        f"<td>{r.claim_generation}</td><td>{r.attempts}</td><td>{html.escape(r.lease_owner or '-')}</td></tr>"
        for r in records
    )
    return (
        "<table id='tasks'><tr><th>step</th><th>tool</th><th>status</th><th>stage</th><th>generation</th>"
        f"<th>attempts</th><th>owner</th></tr>{rows}</table>"
    )


def _limit(request: Request, default: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 4 or not 1 <= int(raw) <= MAX_LIMIT:
        raise BadQuery(f"limit is a number from 1 to {MAX_LIMIT}")
    return int(raw)


def _event_cursor(request: Request) -> int | None:
    raw = request.query_params.get("after")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
        raise BadQuery("after is the event id of the last entry of the previous page")
    return int(raw)


def _task_cursor(request: Request) -> TaskCursor | None:
    raw = request.query_params.get("after")
    if raw is None:
        return None
    ms, sep, task_id = raw.partition(":")
    if not sep or not (ms.isascii() and ms.isdigit()) or len(ms) > 19 or not task_id or len(task_id) > 400:
        raise BadQuery("after is the cursor the previous page linked to")
    return int(ms), task_id


def _next(path: str, after: str, limit: int | None = None) -> str:
    query = {"after": after, **({"limit": str(limit)} if limit is not None else {})}
    return f"{path}?{urlencode(query)}"


def ui_app(
    ledger: Ledger,
    *,
    temporal_ui: str | None = None,
    namespace: str = "default",
    token: str | None = None,
    allowed_hosts: Iterable[str] = LOOPBACK_NAMES,
) -> Starlette:
    """The web view over ``ledger`` (the caller owns and closes it).

    Args:
        temporal_ui: the Temporal UI's address (``http://127.0.0.1:8233``), for links; none: no links.
        namespace: the runs' Temporal namespace, for those links.
        token: the operator token every request must carry (:mod:`agentlease.ui.guard`); ``None``: none.
        allowed_hosts: the ``Host`` names it answers to. Default loopback's.
    """

    async def run_tasks(run_id: str, after: TaskCursor | None, limit: int) -> list[TaskRecord]:
        query = tasks_page(TaskFilter(agent_run_id=run_id), after, limit)
        rows = await ledger.database.read(lambda conn: conn.execute(query).all())
        return [TaskRecord.from_row(row) for row in rows]

    async def trail(task_id: str, after: int | None, limit: int) -> list[LeaseEvent]:
        return [
            event
            async for page in event_pages(ledger.database, task_id=task_id, after=after, limit=limit)
            for event in page
        ]

    def task_cursor(records: list[TaskRecord]) -> str:
        last = records[-1]
        return f"{to_ms(last.created_at)}:{last.task_id}"

    async def run_page(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        records = await run_tasks(run_id, _task_cursor(request), TASKS_PER_PAGE)
        if not records:
            return HTMLResponse(_PAGE.format(title="not found", body=f"no run {html.escape(run_id)!r}"), 404)
        link = temporal_ui_link(temporal_ui, namespace, records[0].trace.workflow_id or run_id)
        body = (f"<p><a href='{html.escape(link)}'>the run in the Temporal UI</a></p>" if link else "") + _tasks_table(
            records
        )
        if len(records) == TASKS_PER_PAGE:
            following = _next(f"/runs/{quote(run_id, safe='')}", task_cursor(records))
            body += f"<p><a id='next' href='{html.escape(following)}'>next {TASKS_PER_PAGE} tasks</a></p>"
        return HTMLResponse(_PAGE.format(title=f"agent run {html.escape(run_id)}", body=body))

    async def task_page(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        after = _event_cursor(request)
        try:
            task = await ledger.get_task(task_id)
        except TaskNotFoundError:
            return HTMLResponse(_PAGE.format(title="not found", body=f"no task {html.escape(task_id)!r}"), 404)
        events = await trail(task_id, after, EVENTS_PER_PAGE)
        following = None
        if len(events) == EVENTS_PER_PAGE:
            following = _next(task_href(task_id), str(events[-1].event_id))
        link = temporal_ui_link(temporal_ui, namespace, task.trace.workflow_id or task.agent_run_id)
        page = timeline_page(
            task,
            events,
            temporal_ui=link,
            back=f"/runs/{quote(task.agent_run_id, safe='')}",
            next_page=following,
            first_page=task_href(task_id) if after is not None else None,
        )
        return HTMLResponse(page)

    async def run_tasks_json(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        limit = _limit(request, TASKS_PER_PAGE)
        after = _task_cursor(request)
        records = await run_tasks(run_id, after, limit)
        if not records and after is None:
            return JSONResponse({"error": "no_such_run"}, 404)
        headers = {}
        if len(records) == limit:
            path = f"/api/runs/{quote(run_id, safe='')}/tasks"
            headers["Link"] = f'<{_next(path, task_cursor(records), limit)}>; rel="next"'
        return JSONResponse([redact(r.as_json()) for r in records], headers=headers)

    async def task_json(request: Request) -> Response:
        try:
            return JSONResponse(redact((await ledger.get_task(request.path_params["task_id"])).as_json()))
        except TaskNotFoundError:
            return JSONResponse({"error": "no_such_task"}, 404)

    async def task_events_json(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        limit = _limit(request, EVENTS_PER_PAGE)
        after = _event_cursor(request)
        try:
            await ledger.get_task(task_id)
        except TaskNotFoundError:
            return JSONResponse({"error": "no_such_task"}, 404)
        events = await trail(task_id, after, limit)
        headers = {}
        if len(events) == limit:
            path = f"/api/events/{quote(task_id, safe='/')}"
            headers["Link"] = f'<{_next(path, str(events[-1].event_id), limit)}>; rel="next"'
        body: list[dict[str, Any]] = [redact(e.model_dump(mode="json")) for e in events]
        return JSONResponse(body, headers=headers)

    def bad_query(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "bad_query", "detail": str(exc)}, 400)

    app = Starlette(
        routes=[
            Route("/runs/{run_id}", run_page, methods=["GET"]),
            Route("/tasks/{task_id:path}", task_page, methods=["GET"]),
            Route("/api/runs/{run_id}/tasks", run_tasks_json, methods=["GET"]),
            Route("/api/events/{task_id:path}", task_events_json, methods=["GET"]),
            Route("/api/tasks/{task_id:path}", task_json, methods=["GET"]),
        ],
        exception_handlers={BadQuery: bad_query},
    )
    app.add_middleware(UiGuard, allowed_hosts=allowed_hosts, token=token)
    return app


__all__ = ["EVENTS_PER_PAGE", "MAX_LIMIT", "TASKS_PER_PAGE", "temporal_ui_link", "ui_app"]
