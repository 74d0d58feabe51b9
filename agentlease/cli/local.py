"""``agentlease demo`` and ``agentlease dev``: the embedded default stack, run for a user."""

from __future__ import annotations

import asyncio
import os
import shlex
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from temporalio.client import WorkflowHandle

from agentlease.cli.demo_agents import agent_workers, missing_frameworks, start_agent_runs
from agentlease.cli.plans import load_plan
from agentlease.cli.render import tasks_table
from agentlease.cli.stack import local_stack
from agentlease.cli.takeover import Takeover, run_takeover
from agentlease.databases import display_url
from agentlease.decisions import DecisionRequest
from agentlease.enums import TaskStatus
from agentlease.errors import AgentLeaseError
from agentlease.ledger.store import Ledger
from agentlease.names import STATUS_QUERY
from agentlease.records import RunStatus
from agentlease.settings import AgentLeaseSettings, default_identity
from agentlease.shutdown import stop_event
from agentlease.tools._registry import load_registry
from agentlease.worker import running_worker
from agentlease.workflow._plan import AgentRunWorkflow


async def run_demo(
    settings: AgentLeaseSettings, plans_dir: Path, out: Console, err: Console, *, timeout_s: float
) -> bool:
    """Start the stack, run every plan in ``plans_dir``, each example agent and the narrated takeover
    (:mod:`agentlease.cli.takeover`), print the ledger's tasks and where to look, stop.

    Returns:
        True when every task of every run settled.

    Raises:
        AgentLeaseError: the stack could not start, or the runs did not finish within ``timeout_s``.
    """
    registry = load_registry(settings.tool_modules)
    plans = {path.stem: load_plan(path, registry) for path in sorted(plans_dir.glob("*.json"))}
    if not plans:
        raise AgentLeaseError(f"no plans in {plans_dir}")
    err.print("starting the Temporal dev server, the example services and the workers...")
    for agent in missing_frameworks():
        err.print(
            f"skipping the example agent on {agent.framework}: it is not installed "
            f"(pip install -e '.[{agent.extra}]' adds it)",
            markup=False,
        )
    async with local_stack(settings) as stack, agent_workers(stack.settings) as serving:
        client = stack.env.client
        err.print(f"Temporal UI: {stack.ui_url}  (server {stack.settings.temporal_address})")
        batch = uuid.uuid4().hex[:8]
        handles: list[WorkflowHandle[Any, Any]] = []
        for name, plan in plans.items():
            run_id = f"demo-{name}-{batch}"
            handles.append(
                await client.start_workflow(
                    AgentRunWorkflow.run,
                    plan.model_copy(update={"agent_run_id": run_id}),
                    id=run_id,
                    task_queue=stack.settings.task_queue,
                )
            )
            err.print(f"started agent run {run_id} ({len(plan.steps)} steps)")
        agents = await start_agent_runs(client, serving, batch)
        for agent, handle in agents:
            err.print(f"started agent run {handle.id}: an agent on {agent.framework}, scripted model (no API key)")
        data_dir = settings.data_dir.resolve()
        try:
            async with asyncio.timeout(timeout_s):
                shown, *results = await asyncio.gather(
                    run_takeover(stack.settings, client, data_dir, batch, err, running_worker),
                    *(_approving(h, err) for h in [*handles, *(h for _, h in agents)]),
                )
        except TimeoutError:
            raise AgentLeaseError(f"the demo runs did not finish within {timeout_s:.0f}s") from None
        takeover: Takeover = shown
        for (agent, handle), answer in zip(agents, results[len(handles) :], strict=True):
            err.print(f"{agent.framework} agent {handle.id} answered: {answer}", markup=False)
        ledger = Ledger.from_url(stack.settings.ledger_url)
        try:
            by_run = {h.id: await ledger.list_tasks(h.id) for h in [*handles, *(h for _, h in agents)]}
            by_run[takeover.run_id] = await ledger.list_tasks(takeover.run_id)
        finally:
            await ledger.close()
        ui_url = stack.ui_url
    records = [r for run in by_run.values() for r in run]
    out.print(tasks_table(records, title="demo: tasks in the ledger"))
    _where_to_look(out, takeover, settings, ui_url)
    expected = sum(len(plan.steps) for plan in plans.values())
    plan_tasks = sum(len(by_run[h.id]) for h in handles)
    settled = all(r.status is TaskStatus.SETTLED for r in records) and plan_tasks == expected
    settled = settled and all(by_run[h.id] for _, h in agents)
    settled = settled and bool(by_run[takeover.run_id])
    out.print(f"{sum(r.status is TaskStatus.SETTLED for r in records)}/{len(records)} tasks settled")
    return settled


