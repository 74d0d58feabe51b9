"""How the CLI shows tasks, runs and the evidence trail (rich tables, or JSON with ``--json``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from rich.table import Table

from agentlease.records import LeaseEvent, RunStatus, SettlementReceipt, TaskRecord


def receipt_text(receipt: SettlementReceipt | None) -> str:
    if receipt is None:
        return "-"
    return f"{receipt.external_system}:{receipt.external_id} ({receipt.status})"


def tasks_table(records: Iterable[TaskRecord], title: str = "tasks") -> Table:
    """Ledger rows: the task, its lease and its receipt."""
    table = Table(title=title, title_justify="left")
    for column in ("task", "tool", "status", "stage", "generation", "attempts", "owner", "receipt"):
        table.add_column(column)
    for record in records:
        table.add_row(
            record.task_id,
            record.tool,
            record.status.value,
            record.stage.value if record.stage else "-",
            str(record.claim_generation),
            str(record.attempts),
            record.lease_owner or "-",
            receipt_text(record.receipt),
        )
    return table


def run_table(status: RunStatus) -> Table:
    """A run as its workflow's ``status`` query reports it."""
    table = Table(title=f"agent run {status.agent_run_id}: {status.status.value}", title_justify="left")
    for column in ("step", "tool", "status", "stage", "generation", "attempts", "receipt / error"):
        table.add_column(column)
    for task in status.tasks:
        table.add_row(
            task.step_id,
            task.tool,
            task.status.value,
            task.stage.value if task.stage else "-",
            "-" if task.claim_generation is None else str(task.claim_generation),
            "-" if task.attempts is None else str(task.attempts),
            task.error or receipt_text(task.receipt),
        )
    return table


def events_table(events: Iterable[LeaseEvent], title: str) -> Table:
    """The evidence trail of one task or run."""
    table = Table(title=title, title_justify="left")
    for column in ("at", "task", "event", "generation", "owner", "stage", "by", "reason"):
        table.add_column(column)
    for ev in events:
        table.add_row(
            ev.at.isoformat(timespec="milliseconds"),
            ev.task_id,
            ev.kind.value,
            str(ev.claim_generation),
            ev.lease_owner or "-",
            ev.stage.value if ev.stage else "-",
            str((ev.details or {}).get("by") or "-"),  # who decided: operators and the sweeper
            ev.reason or "",
        )
    return table


def to_json(value: Any) -> str:
    """JSON text of records, lists of records, or plain data."""
    if isinstance(value, list):
        return json.dumps([_plain(v) for v in value], indent=2)
    return json.dumps(_plain(value), indent=2)


def _plain(value: Any) -> Any:
    if isinstance(value, TaskRecord):
        return value.as_json()
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value
