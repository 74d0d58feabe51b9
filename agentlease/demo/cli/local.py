"""``agentlease demo`` and ``agentlease dev``: the embedded default stack, run for a user."""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from temporalio.client import Client, WorkflowHandle

from agentlease.cli.plans import load_plan
from agentlease.decisions.table import DecisionRequest
from agentlease.demo.cli.agents import DemoAgent, agent_workers, missing_frameworks, start_agent_runs
from agentlease.demo.cli.stack import local_stack
from agentlease.demo.cli.takeover import (
    Takeover,
    Unleased,
    leased_record_key,
    leased_worker,
    plain_record_key,
    plain_worker,
    run_takeover,
    run_unleased,
)
from agentlease.demo.takeover import TAKEOVER_TTL
from agentlease.demo.unleased import HEARTBEAT_TIMEOUT
from agentlease.enums import TaskStatus
from agentlease.errors import AgentLeaseError
from agentlease.ledger.engine import display_url, sqlite_path
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, RunStatus, TaskRecord
from agentlease.runtime.names import STATUS_QUERY
from agentlease.runtime.shutdown import stop_event
from agentlease.settings import AgentLeaseSettings, default_identity
from agentlease.tools._registry import load_registry
from agentlease.worker import running_worker
from agentlease.workflow._plan import AgentRunWorkflow


async def run_demo(
    settings: AgentLeaseSettings, plans_dir: Path, out: Console, err: Console, *, timeout_s: float
) -> bool:
    """Start the stack and tell the demo's story (:mod:`agentlease.demo.cli.takeover`), beside every plan in
    ``plans_dir`` and each example agent run; then a side-by-side table, where to look, and stop. True when
    every task settled. AgentLeaseError: the stack did not start, or runs did not end within ``timeout_s``."""
    registry = load_registry(settings.tool_modules)
    plans = {path.stem: load_plan(path, registry) for path in sorted(plans_dir.glob("*.json"))}
    if not plans:
        raise AgentLeaseError(f"no plans in {plans_dir}")
    say = functools.partial(out.print, markup=False, soft_wrap=True)
    out.print("agentlease demo: a worker paused mid-write, first without a lease, then with agentlease", markup=False)
    for agent in missing_frameworks():
        err.print(
            f"skipping the example agent on {agent.framework}: it is not installed "
            f"(pip install -e '.[{agent.extra}]' adds it)",
            markup=False,
        )
    err.print("starting a Temporal dev server, the example services and the workers...")
    data_dir = settings.data_dir.resolve()
    async with local_stack(settings) as stack, agent_workers(stack.settings) as serving:
        client = stack.env.client
        err.print(
            f"Temporal dev server {stack.settings.temporal_address}, UI {stack.ui_url} (its log: {stack.server_log})",
            markup=False,
        )
        batch = uuid.uuid4().hex[:8]
        plain, leased = plain_worker(stack.settings, data_dir, batch), leased_worker(stack.settings, data_dir)
        try:
            await asyncio.gather(plain.start(), leased.start())
            handles = [
                await _start_plan(client, stack.settings, f"demo-{name}-{batch}", plan) for name, plan in plans.items()
            ]
            agents = await start_agent_runs(client, serving, batch)
            approved: list[str] = []
            beside = asyncio.gather(*(_approving(h, approved) for h in [*handles, *(h for _, h in agents)]))
            try:
                async with asyncio.timeout(timeout_s):
                    say(
                        f"\n1. Without a lease: a plain Temporal activity writes runbooks/{plain_record_key(batch)} "
                        f"(heartbeat timeout {_HEARTBEAT})"
                    )
                    unleased = await run_unleased(stack.settings, client, plain, batch, err)
                    say(_unleased_verdict(unleased))
                    say(
                        f"\n2. With agentlease: a leased tool writes runbooks/{leased_record_key(batch)} "
                        f"(lease TTL {_TTL}, fenced)"
                    )
                    takeover = await run_takeover(stack.settings, client, leased, batch, err, running_worker)
                    say(_leased_verdict(takeover))
                    await beside
            except TimeoutError:
                raise AgentLeaseError(f"the demo runs did not finish within {timeout_s:.0f}s") from None
            finally:
                beside.cancel()
        finally:
            await asyncio.gather(plain.stop(), leased.stop())
        ledger = Ledger.from_url(stack.settings.ledger_url)
        try:
            by_run = {h.id: await ledger.list_tasks(h.id) for h in [*handles, *(h for _, h in agents)]}
            by_run[takeover.run_id] = await ledger.list_tasks(takeover.run_id)
        finally:
            await ledger.close()
    out.print()
    out.print(side_by_side(unleased, takeover), width=min(out.width, TABLE_WIDTH))
    records = [r for run in by_run.values() for r in run]
    for line in _beside_lines(plans, by_run, handles, agents, approved, batch):
        say(line)
    out.print(f"{sum(r.status is TaskStatus.SETTLED for r in records)}/{len(records)} tasks settled")
    _where_to_look(out, unleased, takeover, settings, stack.settings)
    expected = sum(len(plan.steps) for plan in plans.values())
    plan_tasks = sum(len(by_run[h.id]) for h in handles)
    settled = all(r.status is TaskStatus.SETTLED for r in records) and plan_tasks == expected
    settled = settled and all(by_run[h.id] for _, h in agents)
    return settled and bool(by_run[takeover.run_id])