def _where_to_look(out: Console, takeover: Takeover, settings: AgentLeaseSettings, ui_url: str) -> None:
    """The takeover's outcome and where to see it again: the lease timeline page and the Temporal UI."""
    out.print(
        f"takeover: {takeover.task_id} settled with generation {takeover.generation}; "
        f"generation 1 was refused {len(takeover.refused)} time(s) after it resumed:",
        markup=False,
        soft_wrap=True,
    )
    for line in takeover.refused:
        out.print(f"  refused: {line}", markup=False, soft_wrap=True)
    ledger = f"sqlite:///{settings.data_dir.resolve() / 'ledger.db'}"
    if settings.ledger_url != AgentLeaseSettings.model_fields["ledger_url"].default:
        ledger = settings.ledger_url
    out.print("where to look:")
    out.print(
        f"  lease timeline: AGENTLEASE_LEDGER_URL={ledger} agentlease ui, then "
        f"http://127.0.0.1:8080/tasks/{takeover.task_id}",
        markup=False,
        soft_wrap=True,
    )
    out.print(
        f"  Temporal UI:    {ui_url}/namespaces/{settings.namespace}/workflows/{takeover.run_id} "
        f"(while the demo runs; afterwards `agentlease --data-dir {settings.data_dir} dev` serves it "
        f"on http://127.0.0.1:8233)",
        markup=False,
        soft_wrap=True,
    )


async def _approving(handle: WorkflowHandle[Any, Any], err: Console) -> Any:
    """Wait for a demo run (its result), approving its unsafe steps as the operator ``agentlease demo`` would."""
    result = asyncio.ensure_future(handle.result())
    while not result.done():
        status = await handle.query(STATUS_QUERY, result_type=RunStatus)
        for task in status.tasks:
            if task.status == TaskStatus.AWAITING_APPROVAL.value:
                err.print(f"approving {status.agent_run_id}/{task.step_id} ({task.tool}) as operator 'agentlease demo'")
                await handle.execute_update(
                    "approve",
                    DecisionRequest(
                        step_id=task.step_id, by="agentlease demo", reason="the demo approves its own plan"
                    ),
                )
        await asyncio.wait([result], timeout=0.25)
    return await result


async def run_dev(settings: AgentLeaseSettings, err: Console, *, port: int, ui_port: int, worker: bool = True) -> None:
    """Run the stack in the foreground until SIGINT, SIGTERM or SIGHUP; then stop all of it.

    With ``worker`` (the default) a worker runs in this process too and takes tool calls from the
    stack's task queue beside any worker started from another shell; the banner says so.
    """
    stop = stop_event()
    if worker:
        settings = settings.model_copy(update={"worker_identity": settings.worker_identity or default_identity()})
    async with local_stack(settings, port=port, ui_port=ui_port, worker=worker) as stack:
        s = stack.settings
        ledger_url, sql_url = display_url(s.ledger_url), s.sql_target_url and display_url(s.sql_target_url)
        err.print(f"Temporal UI:      {stack.ui_url}")
        err.print(f"Temporal server:  {s.temporal_address} (namespace {s.namespace}, queue {s.task_queue})")
        err.print(f"ledger:           {ledger_url}", markup=False)
        err.print(f"decisions:        {s.decision_mode} mode (docs/security.md, Authenticated decisions)")
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
        err.print("  agentlease run agentlease/demo/plans/restock.json --wait")
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
    if path and (s.tool_modules or s.workflow_modules):  # where those modules import from
        lines.append(f"export PYTHONPATH={shlex.quote(path)}")
    return [line for line in lines if line], shown_url != s.ledger_url or shown_sql != s.sql_target_url
