"""Operator listings of the ledger (tasks, agent runs, the evidence trail) read in keyset pages, each one
indexed query in its own short read transaction (``docs/operations.md``, "Operator queries")."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Select, select
from sqlalchemy.engine import Connection, Row

from agentlease.clock import from_ms
from agentlease.enums import LedgerRunState
from agentlease.ledger.database import LedgerDatabase
from agentlease.ledger.statements import (
    EVENTS,
    PAGE_ROWS,
    TASKS,
    TaskFilter,
    events_page,
    lease_statements,
    run_exists,
    runs_page,
    tasks_page,
)
from agentlease.records import AwareDatetime, LeaseEvent, TaskRecord

UNKNOWN_TOOL_ERROR = "unknown_tool"
"""``tasks.error_class`` of a step of a run whose tool no worker serves: the listings show its run as ``failed``."""

T = TypeVar("T")
C = TypeVar("C")


class RunSummary(BaseModel):
    """One agent run as the ledger sees it (``agentlease runs``).

    Attributes:
        status: what the ledger can tell from its tasks (:class:`~agentlease.enums.LedgerRunState`): ``failed``,
            ``waiting``, ``running`` or ``tasks_final``; the workflow's own state is ``agentlease status``.
        tasks / waiting / final / settled: how many of its tasks the ledger holds, wait for a person,
            are final (settled, cancelled, rejected, abandoned), are settled.
        created_at / updated_at: its first task's recording, its latest change (ledger clock).
        error: why a ``failed`` run failed (one line); ``None`` otherwise.
    """

    model_config = ConfigDict(frozen=True)

    agent_run_id: str
    status: LedgerRunState
    tasks: int
    waiting: int
    final: int
    settled: int
    created_at: AwareDatetime
    updated_at: AwareDatetime
    error: str | None = None

    @classmethod
    def from_row(cls, row: Row[Any], *, error: str | None = None) -> RunSummary:
        """A row of :func:`~agentlease.ledger.statements.runs_page`."""
        status = LedgerRunState.of(failed=error is not None, waiting=row.waiting, unfinished=row.tasks - row.final)
        created, updated = from_ms(row.created_at_ms), from_ms(row.updated_at_ms)
        assert created is not None and updated is not None
        return cls(
            agent_run_id=row.agent_run_id,
            status=status,
            tasks=row.tasks,
            waiting=row.waiting,
            final=row.final,
            settled=row.settled,
            created_at=created,
            updated_at=updated,
            error=error,
        )


def run_failures(conn: Connection, run_ids: Sequence[str]) -> dict[str, str]:
    """Which of ``run_ids`` failed before their first call, and why (their first step whose tool no worker
    serves)."""
    if not run_ids:
        return {}
    query = (
        select(TASKS.c.agent_run_id, TASKS.c.last_error)
        .where(TASKS.c.agent_run_id.in_(sorted(set(run_ids))), TASKS.c.error_class == UNKNOWN_TOOL_ERROR)
        .order_by(TASKS.c.agent_run_id, TASKS.c.created_at_ms, TASKS.c.task_id)
    )
    failures: dict[str, str] = {}
    for run_id, why in conn.execute(query).all():
        failures.setdefault(run_id, why or "a step names a tool no worker serves")
    return failures


def failed_before_calls(record: TaskRecord) -> bool:
    """Whether ``record`` is a step its run never called because no worker serves its tool."""
    return record.error_class == UNKNOWN_TOOL_ERROR


def _fetch(query: Select[Any], conn: Connection) -> Sequence[Row[Any]]:
    return conn.execute(query).all()


async def _pages(
    database: LedgerDatabase,
    page: Callable[[C | None, int], Select[Any]],
    build: Callable[[Any], T],
    cursor_of: Callable[[Any], C],
    *,
    limit: int | None,
    page_rows: int,
    after: C | None = None,
    fetch: Callable[[Select[Any], Connection], Sequence[Any]] = _fetch,
) -> AsyncIterator[list[T]]:
    """Pages of records, each read in its own transaction and built after it ended."""
    left = limit
    while left is None or left > 0:
        size = page_rows if left is None else min(page_rows, left)
        query = page(after, size)
        rows = await database.read(functools.partial(fetch, query))
        if rows:
            yield [build(row) for row in rows]
            after = cursor_of(rows[-1])
        if left is not None:
            left -= len(rows)
        if len(rows) < size:
            return


def task_pages(
    database: LedgerDatabase, which: TaskFilter | None = None, *, limit: int | None = None, page_rows: int = PAGE_ROWS
) -> AsyncIterator[list[TaskRecord]]:
    """The tasks ``which`` selects, oldest first, at most ``limit`` (``None``: all), in pages of ``page_rows``."""
    return _pages(
        database,
        lambda after, size: tasks_page(which or TaskFilter(), after, size),
        TaskRecord.from_row,
        lambda row: (row.created_at_ms, row.task_id),
        limit=limit,
        page_rows=page_rows,
    )


def _fetch_runs(query: Select[Any], conn: Connection) -> Sequence[tuple[Row[Any], str | None]]:
    rows = conn.execute(query).all()
    failures = run_failures(conn, [row.agent_run_id for row in rows])
    return [(row, failures.get(row.agent_run_id)) for row in rows]


def run_pages(
    database: LedgerDatabase, *, waiting_only: bool = False, limit: int | None = None, page_rows: int = PAGE_ROWS
) -> AsyncIterator[list[RunSummary]]:
    """Agent runs in ``agent_run_id`` order (``waiting_only``: those with a task waiting for a person), with why
    each failed run failed."""
    return _pages(
        database,
        lambda after, size: runs_page(after, size, waiting_only=waiting_only),
        lambda pair: RunSummary.from_row(pair[0], error=pair[1]),
        lambda pair: pair[0].agent_run_id,
        limit=limit,
        page_rows=page_rows,
        fetch=_fetch_runs,
    )


def event_pages(
    database: LedgerDatabase,
    *,
    task_id: str | None = None,
    agent_run_id: str | None = None,
    after: int | None = None,
    limit: int | None = None,
    page_rows: int = PAGE_ROWS,
) -> AsyncIterator[list[LeaseEvent]]:
    """The evidence trail in order for one task, one run, or all, after the entry ``after`` (an ``event_id``)."""
    dialect = database.dialect
    return _pages(
        database,
        lambda cursor, size: events_page(dialect, task_id=task_id, agent_run_id=agent_run_id, after=cursor, limit=size),
        LeaseEvent.from_row,
        lambda row: row.event_id,
        limit=limit,
        page_rows=page_rows,
        after=after,
    )


def holder_stage(conn: Connection, task_id: str, generation: int) -> str | None:
    """The last stage generation ``generation`` of ``task_id`` recorded (``None``: none); a refused renewal
    names it (the task row holds the winner's stage by then)."""
    query = (
        select(EVENTS.c.stage)
        .where(EVENTS.c.task_id == task_id, EVENTS.c.claim_generation == generation, EVENTS.c.stage.is_not(None))
        .order_by(EVENTS.c.event_id.desc())
        .limit(1)
    )
    stage = conn.execute(query).scalar()
    return None if stage is None else str(stage)


async def collect(pages: AsyncIterator[list[T]]) -> list[T]:
    """Every record of ``pages`` in one list (for bounded listings: one run, one task)."""
    return [record async for page in pages for record in page]


async def has_run(database: LedgerDatabase, agent_run_id: str) -> bool:
    """Whether the ledger holds any task of ``agent_run_id``."""
    query = run_exists(agent_run_id)
    return await database.read(lambda conn: conn.execute(query).first() is not None)


async def has_task(database: LedgerDatabase, task_id: str) -> bool:
    """Whether the ledger holds the task ``task_id``."""
    query = lease_statements(database.dialect).select_task
    return await database.read(lambda conn: conn.execute(query, {"key_task_id": task_id}).first() is not None)
