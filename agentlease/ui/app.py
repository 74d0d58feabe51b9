"""``agentlease ui``: a read-only web view of the ledger (runs, a run's tasks, each task's lease timeline, their
JSON under ``/api``), every route a bounded ``GET`` (``?after=``, ``?limit=``). ``docs/web-view.md``,
``docs/security-operations.md`` ("The web view")."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, urlencode

from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from agentlease.clock import from_ms, to_ms
from agentlease.decisions.table import suggested_commands
from agentlease.enums import EventKind, LedgerRunState, TaskStatus
from agentlease.errors import LedgerRefusedValueError, TaskNotFoundError
from agentlease.ledger.listing import RunSummary, TaskFilter, collect, event_pages, failed_before_calls, run_failures
from agentlease.ledger.statements import runs_page, tasks_page
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import EVENTS, TASKS
from agentlease.limits import is_decimal
from agentlease.records import LeaseEvent, TaskRecord
from agentlease.security.redaction import redact
from agentlease.ui.guard import LOOPBACK_NAMES, UiGuard
from agentlease.ui.timeline import PEOPLE, STYLE, html_document, timeline_page

TASKS_PER_PAGE = 200
"""Tasks a run's page (and a page of its JSON) shows."""

EVENTS_PER_PAGE = 500
"""Trail entries a timeline page (and a page of its JSON) shows."""

MAX_LIMIT = 1000
"""The largest ``?limit=`` of a JSON list."""

RUNS_PER_PAGE = 200
"""Runs the front page shows (and waiting tasks it lists first)."""

REFRESH_S = 5
"""A page with something under way reloads itself this often (``<meta http-equiv=refresh>``, no script)."""

STYLESHEET = "/static/ui.css"

TaskCursor = tuple[int, str]
"""A run's tasks page cursor: ``created_at_ms`` and ``task_id`` of the last task shown."""


class BadQuery(ValueError):
    """A malformed ``?after=`` or ``?limit=``: answered 400."""


def last_decision_query(run_id: str) -> Any:
    """The run's latest decision entry (a person's: approve, reject, reconcile, redrive, cancel)."""
    people = [k.value for k in PEOPLE if k is not EventKind.AWAITING_APPROVAL]
    task_ids = select(TASKS.c.task_id).where(TASKS.c.agent_run_id == run_id)
    return (
        select(EVENTS.c.task_id, EVENTS.c.kind, EVENTS.c.reason, EVENTS.c.at_ms)
        .where(EVENTS.c.task_id.in_(task_ids), EVENTS.c.kind.in_(people))
        .order_by(EVENTS.c.event_id.desc())
        .limit(1)
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
        f"<tr><td><a href='{html.escape(task_href(r.task_id))}'>{html.escape(r.step_id)}</a></td>"
        f"<td>{html.escape(r.tool)}</td><td>{r.status.value}</td><td>{r.stage.value if r.stage else '-'}</td>"
        f"<td>{r.claim_generation}</td><td>{r.attempts}</td><td>{html.escape(r.lease_owner or '-')}</td></tr>"
        for r in records
    )
    return (
        "<table id='tasks'><tr><th>step</th><th>tool</th><th>status</th><th>stage</th><th>generation</th>"
        f"<th>attempts</th><th>owner</th></tr>{rows}</table>"
    )


def _when(at: Any) -> str:
    return "-" if at is None else at.isoformat(timespec="seconds")


def _waiting_table(records: list[TaskRecord]) -> str:
    """Tasks waiting for a person, each with the commands that decide it (the decision table's)."""
    if not records:
        return "<p class='muted' id='nothing-waits'>Nothing waits for a person.</p>"
    rows = "".join(
        f"<tr class='waiting' data-run='{html.escape(r.agent_run_id)}'>"
        f"<td><a href='/runs/{html.escape(quote(r.agent_run_id, safe=''))}'>{html.escape(r.agent_run_id)}</a></td>"
        f"<td><a href='{html.escape(task_href(r.task_id))}'>{html.escape(r.step_id)}</a></td>"
        f"<td>{html.escape(r.tool)}</td><td>{r.status.value}</td><td>{_when(r.updated_at)}</td>"
        f"<td class='request'>{_request_cell(r)}</td><td>"
        + "<br>".join(
            f"<code class='command'>{html.escape(c)}</code>"
            for c in suggested_commands(r.status, r.agent_run_id, r.step_id, r.approval_request)
        )
        + "</td></tr>"
        for r in records
    )
    return (
        "<table id='waiting'><tr><th>run</th><th>step</th><th>tool</th><th>status</th><th>since</th>"
        f"<th>asks to approve</th><th>decide with</th></tr>{rows}</table>"
    )