TABLE_WIDTH = 100
"""The demo's table fits this many columns."""

DEV_UI_PORT = 8233
"""The Temporal UI's port of ``agentlease dev`` (its ``--ui-port`` default)."""

EXAMPLE_PLANS = Path(__file__).resolve().parents[1] / "plans"
"""The bundled plans, where the package is installed: ``agentlease demo`` runs them, ``agentlease dev`` names one."""

_HEARTBEAT = f"{HEARTBEAT_TIMEOUT.total_seconds():g}s"
_TTL = f"{TAKEOVER_TTL.total_seconds():g}s"


async def _start_plan(
    client: Client, settings: AgentLeaseSettings, run_id: str, plan: AgentRunPlan
) -> WorkflowHandle[Any, Any]:
    planned = plan.model_copy(update={"agent_run_id": run_id})
    return await client.start_workflow(AgentRunWorkflow.run, planned, id=run_id, task_queue=settings.task_queue)


def _writes(writes: list[str]) -> str:
    return f"{len(writes)} write{'' if len(writes) == 1 else 's'}"


def _unleased_verdict(shown: Unleased) -> str:
    """What landed without a lease, counted at the downstream."""
    order = ", then ".join(shown.writes)
    return f"   => without a lease: {_writes(shown.writes)} landed: {order}"


def _leased_verdict(shown: Takeover) -> str:
    """What landed with agentlease, counted at the downstream, and what was refused."""
    late = "the late write of generation 1 was refused" if shown.late_write_refused else "generation 1 wrote nothing"
    return f"   => with agentlease: {_writes(shown.writes)} landed: {', then '.join(shown.writes)}; {late}"


def side_by_side(unleased: Unleased, takeover: Takeover) -> Table:
    """The paused call without and with a lease: what landed, what happened to the late write and result."""
    refused = f"refused by the fence (generation 1 < {takeover.generation})"
    table = Table(title="the paused call, side by side", title_justify="left")
    for column in ("", "without a lease", "with agentlease"):
        table.add_column(column)
    table.add_row("run", unleased.run_id, takeover.run_id)
    table.add_row("writes that landed", str(len(unleased.writes)), str(len(takeover.writes)))
    table.add_row(
        "the paused worker's late write",
        "landed, after the retry's" if len(unleased.writes) > 1 else "did not land",
        refused if takeover.late_write_refused else "not written",
    )
    table.add_row(
        "its result", "ignored by Temporal: the attempt had timed out", "kept as late_unapplied, never applied"
    )
    table.add_row("the call was done by", unleased.writes[0] if unleased.writes else "-", *takeover.writes[:1] or ["-"])
    return table


