"""The CLI's listings of the ledger (``tasks``, ``runs``, ``waiting``, ``events``): keyset pages, streamed as
JSON or shown as one bounded table page; nothing loads the whole ledger (``docs/operations.md``)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

from rich.console import Console

from agentlease.cli.render import (
    EVENT_COLUMNS,
    event_cells,
    events_table,
    plain,
    runs_table,
    tasks_table,
    write_json_array,
    write_json_lines,
)
from agentlease.decisions.table import WAITING_WHY, suggested_commands
from agentlease.enums import EventKind, LedgerRunState, TaskStatus
from agentlease.errors import AgentLeaseError, ConfigurationError
from agentlease.ledger.listing import (
    TaskFilter,
    event_pages,
    failed_before_calls,
    has_run,
    has_task,
    run_pages,
    task_pages,
)
from agentlease.ledger.store import Ledger
from agentlease.records import LeaseEvent, TaskRecord

T = TypeVar("T")
E = TypeVar("E", bound=Enum)

TABLE_ROWS = 100
"""Rows a table shows when ``--limit`` is not given (JSON output streams every row)."""

FOLLOW_INTERVAL_S = 1.0
"""How often ``events --follow`` polls the trail. Default 1s."""

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """``--since``: a time ago (``90s``, ``15m``, ``2h``, ``7d``) or an ISO 8601 time with its zone; else
    ConfigurationError."""
    text = text.strip()
    relative = _RELATIVE.fullmatch(text)
    if relative:
        try:
            return (now or datetime.now(UTC)) - timedelta(**{_UNITS[relative[2]]: float(relative[1])})
        except (OverflowError, ValueError):
            raise ConfigurationError(f"bad --since {text!r}: further back than the calendar goes") from None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise ConfigurationError(
            f"bad --since {text!r}: give a time ago (90s, 15m, 2h, 7d) or an ISO 8601 time such as 2026-11-30T09:00Z"
        ) from None
    if when.tzinfo is None:
        raise ConfigurationError(f"bad --since {text!r}: give the time zone, e.g. 2026-11-30T09:00Z or +01:00")
    return when


def _parse_each(values: list[str] | None, kind: type[E], flag: str) -> frozenset[E]:
    """Repeatable, comma-separated ``flag`` values as members of ``kind`` (else ConfigurationError)."""
    parsed = set()
    for value in (part.strip() for given in values or [] for part in given.split(",")):
        if value:
            try:
                parsed.add(kind(value))
            except ValueError:
                raise ConfigurationError(f"bad {flag} {value!r}: one of {', '.join(m.value for m in kind)}") from None
    return frozenset(parsed)


def parse_statuses(values: list[str] | None) -> frozenset[TaskStatus]:
    """``--status`` values (repeatable, or comma-separated) as task statuses; ConfigurationError for another."""
    return _parse_each(values, TaskStatus, "--status")


@dataclass(frozen=True)
class EventFilter:
    """``events --kind/--generation``: only entries of ``kinds`` (empty: every kind) and of ``generation``
    (``None``: every one)."""

    kinds: frozenset[EventKind] = frozenset()
    generation: int | None = None

    def __bool__(self) -> bool:
        return bool(self.kinds) or self.generation is not None

    def keeps(self, event: LeaseEvent) -> bool:
        return (not self.kinds or event.kind in self.kinds) and (
            self.generation is None or event.claim_generation == self.generation
        )

    def describe(self) -> str:
        """`` (kind lease_lost, generation 1)`` for a title; empty without a filter."""
        parts = [f"kind {', '.join(sorted(k.value for k in self.kinds))}"] if self.kinds else []
        parts += [f"generation {self.generation}"] if self.generation is not None else []
        return f" ({'; '.join(parts)})" if parts else ""


def parse_kinds(values: list[str] | None) -> frozenset[EventKind]:
    """``--kind`` values (repeatable, or comma-separated) as entry kinds; ConfigurationError for another."""
    return _parse_each(values, EventKind, "--kind")


async def _kept(pages: AsyncIterator[list[T]], keeps: Callable[[T], bool], limit: int | None) -> AsyncIterator[list[T]]:
    """The rows of ``pages`` that ``keeps``, at most ``limit`` of them."""
    left = limit
    async for page in pages:
        kept = [row for row in page if keeps(row)][:left]
        if kept:
            yield kept
        if left is not None:
            left -= len(kept)
            if left <= 0:
                return


def check_limit(limit: int | None) -> None:
    """Raises ConfigurationError for a ``--limit`` below 1."""
    if limit is not None and limit < 1:
        raise ConfigurationError(f"bad --limit {limit}: at least 1")


async def _first_page(pages: AsyncIterator[list[T]]) -> tuple[list[T], AsyncIterator[list[T]]]:
    """The first page, and the pages with it put back in front."""
    first: list[T] = await anext(pages, [])

    async def again() -> AsyncIterator[list[T]]:
        if first:
            yield first
        async for page in pages:
            yield page

    return first, again()


async def _print_page(
    pages: AsyncIterator[list[T]], limit: int | None, out: Console, render: Any, *, more: str
) -> list[T]:
    """One bounded page as a table, then a line saying how to see more if there is more."""
    shown = limit or TABLE_ROWS
    rows: list[T] = []
    async for page in pages:
        rows.extend(page)
        if len(rows) > shown:
            break
    out.print(render(rows[:shown]))
    if len(rows) > shown:
        out.print(f"(first {shown} shown; {more})", soft_wrap=True, markup=False)
    return rows[:shown]


_MORE = "--limit N shows more, --json streams them all"


def _wanted(limit: int | None, as_json: bool) -> int | None:
    """Rows to read: all (or ``--limit``) for JSON; for a table one more than it shows, to know if there is more."""
    return limit if as_json else (limit or TABLE_ROWS) + 1


async def _show(
    pages: AsyncIterator[list[T]],
    *,
    limit: int | None,
    as_json: bool,
    out: Console,
    render: Any,
    more: str = _MORE,
    as_record: Any = None,
) -> list[T]:
    """Stream ``pages`` as a JSON array, or print their first page as a table. Returns the rows shown in a table."""
    if as_json:
        await write_json_array(pages, out.file, **({} if as_record is None else {"as_json": as_record}))
        return []
    return await _print_page(pages, limit, out, render, more=more)


async def list_tasks(
    ledger: Ledger, which: TaskFilter, *, limit: int | None, as_json: bool, out: Console, title: str = "tasks"
) -> None:
    """``agentlease tasks``: the tasks ``which`` selects, oldest first, then why each step of a failed run failed
    before its first call. AgentLeaseError: ``which`` names a run the ledger has no task of."""
    first, pages = await _first_page(task_pages(ledger.database, which, limit=_wanted(limit, as_json)))
    if not first and which.agent_run_id is not None:
        await require_subject(ledger, None, which.agent_run_id)
    shown = await _show(
        pages, limit=limit, as_json=as_json, out=out, render=lambda rows: tasks_table(rows, title=title)
    )
    for record in shown:  # a step of a run that failed before its first call: why, in one line
        _print_request(record, out)
        if failed_before_calls(record):
            why = f"{record.agent_run_id} {record.step_id}: the run failed: {record.last_error or 'unknown tool'}"
            out.print(why, soft_wrap=True, markup=False, highlight=False)


def _print_request(record: TaskRecord, out: Console) -> None:
    """For a task awaiting approval, the call the person is asked to approve, in one line."""
    if record.status is TaskStatus.AWAITING_APPROVAL and record.approval_request is not None:
        line = f"  {record.agent_run_id} {record.step_id} asks to approve: {record.approval_request.describe()}"
        out.print(line, soft_wrap=True, markup=False, highlight=False)


def _waiting_json(record: TaskRecord) -> dict[str, Any]:
    return {
        **plain(record),
        "suggested_commands": suggested_commands(
            record.status, record.agent_run_id, record.step_id, record.approval_request
        ),
    }


async def list_waiting(ledger: Ledger, *, limit: int | None, as_json: bool, out: Console) -> None:
    """``agentlease waiting``: every task waiting for a person, why, and the commands that decide it."""
    shown = await _show(
        task_pages(ledger.database, TaskFilter(waiting=True), limit=_wanted(limit, as_json)),
        limit=limit,
        as_json=as_json,
        out=out,
        render=lambda rows: tasks_table(rows, title="tasks waiting for a person"),
        more="--limit N shows more, --json lists them all with their commands",
        as_record=_waiting_json,
    )
    for record in shown:
        explained = WAITING_WHY.get(record.status) or record.last_error
        why = f": {explained}" if explained else ""
        out.print(f"{record.agent_run_id} {record.step_id}: {record.status.value}{why}", soft_wrap=True, markup=False)
        _print_request(record, out)
        for hint in suggested_commands(record.status, record.agent_run_id, record.step_id, record.approval_request):
            out.print(f"  -> {hint}", soft_wrap=True, markup=False)


async def list_runs(
    ledger: Ledger, *, waiting_only: bool, state: LedgerRunState | None, limit: int | None, as_json: bool, out: Console
) -> None:
    """``agentlease runs``: agent runs with their tasks' counts, in run id order, then why each failed run failed;
    ``state`` keeps one state, page by page (a run's state depends on all its tasks)."""
    wanted = _wanted(limit, as_json)
    pages = run_pages(ledger.database, waiting_only=waiting_only, limit=None if state else wanted)
    if state is not None:
        pages = _kept(pages, lambda run: run.status is state, wanted)
    shown = await _show(pages, limit=limit, as_json=as_json, out=out, render=runs_table)
    for run in shown:  # why each failed run failed, one line each
        if run.status is LedgerRunState.FAILED:
            out.print(f"{run.agent_run_id}: failed: {run.error}", soft_wrap=True, markup=False, highlight=False)


async def list_events(
    ledger: Ledger,
    *,
    task_id: str | None,
    agent_run_id: str | None,
    limit: int | None,
    as_json: bool,
    out: Console,
    which: EventFilter | None = None,
) -> None:
    """``agentlease events``: the trail of one task or run, in order, only the entries ``which`` keeps.
    AgentLeaseError: the ledger has no such task or run."""
    which = which or EventFilter()
    wanted = _wanted(limit, as_json)
    pages = event_pages(ledger.database, task_id=task_id, agent_run_id=agent_run_id, limit=None if which else wanted)
    if which:
        pages = _kept(pages, which.keeps, wanted)
    first, pages = await _first_page(pages)
    if not first:
        await require_subject(ledger, task_id, agent_run_id)
    title = f"evidence trail of {task_id or agent_run_id}{which.describe()}"
    await _show(pages, limit=limit, as_json=as_json, out=out, render=lambda rows: events_table(rows, title=title))


async def require_subject(ledger: Ledger, task_id: str | None, agent_run_id: str | None) -> None:
    """Raises AgentLeaseError (exit 1) when the ledger has no such task or agent run."""
    if task_id is not None and not await has_task(ledger.database, task_id):
        raise AgentLeaseError(f"no task {task_id!r} in the ledger {ledger.database.url}")
    if agent_run_id is not None and not await has_run(ledger.database, agent_run_id):
        raise AgentLeaseError(f"no agent run {agent_run_id!r} in the ledger {ledger.database.url}")


async def follow_events(
    ledger: Ledger,
    *,
    task_id: str | None,
    agent_run_id: str | None,
    as_json: bool,
    out: Console,
    stop: asyncio.Event,
    interval_s: float = FOLLOW_INTERVAL_S,
    which: EventFilter | None = None,
) -> None:
    """``agentlease events --follow``: the trail so far, then each new entry (JSON lines with ``as_json``) until
    ``stop``, each poll one keyset page after the last entry. AgentLeaseError: no such task or run."""
    await require_subject(ledger, task_id, agent_run_id)
    if not as_json:
        out.print("  ".join(EVENT_COLUMNS), markup=False)
    after: int | None = None
    while not stop.is_set():
        async for page in event_pages(ledger.database, task_id=task_id, agent_run_id=agent_run_id, after=after):
            kept = [event for event in page if which is None or which.keeps(event)]
            if as_json:
                await write_json_lines(_one(kept), out.file)
            else:
                for event in kept:
                    out.print("  ".join(event_cells(event)), soft_wrap=True, markup=False, highlight=False)
            after = page[-1].event_id
        with contextlib.suppress(TimeoutError):  # no stop yet: poll again
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


async def _one(page: list[T]) -> AsyncIterator[list[T]]:
    yield page


__all__ = [
    "FOLLOW_INTERVAL_S",
    "TABLE_ROWS",
    "EventFilter",
    "check_limit",
    "follow_events",
    "list_events",
    "list_runs",
    "list_tasks",
    "list_waiting",
    "parse_kinds",
    "parse_since",
    "parse_statuses",
    "require_subject",
]
