"""``agentlease redrive`` and ``agentlease cancel`` by filter: the tasks chosen from the ledger among those the
decision applies to, confirmed (``--yes``, required without a terminal), then decided one at a time; a refusal
does not stop the others."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import typer
from rich.console import Console

from agentlease.cli.render import tasks_table
from agentlease.decisions.table import DECISIONS
from agentlease.enums import DecisionKind, TaskStatus
from agentlease.errors import AgentLeaseError, ConfigurationError, printable
from agentlease.ledger.listing import TaskFilter, task_pages
from agentlease.ledger.store import Ledger
from agentlease.records import TaskRecord


async def select_tasks(
    ledger: Ledger, kind: DecisionKind, agent_run_id: str | None, statuses: frozenset[TaskStatus], tool: str | None
) -> list[TaskRecord]:
    """The tasks a bulk ``kind`` decides: those matching the filters, in a status ``kind`` applies to.
    ConfigurationError: a ``--status`` it does not apply to; AgentLeaseError: no task matches."""
    rule = DECISIONS[kind]
    wrong = sorted(s.value for s in statuses - rule.applies_to)
    if wrong:
        allowed = ", ".join(sorted(s.value for s in rule.applies_to))
        raise ConfigurationError(f"bad --status {', '.join(wrong)}: {kind.value} applies to {allowed}")
    which = TaskFilter(agent_run_id=agent_run_id, statuses=statuses or rule.applies_to)
    chosen = [
        task
        for page in [p async for p in task_pages(ledger.database, which)]
        for task in page
        if tool is None or task.tool == tool
    ]
    if not chosen:
        given = {"run": agent_run_id, "status": ",".join(sorted(s.value for s in statuses)), "tool": tool}
        filters = ", ".join(f"{name} {value}" for name, value in given.items() if value)
        raise AgentLeaseError(f"no task to {kind.value} matches {filters}")
    return chosen


def confirm_bulk(chosen: list[TaskRecord], kind: DecisionKind, *, yes: bool, out: Console, err: Console) -> None:
    """Show the chosen tasks and ask before deciding them (``yes``: don't). ConfigurationError: no terminal to
    ask on; AgentLeaseError: answered no."""
    if yes:
        return
    out.print(tasks_table(chosen, title=f"tasks to {kind.value}"))
    if not sys.stdin.isatty():
        raise ConfigurationError(
            f"{kind.value} of {len(chosen)} task(s) needs a confirmation: run it in a terminal or pass --yes"
        )
    if not typer.confirm(f"{kind.value} these {len(chosen)} task(s)?", default=False, err=True):
        raise AgentLeaseError(f"not confirmed: no task was sent a {kind.value}")


async def decide_each(
    chosen: list[TaskRecord],
    send: Callable[[TaskRecord], Awaitable[Any]],
    *,
    kind: DecisionKind,
    as_json: bool,
    out: Console,
    err: Console,
) -> int:
    """Send the decision to each task's run, one at a time; print each outcome. Returns how many failed."""
    outcomes: list[dict[str, Any]] = []
    for task in chosen:
        try:
            await send(task)
        except AgentLeaseError as exc:
            outcomes.append({"task_id": task.task_id, "agent_run_id": task.agent_run_id, "error": str(exc)})
            err.print(printable(f"{task.agent_run_id} {task.step_id}: not decided: {exc}"), markup=False)
        else:
            outcomes.append({"task_id": task.task_id, "agent_run_id": task.agent_run_id, "error": None})
            if not as_json:
                out.print(f"{task.agent_run_id} {task.step_id}: {kind.value} sent", markup=False)
    if as_json:
        out.file.write(json.dumps(outcomes, indent=2) + "\n")
    return sum(o["error"] is not None for o in outcomes)


__all__ = ["confirm_bulk", "decide_each", "select_tasks"]
