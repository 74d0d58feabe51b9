"""How the CLI shows tasks, runs and the evidence trail: rich tables whose column headers are the JSON
keys of ``--json`` (:data:`NAMES`), and JSON streamed a record at a time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from typing import IO, Any

from rich.table import Table

from agentlease.enums import TaskStatus
from agentlease.records import LeaseEvent, RunStatus, SettlementReceipt, TaskRecord

NAMES = {
    "agent_run_id": "the agent run (workflow id)",
    "task_id": "the task (run id + step id)",
    "step_id": "the step of the run",
    "tool": "the tool called",
    "status": "the task's (or run's) status",
    "stage": "the last durable stage",
    "claim_generation": "the claim generation (fencing token); - for none",
    "attempts": "real attempts counted",
    "lease_owner": "the worker holding (or last holding) the lease",
    "since": "when that worker claimed it: the claim time of the current generation",
    "receipt": "the settlement receipt",
    "trace_id": "the OpenTelemetry trace of the attempt (with tracing on)",
    "at": "when, on the ledger's clock",
    "kind": "what the evidence-trail entry records",
    "by": "who decided (a person, the sweeper, a takeover)",
    "reason": "why",
    "suggested_commands": "the commands that decide a waiting task",
}
"""The one set of names of the CLI's listings: each is a table's column header and the JSON key of
the same field (``tasks``, ``events``, ``waiting``; ``tests/unit/test_cli_names.py`` checks it)."""

TASK_COLUMNS = (
    *("task_id", "tool", "status", "stage", "claim_generation", "attempts"),
    *("lease_owner", "since", "receipt", "trace_id"),
)
EVENT_COLUMNS = ("at", "task_id", "kind", "claim_generation", "lease_owner", "stage", "by", "reason", "trace_id")
RUN_COLUMNS = ("agent_run_id", "status", "tasks", "waiting", "final", "settled", "created_at", "updated_at")
STEP_COLUMNS = ("step_id", "tool", "status", "stage", "claim_generation", "attempts", "receipt / error")


def receipt_text(receipt: SettlementReceipt | None) -> str:
    if receipt is None:
        return "-"
    return f"{receipt.external_system}:{receipt.external_id} ({receipt.status})"


def generation_text(generation: int | None) -> str:
    """A claim generation for a table: ``-`` for a task never claimed (generation 0) or not known."""
    return "-" if not generation else str(generation)


def _table(title: str, columns: Iterable[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        # A trace id is copied whole into a trace viewer: never wrapped.
        table.add_column(column, no_wrap=column == "trace_id", min_width=32 if column == "trace_id" else None)
    return table


def _filled(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    """A table of ``rows``, without the trace id column when no row has a trace (tracing off)."""
    if "trace_id" in columns and all(row[columns.index("trace_id")] == "-" for row in rows):
        keep = [i for i, column in enumerate(columns) if column != "trace_id"]
        columns = tuple(columns[i] for i in keep)
        rows = [tuple(row[i] for i in keep) for row in rows]
    table = _table(title, columns)
    for row in rows:
        table.add_row(*row)
    return table


def since_text(record: TaskRecord) -> str:
    """When the current (or last) holder claimed the task, to the second; ``-`` when never claimed."""
    return "-" if record.lease_acquired_at is None else record.lease_acquired_at.isoformat(timespec="seconds")


def task_cells(record: TaskRecord) -> tuple[str, ...]:
    return (
        record.task_id,
        record.tool,
        record.status.value,
        record.stage.value if record.stage else "-",
        generation_text(record.claim_generation),
        str(record.attempts),
        record.lease_owner or "-",
        since_text(record),
        receipt_text(record.receipt),
        record.trace.trace_id or "-",
    )


def tasks_table(records: Iterable[TaskRecord], title: str = "tasks") -> Table:
    """Ledger rows: the task, its lease (who holds it, since when, which generation) and its receipt."""
    return _filled(title, TASK_COLUMNS, [task_cells(record) for record in records])


def decided_title(status: RunStatus, decision: str, step_id: str | None) -> str:
    """The heading of a decision's answer: the run's state, and the decided step's status after it,
    so the heading and the step's row say the same thing."""
    heading = f"agent run {status.agent_run_id}: {status.status.value}"
    step = next((t for t in status.tasks if t.step_id == step_id), None)
    if step is None:
        return f"{heading} after {decision}"
    return f"{heading}; after {decision}, step {step.step_id} is {step.status.value}"