def _request_cell(record: TaskRecord) -> str:
    """A task awaiting approval: the arguments it asks to approve (redacted once more) and their fingerprint."""
    request = record.approval_request
    if record.status is not TaskStatus.AWAITING_APPROVAL or request is None:
        return "-"
    arguments = "<br>".join(
        f"<span class='argument' data-name='{html.escape(name)}'>{html.escape(name)}: {html.escape(text)}</span>"
        for name, text in request.model_copy(update={"arguments": redact(request.arguments)}).shown()
    )
    progress = request.progress()  # several approvers: how many approved, and when the first approval lapses
    shown = f"<br><span class='approvals'>{html.escape(progress)}</span>" if progress else ""
    return f"{arguments}<br>sha256 <code class='sha256'>{request.arguments_sha256}</code>{shown}"


def _runs_table(runs: list[RunSummary]) -> str:
    rows = "".join(
        f"<tr class='run' data-run='{html.escape(r.agent_run_id)}' data-status='{r.status.value}'>"
        f"<td><a href='/runs/{html.escape(quote(r.agent_run_id, safe=''))}'>{html.escape(r.agent_run_id)}</a></td>"
        f"<td><span class='pill status-{r.status.value}'>{r.status.value}</span>"
        + (f"<div class='run-error'>{html.escape(r.error)}</div>" if r.error else "")
        + "</td>"
        f"<td>{r.tasks}</td><td>{r.waiting}</td><td>{r.final - r.settled}</td><td>{r.settled}</td>"
        f"<td>{_when(r.created_at)}</td><td>{_when(r.updated_at)}</td></tr>"
        for r in runs
    )
    return (
        "<table id='runs'><tr><th>run</th><th>status</th><th>tasks</th><th>waiting</th><th>ended unsettled</th>"
        f"<th>settled</th><th>first task</th><th>last change</th></tr>{rows}</table>"
    )


def _filters(status: str, tool: str, hours: str) -> str:
    options = "".join(
        f"<option value='{v}'{' selected' if v == status else ''}>{v or 'any'}</option>" for v in ("", *LedgerRunState)
    )
    return (
        "<form class='filters' method='get' action='/'>"
        f"<label>status <select name='status'>{options}</select></label>"
        f"<label>tool <input name='tool' value='{html.escape(tool)}' size='14'></label>"
        f"<label>changed in the last <input name='hours' value='{html.escape(hours)}' size='4'> hours</label>"
        "<button type='submit'>filter</button></form>"
    )


