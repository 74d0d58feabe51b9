"""What the ledger records, read by operators: ``tasks``, ``runs``, ``events``, ``waiting``, ``advise-ttl``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from agentlease.cli.session import in_ledger, out
from agentlease.cli.session import settings as _settings
from agentlease.enums import LedgerRunState, RunState
from agentlease.errors import AgentLeaseError, ConfigurationError
from agentlease.settings import AgentLeaseSettings

_Limit = Annotated[int | None, typer.Option("--limit", help="At most this many rows (a table shows 100 unless told).")]
_JsonList = Annotated[bool, typer.Option("--json", help="Print JSON: an array streamed a record at a time.")]


def tasks(
    ctx: typer.Context,
    run_filter: Annotated[str | None, typer.Option("--run", help="Only this agent run.")] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Only tasks in this status (repeat, or comma-separate).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only tasks created since: 15m, 2h, 7d, or an ISO 8601 time.")
    ] = None,
    limit: _Limit = None,
    as_json: _JsonList = False,
) -> None:
    """List tasks as the ledger records them, oldest first."""
    from agentlease.cli.listings import check_limit, list_tasks, parse_since, parse_statuses
    from agentlease.clock import to_ms
    from agentlease.ledger.listing import TaskFilter

    check_limit(limit)
    which = TaskFilter(
        agent_run_id=run_filter,
        statuses=parse_statuses(status),
        since_ms=None if since is None else to_ms(parse_since(since)),
    )
    in_ledger(_settings(ctx), lambda ledger: list_tasks(ledger, which, limit=limit, as_json=as_json, out=out))


def runs(
    ctx: typer.Context,
    waiting_only: Annotated[
        bool, typer.Option("--waiting", help="Only runs with a task waiting for a person.")
    ] = False,
    status: Annotated[
        str | None,
        typer.Option("--status", help="Only runs in this state: running, waiting, tasks_final or failed."),
    ] = None,
    limit: _Limit = None,
    as_json: _JsonList = False,
) -> None:
    """List agent runs from the ledger, with how many of their tasks wait, are final, are settled (and why a
    failed run failed)."""
    from agentlease.cli.listings import check_limit, list_runs

    check_limit(limit)
    if status == RunState.COMPLETED.value:
        raise ConfigurationError(
            "bad --status 'completed': the ledger knows a run's tool calls, not whether its workflow ended; "
            "--status tasks_final lists runs whose every task is final; agentlease status RUN_ID tells a run's end"
        )
    if status is not None and status not in LedgerRunState.__members__.values():
        raise ConfigurationError(f"bad --status {status!r}: one of {', '.join(LedgerRunState)}")
    wanted = None if status is None else LedgerRunState(status)
    waiting_only = waiting_only or wanted is LedgerRunState.WAITING
    in_ledger(
        _settings(ctx),
        lambda ledger: list_runs(
            ledger, waiting_only=waiting_only, state=wanted, limit=limit, as_json=as_json, out=out
        ),
    )


def events(
    ctx: typer.Context,
    task_id: Annotated[str | None, typer.Argument(help="A task id; omit with --run.")] = None,
    run_filter: Annotated[str | None, typer.Option("--run", help="Every task of this agent run.")] = None,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind", help="Only entries of this kind (repeat, or comma-separate): claimed, renewed, lease_lost..."
        ),
    ] = None,
    generation: Annotated[
        int | None, typer.Option("--generation", min=0, help="Only entries of this claim generation.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep printing new entries as they are written, until Ctrl-C.")
    ] = False,
    limit: _Limit = None,
    as_json: _JsonList = False,
    html_file: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Write the timeline (a task's, or every task's of --run) to this self-contained HTML file."
        ),
    ] = None,
) -> None:
    """Show the evidence trail: claims, renewals, releases, settles, lease losses, late results.

    ``--kind`` and ``--generation`` keep some entries: ``--kind lease_lost,late_unapplied --generation 1``
    is what the attempt that lost its lease was refused.
    """
    from agentlease.cli.listings import EventFilter, check_limit, follow_events, list_events, parse_kinds

    if task_id is None and run_filter is None:
        raise ConfigurationError("name a task id or --run RUN_ID")
    check_limit(limit)
    which = EventFilter(kinds=parse_kinds(kind), generation=generation)
    if follow and limit is not None:
        raise ConfigurationError("--follow prints every new entry; it takes no --limit")
    if html_file is not None:
        if follow or as_json or limit is not None or which:
            raise ConfigurationError(
                "--html writes the whole timeline; it takes no --follow, --json, --limit, --kind or --generation"
            )
        _write_timeline(_settings(ctx), task_id, run_filter, html_file)
        return

    async def _list(ledger: Any) -> None:
        if not follow:
            await list_events(
                ledger, task_id=task_id, agent_run_id=run_filter, limit=limit, as_json=as_json, out=out, which=which
            )
            return
        from agentlease.runtime.shutdown import stop_event

        await follow_events(
            ledger, task_id=task_id, agent_run_id=run_filter, as_json=as_json, out=out, stop=stop_event(), which=which
        )

    in_ledger(_settings(ctx), _list)


def _write_timeline(settings: AgentLeaseSettings, task_id: str | None, agent_run_id: str | None, path: Path) -> None:
    """``events --html``: the timeline page of a task (or of every task of a run) as one file."""
    from agentlease.cli.listings import require_subject
    from agentlease.ui.timeline import run_timelines_page, timeline_page

    async def _page(ledger: Any) -> str:
        await require_subject(ledger, task_id, agent_run_id)
        if task_id is not None:
            return timeline_page(await ledger.get_task(task_id), await ledger.events(task_id))
        assert agent_run_id is not None
        tasks = [(task, await ledger.events(task.task_id)) for task in await ledger.list_tasks(agent_run_id)]
        return run_timelines_page(agent_run_id, tasks)

    page = in_ledger(settings, _page)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise AgentLeaseError(f"cannot write {path}: {exc.strerror or exc}") from None
    out.print(f"wrote the lease timeline of {task_id or agent_run_id} to {path}", markup=False)


def waiting(ctx: typer.Context, limit: _Limit = None, as_json: _JsonList = False) -> None:
    """List every task waiting for a person, why, and the commands that decide it (from the ledger)."""
    from agentlease.cli.listings import check_limit, list_waiting

    check_limit(limit)
    in_ledger(_settings(ctx), lambda ledger: list_waiting(ledger, limit=limit, as_json=as_json, out=out))


def advise_ttl(
    ctx: typer.Context,
    tool: Annotated[str | None, typer.Option("--tool", help="Only this tool.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only renewals since: an ISO time or 30m, 12h, 7d back.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Recommend a lease TTL per tool from the renewal history (gaps, stage durations, expiries).

    Shows each tool's sample counts; recommends nothing from fewer than 20 gaps between holder writes
    (exit 1 when no tool has that many).
    """
    from agentlease.cli.advice import show_advice
    from agentlease.recovery.ttl_advice import advise, read_samples, since_argument

    async def _advise(ledger: Any) -> list[Any]:
        start = None
        if since is not None:
            try:
                start = since_argument(since, await ledger.db_now())
            except ValueError as exc:
                raise ConfigurationError(f"bad --since: {exc}") from None
        return advise(await read_samples(ledger, tool=tool, since=start))

    advice = in_ledger(_settings(ctx), _advise)
    if not advice:
        raise AgentLeaseError(f"no renewal history{f' for tool {tool}' if tool else ''} in the ledger yet")
    show_advice(advice, out, as_json=as_json)