def run_table(status: RunStatus, title: str | None = None) -> Table:
    """A run as its workflow's ``status`` query reports it (``title``: default the run's id and state)."""
    table = _table(title or f"agent run {status.agent_run_id}: {status.status.value}", STEP_COLUMNS)
    for task in status.tasks:
        table.add_row(
            task.step_id,
            task.tool,
            task.status.value,
            task.stage.value if task.stage else "-",
            generation_text(task.claim_generation),
            "-" if task.attempts is None else str(task.attempts),
            task.error or receipt_text(task.receipt),
        )
    notes = [f"last decision: {status.last_decision}"] if status.last_decision else []
    notes += [
        f"refused {r.decision} signal ({r.step_id or '-'}, by {r.by or '?'}): {r.refusal}" for r in status.refused
    ]
    if status.refused_count > len(status.refused):
        notes.append(f"{status.refused_count} decide signals refused in all (summarised in the trail)")
    notes += [f"{t.step_id}: {t.refused_writes} late writes refused" for t in status.tasks if t.refused_writes]
    notes += [
        f"{t.step_id} asks to approve: {t.approval_request.describe()}"
        for t in status.tasks
        if t.status is TaskStatus.AWAITING_APPROVAL and t.approval_request is not None
    ]
    if status.refused_progress:
        notes.append(f"{status.refused_progress} lease progress signals refused (no proof of the lease)")
    if notes:
        table.caption = "\n".join(notes)
        table.caption_justify = "left"
    return table


def runs_table(runs: Iterable[Any], title: str = "agent runs in the ledger") -> Table:
    """Agent runs as the ledger sees them (:class:`~agentlease.ledger.listing.RunSummary`)."""
    return _filled(title, RUN_COLUMNS, [_run_cells(run) for run in runs])


def _run_cells(run: Any) -> tuple[str, ...]:
    counts = (run.tasks, run.waiting, run.final, run.settled)
    times = (run.created_at.isoformat(timespec="seconds"), run.updated_at.isoformat(timespec="seconds"))
    return (run.agent_run_id, run.status.value, *map(str, counts), *times)


def event_by(event: LeaseEvent) -> str | None:
    """Who made the change, when a person (or the sweeper, or a takeover) did: ``details["by"]``."""
    who = (event.details or {}).get("by")
    return None if who is None else str(who)


def event_cells(ev: LeaseEvent) -> tuple[str, ...]:
    return (
        ev.at.isoformat(timespec="milliseconds"),
        ev.task_id,
        ev.kind.value,
        str(ev.claim_generation),
        ev.lease_owner or "-",
        ev.stage.value if ev.stage else "-",
        event_by(ev) or "-",
        ev.reason or "",
        ev.trace.trace_id or "-",
    )


def events_table(events: Iterable[LeaseEvent], title: str) -> Table:
    """The evidence trail of one task or run."""
    return _filled(title, EVENT_COLUMNS, [event_cells(ev) for ev in events])


def to_json(value: Any) -> str:
    """JSON text of records, lists of records, or plain data."""
    return json.dumps([plain(v) for v in value] if isinstance(value, list) else plain(value), indent=2)


def plain(value: Any) -> Any:
    """The JSON form of a record: a task (:meth:`TaskRecord.as_json`), an event (with ``by``), any model."""
    if isinstance(value, TaskRecord):
        since = None if value.lease_acquired_at is None else value.lease_acquired_at.isoformat()
        return {**value.as_json(), "since": since, "trace_id": value.trace.trace_id}
    if isinstance(value, LeaseEvent):
        return {**value.model_dump(mode="json"), "by": event_by(value), "trace_id": value.trace.trace_id}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


async def write_json_array(
    pages: AsyncIterator[list[Any]], out: IO[str], *, as_json: Callable[[Any], Any] = plain
) -> int:
    """Write the records of ``pages`` as one JSON array, a record at a time. Returns how many."""
    count = 0
    out.write("[")
    async for page in pages:
        for record in page:
            out.write(",\n" if count else "\n")
            out.write(_indented(json.dumps(as_json(record), indent=2)))
            count += 1
    out.write("\n]\n" if count else "]\n")
    out.flush()
    return count


async def write_json_lines(
    pages: AsyncIterator[list[Any]], out: IO[str], *, as_json: Callable[[Any], Any] = plain
) -> int:
    """Write the records of ``pages`` as JSON lines, one record per line. Returns how many."""
    count = 0
    async for page in pages:
        for record in page:
            out.write(json.dumps(as_json(record)) + "\n")
            count += 1
        out.flush()
    return count


def _indented(text: str) -> str:
    return "  " + text.replace("\n", "\n  ")