def _limit(request: Request, default: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not is_decimal(raw) or len(raw) > 4 or not 1 <= int(raw) <= MAX_LIMIT:
        raise BadQuery(f"limit is a number from 1 to {MAX_LIMIT}")
    return int(raw)


_MAX_CURSOR = 2**63 - 1
"""The largest number a cursor holds: an event id or a time in ms, each a signed 64-bit integer in the ledger."""


def _event_cursor(request: Request) -> int | None:
    raw = request.query_params.get("after")
    if raw is not None and (not is_decimal(raw) or len(raw) > 19 or int(raw) > _MAX_CURSOR):
        raise BadQuery("after is the event id of the last entry of the previous page")
    return None if raw is None else int(raw)


def _task_cursor(request: Request) -> TaskCursor | None:
    raw = request.query_params.get("after")
    if raw is None:
        return None
    ms, sep, task_id = raw.partition(":")
    if not sep or not is_decimal(ms) or len(ms) > 19 or int(ms) > _MAX_CURSOR or not task_id or len(task_id) > 400:
        raise BadQuery("after is the cursor the previous page linked to")
    return int(ms), task_id


def _next(path: str, after: str, limit: int | None = None) -> str:
    query = {"after": after, **({"limit": str(limit)} if limit is not None else {})}
    return f"{path}?{urlencode(query)}"


def _page(title: str, body: str, *, live: bool = False, status_code: int = 200) -> HTMLResponse:
    page = html_document(
        title, f"<h1>{html.escape(title)}</h1>{body}", stylesheet=STYLESHEET, refresh_s=REFRESH_S if live else None
    )
    return HTMLResponse(page, status_code)


def _paged(rows: list[Any], limit: int, path: str, cursor: Callable[[], str]) -> JSONResponse:
    """``rows`` as JSON, with a ``Link`` to the page after ``cursor()`` when this one is full."""
    headers = {"Link": f'<{_next(path, cursor(), limit)}>; rel="next"'} if len(rows) == limit else {}
    return JSONResponse(rows, headers=headers)


def ui_app(
    ledger: Ledger,
    *,
    temporal_ui: str | None = None,
    namespace: str = "default",
    token: str | None = None,
    allowed_hosts: Iterable[str] = LOOPBACK_NAMES,
) -> Starlette:
    """The web view over ``ledger`` (the caller closes it), linking to the Temporal UI at ``temporal_ui``
    (``None``: no links) in ``namespace``, answering ``allowed_hosts`` (default loopback's) and requiring
    ``token`` on every request unless ``None`` (:mod:`agentlease.ui.guard`)."""

    async def run_tasks(run_id: str, after: TaskCursor | None, limit: int) -> list[TaskRecord]:
        query = tasks_page(TaskFilter(agent_run_id=run_id), after, limit)
        rows = await ledger.database.read(lambda conn: conn.execute(query).all())
        return [TaskRecord.from_row(row) for row in rows]

    async def trail(task_id: str, after: int | None, limit: int) -> list[LeaseEvent]:
        return await collect(event_pages(ledger.database, task_id=task_id, after=after, limit=limit))

    def task_cursor(records: list[TaskRecord]) -> str:
        return f"{to_ms(records[-1].created_at)}:{records[-1].task_id}"

    async def front_page(request: Request) -> Response:
        status = request.query_params.get("status", "")
        tool = request.query_params.get("tool", "")[:200]
        hours = request.query_params.get("hours", "")
        if status not in ("", *LedgerRunState):
            raise BadQuery(f"status is {', '.join(LedgerRunState)}")
        if hours and not (is_decimal(hours) and len(hours) <= 6):
            raise BadQuery("hours is a whole number")
        waiting_query = tasks_page(TaskFilter(waiting=True), None, RUNS_PER_PAGE)
        runs_query = runs_page(None, RUNS_PER_PAGE, waiting_only=status == LedgerRunState.WAITING)

        def read(conn: Any) -> tuple[Any, Any, Any, Any, dict[str, str]]:
            waiting_rows = conn.execute(waiting_query).all()
            run_rows = conn.execute(runs_query).all()
            ids = [row.agent_run_id for row in run_rows]
            runs_with_tool = select(TASKS.c.agent_run_id).where(TASKS.c.agent_run_id.in_(ids), TASKS.c.tool == tool)
            with_tool = set(conn.execute(runs_with_tool).scalars()) if tool and ids else set()
            now = conn.execute(select(ledger.now_expression), {"now_ms": None}).scalar()
            return waiting_rows, run_rows, with_tool, now, run_failures(conn, ids)

        waiting_rows, run_rows, with_tool, now_ms, failures = await ledger.database.read(read)
        waiting = [TaskRecord.from_row(row) for row in waiting_rows]
        runs = [RunSummary.from_row(row, error=failures.get(row.agent_run_id)) for row in run_rows]
        if tool:
            waiting = [t for t in waiting if t.tool == tool]
            runs = [r for r in runs if r.agent_run_id in with_tool]
        if status:
            runs = [r for r in runs if r.status.value == status]
        if hours:
            cutoff = from_ms(int(now_ms) - int(hours) * 3_600_000)
            runs = [r for r in runs if cutoff is None or r.updated_at >= cutoff]
            waiting = [t for t in waiting if cutoff is None or t.updated_at >= cutoff]
        runs.sort(
            key=lambda r: (
                r.status is not LedgerRunState.WAITING,
                r.status is not LedgerRunState.RUNNING,
                r.agent_run_id,
            )
        )
        live = any(r.status in (LedgerRunState.WAITING, LedgerRunState.RUNNING) for r in runs)
        more = f"<p class='muted'>the first {RUNS_PER_PAGE} runs by id; <code>agentlease runs</code> lists them all</p>"
        live_note = f"<p class='muted' id='live'>refreshes every {REFRESH_S}s while runs are under way</p>"
        body = (
            f"<h2>Waiting for a person</h2>{_waiting_table(waiting)}<h2>Runs</h2>{_filters(status, tool, hours)}"
            f"{_runs_table(runs)}{more if len(run_rows) == RUNS_PER_PAGE else ''}{live_note if live else ''}"
        )
        return _page("agentlease runs", body, live=live)

    async def stylesheet(request: Request) -> Response:
        return PlainTextResponse(STYLE, media_type="text/css")

    async def run_page(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        records = await run_tasks(run_id, _task_cursor(request), TASKS_PER_PAGE)
        if not records:
            return _page("not found", f"no run {html.escape(run_id)!r}", status_code=404)
        link = temporal_ui_link(temporal_ui, namespace, records[0].trace.workflow_id or run_id)
        waiting = [r for r in records if r.status.waits_for_person]
        running = [r for r in records if not r.status.is_terminal]
        failed = [r for r in records if failed_before_calls(r)]
        state = LedgerRunState.of(failed=bool(failed), waiting=len(waiting), unfinished=len(running))
        decided = await ledger.database.read(lambda conn: conn.execute(last_decision_query(run_id)).first())
        last = (
            f"{decided.kind} of {html.escape(decided.task_id.rsplit('/', 1)[-1])} at "
            f"{_when(from_ms(decided.at_ms))}: {html.escape(decided.reason or '')}"
            if decided
            else "none"
        )
        to_ui = f" | <a class='temporal-ui' href='{html.escape(link)}'>the run in the Temporal UI</a>" if link else ""
        why = html.escape(failed[0].last_error or "") if failed else ""
        error = f"<p class='run-error' id='run-error'>the run failed: {why}</p>" if failed else ""
        body = (
            f"<p><a href='/'>all runs</a>{to_ui}</p>"
            f"<p>status <span class='pill status-{state.value}' id='run-status'>{state.value}</span>, "
            f"{len(records)} task(s), last decision: <span id='last-decision'>{last}</span></p>"
            f"{error}{_waiting_table(waiting) if waiting else ''}{_tasks_table(records)}"
        )
        if len(records) == TASKS_PER_PAGE:
            following = _next(f"/runs/{quote(run_id, safe='')}", task_cursor(records))
            body += f"<p><a id='next' href='{html.escape(following)}'>next {TASKS_PER_PAGE} tasks</a></p>"
        return _page(f"agent run {run_id}", body, live=bool(running))

    async def task_page(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        after = _event_cursor(request)
        try:
            task = await ledger.get_task(task_id)
        except TaskNotFoundError:
            return _page("not found", f"no task {html.escape(task_id)!r}", status_code=404)
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
            stylesheet=STYLESHEET,
            refresh_s=None if task.status.is_terminal or after is not None else REFRESH_S,
        )
        return HTMLResponse(page)

    async def run_tasks_json(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        limit = _limit(request, TASKS_PER_PAGE)
        after = _task_cursor(request)
        records = await run_tasks(run_id, after, limit)
        if not records and after is None:
            return JSONResponse({"error": "no_such_run"}, 404)
        path = f"/api/runs/{quote(run_id, safe='')}/tasks"
        return _paged([redact(r.as_json()) for r in records], limit, path, lambda: task_cursor(records))

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
        path = f"/api/events/{quote(task_id, safe='/')}"
        return _paged(
            [redact(e.model_dump(mode="json")) for e in events], limit, path, lambda: str(events[-1].event_id)
        )

    def bad_query(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "bad_query", "detail": str(exc)}, 400)

    def unstorable(request: Request, exc: Exception) -> Response:
        # An id or filter the ledger refused to compare (PostgreSQL: a NUL byte): no row can hold it.
        return bad_query(request, BadQuery("the request holds a character no ledger value can (a NUL byte)"))

    app = Starlette(
        routes=[
            Route("/", front_page, methods=["GET"]),
            Route(STYLESHEET, stylesheet, methods=["GET"]),
            Route("/runs/{run_id}", run_page, methods=["GET"]),
            Route("/tasks/{task_id:path}", task_page, methods=["GET"]),
            Route("/api/runs/{run_id}/tasks", run_tasks_json, methods=["GET"]),
            Route("/api/events/{task_id:path}", task_events_json, methods=["GET"]),
            Route("/api/tasks/{task_id:path}", task_json, methods=["GET"]),
        ],
        exception_handlers={BadQuery: bad_query, LedgerRefusedValueError: unstorable},
    )
    app.add_middleware(UiGuard, allowed_hosts=allowed_hosts, token=token)
    return app


__all__ = ["EVENTS_PER_PAGE", "MAX_LIMIT", "RUNS_PER_PAGE", "TASKS_PER_PAGE", "temporal_ui_link", "ui_app"]