def _beside_lines(
    plans: dict[str, AgentRunPlan],
    by_run: dict[str, list[TaskRecord]],
    handles: list[WorkflowHandle[Any, Any]],
    agents: list[tuple[DemoAgent, WorkflowHandle[Any, Any]]],
    approved: list[str],
    batch: str,
) -> list[str]:
    """The plans and agents that ran beside the story, in a few lines."""
    plan_calls = sum(len(by_run[h.id]) for h in handles)
    approvals = f", {len(approved)} unsafe step(s) approved as operator 'agentlease demo'" if approved else ""
    lines = [f"beside it, as runs demo-*-{batch}: {len(plans)} plans, {plan_calls} tool calls{approvals}"]
    if agents:
        calls = sum(len(by_run[h.id]) for _, h in agents)
        frameworks = " and ".join(agent.framework for agent, _ in agents)
        lines.append(f"  {len(agents)} agents on {frameworks}, scripted models (no API key): {calls} tool calls")
    return lines


def agentlease_command() -> str:
    """This CLI as the user's shell runs it: ``agentlease`` when that is on ``PATH`` and is this one, else
    its path (relative to the working directory when it is under it, as ``.venv/bin/agentlease``)."""
    script = Path(sys.argv[0])
    if script.name != "agentlease":  # python -m agentlease.cli.app
        script = Path(sys.executable).parent / "agentlease"
    found = shutil.which("agentlease")
    if found is not None and Path(found).resolve() == script.resolve():
        return "agentlease"
    try:
        relative = script.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return shlex.quote(str(script.resolve()))
    return shlex.quote(str(relative) if relative.parent != Path(".") else f"./{relative}")


def _where_to_look(
    out: Console, unleased: Unleased, takeover: Takeover, settings: AgentLeaseSettings, stack: AgentLeaseSettings
) -> None:
    """Commands that show the story again, runnable as printed: the servers the demo started are gone,
    so each command says what it starts (the ledger needs none; ``dev`` brings Temporal back on the
    demo's data)."""
    command = agentlease_command()
    default = AgentLeaseSettings.model_fields["ledger_url"].default
    ledger_flag = ""
    if settings.ledger_url == default:
        used, implied = sqlite_path(stack.ledger_url, name="ledger"), sqlite_path(default, name="ledger")
        if used is None or implied is None or used.resolve() != implied.resolve():
            ledger_flag = f" --ledger-url {shlex.quote(stack.ledger_url)}"
    elif display_url(settings.ledger_url) == settings.ledger_url:
        ledger_flag = f" --ledger-url {shlex.quote(settings.ledger_url)}"
    data_flag = ""
    if settings.data_dir.resolve() != AgentLeaseSettings.model_fields["data_dir"].default.resolve():
        data_flag = f" --data-dir {shlex.quote(str(settings.data_dir))}"
    temporal = f"http://127.0.0.1:{DEV_UI_PORT}/namespaces/{settings.namespace}/workflows"
    ui = f"http://{settings.ui_host}:{settings.ui_port}"
    lines = [
        "where to look (the demo has stopped its servers; each command below starts what it needs):",
        f"   {command}{ledger_flag} events {takeover.task_id}",
        "      the leased call's evidence trail: claims, the takeover, the refused late writes",
        f"   {command}{ledger_flag} ui",
        f"      the same as a web page: {ui}/ (task /tasks/{takeover.task_id}); Ctrl-C stops it",
        f"   {command}{data_flag} dev",
        "      Temporal again, on the demo's data, until Ctrl-C; then in its UI:",
        f"      {temporal}/{unleased.run_id} (the plain activity)",
        f"      {temporal}/{takeover.run_id} (the leased tool)",
    ]
    if command != "agentlease" and (Path(sys.executable).parent / "activate").exists():
        lines.append(f"   (or `source {Path(sys.executable).parent / 'activate'}` once, then plain `agentlease ...`)")
    for line in lines:
        out.print(line, markup=False, soft_wrap=True, highlight=False)


async def _approving(handle: WorkflowHandle[Any, Any], approved: list[str]) -> Any:
    """Wait for a demo run (its result), approving its unsafe steps as the operator ``agentlease demo``
    would; each approval is added to ``approved`` (``run/step (tool)``)."""
    result = asyncio.ensure_future(handle.result())
    while not result.done():
        status = await handle.query(STATUS_QUERY, result_type=RunStatus)
        for task in status.tasks:
            if task.status == TaskStatus.AWAITING_APPROVAL.value:
                why = "the demo approves its own plan"
                await handle.execute_update(
                    "approve", DecisionRequest(step_id=task.step_id, by="agentlease demo", reason=why)
                )
                approved.append(f"{status.agent_run_id}/{task.step_id} ({task.tool})")
        await asyncio.wait([result], timeout=0.25)
    return await result


async def run_dev(settings: AgentLeaseSettings, err: Console, *, port: int, ui_port: int, worker: bool = True) -> None:
    """Run the stack (with a ``worker`` in this process unless false) until SIGINT, SIGTERM or SIGHUP."""
    stop = stop_event()
    if worker:
        settings = settings.model_copy(update={"worker_identity": settings.worker_identity or default_identity()})
    async with local_stack(settings, port=port, ui_port=ui_port, worker=worker) as stack:
        s = stack.settings
        ledger_url, sql_url = display_url(s.ledger_url), s.sql_target_url and display_url(s.sql_target_url)
        err.print(f"Temporal UI:      {stack.ui_url}")
        err.print(
            f"Temporal server:  {s.temporal_address} (namespace {s.namespace}, queue {s.task_queue}; "
            f"its log {stack.server_log})",
            markup=False,
        )
        err.print(f"ledger:           {ledger_url}", markup=False)
        err.print(f"decisions:        {s.decision_mode} mode (docs/security-operations.md, Authenticated decisions)")
        if worker:
            tools = ", ".join(load_registry(s.tool_modules).names())
            err.print(
                f"worker:           {s.worker_identity} runs here on queue {s.task_queue} and takes its tool calls "
                f"(tools: {tools}); `agentlease dev --no-worker` runs none",
                markup=False,
            )
        else:
            err.print(
                f"worker:           none runs here (--no-worker): start `agentlease worker` for queue {s.task_queue}"
            )
        if s.metrics_address is not None:
            err.print(f"lease metrics:    http://{s.metrics_address}/metrics")
        err.print(f"example services: files {s.http_base_url}  sql {sql_url}")
        err.print(f"                  publishing {s.publish_base_url}  smtp {s.smtp_host}:{s.smtp_port}")
        err.print("in another shell:")
        lines, masked = export_lines(s)
        for line in lines:
            err.print(f"  {line}", markup=False, highlight=False)
        if masked:
            err.print("  (passwords in URLs are shown as ***: put the real ones in the exports)")
        err.print(f"  agentlease run {shlex.quote(str(EXAMPLE_PLANS / 'restock.json'))} --wait", markup=False)
        err.print("Ctrl-C stops everything.")
        await stop.wait()


def export_lines(settings: AgentLeaseSettings) -> tuple[list[str], bool]:
    """The ``export`` lines a second shell pastes to reach the same stack (Temporal, ledger, tools,
    example services), and whether the ledger URL's password was masked in them."""
    s = settings
    shown_url = display_url(s.ledger_url)
    shown_sql = s.sql_target_url and display_url(s.sql_target_url)

    def pairs(**values: object) -> str:
        given = {k: v for k, v in values.items() if v not in (None, "", [])}
        text = " ".join(
            f"AGENTLEASE_{name.upper()}={shlex.quote(','.join(v) if isinstance(v, list) else str(v))}"
            for name, v in given.items()
        )
        return f"export {text}" if text else ""

    lines = [
        pairs(temporal_address=s.temporal_address, task_queue=s.task_queue),
        pairs(ledger_url=shown_url),
        pairs(namespace=s.namespace, tool_modules=s.tool_modules, workflow_modules=s.workflow_modules),
        pairs(plugins=s.plugins, data_converter=s.data_converter),
        pairs(http_base_url=s.http_base_url, sql_target_url=shown_sql, sql_allowed_tables=s.sql_allowed_tables),
        pairs(http_allowed_hosts=s.http_allowed_hosts),
        pairs(publish_base_url=s.publish_base_url, smtp_host=s.smtp_host, smtp_port=s.smtp_port),
    ]
    path = os.environ.get("PYTHONPATH")
    if path and (s.tool_modules or s.workflow_modules):  # where those modules import from, from any directory
        absolute = os.pathsep.join(str(Path(entry).resolve()) if entry else entry for entry in path.split(os.pathsep))
        lines.append(f"export PYTHONPATH={shlex.quote(absolute)}")
    return [line for line in lines if line], shown_url != s.ledger_url or shown_sql != s.sql_target_url
