"""``agentlease demo`` and ``agentlease dev``: the embedded default stack, run for a user."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from temporalio.client import WorkflowHandle

from activities.registry import load_registry
from agentlease.cli.demo_agents import agent_workers, start_agent_runs
from agentlease.cli.plans import load_plan
from agentlease.cli.render import tasks_table
from agentlease.cli.stack import local_stack
from agentlease.decisions import DecisionRequest
from agentlease.enums import TaskStatus
from agentlease.errors import AgentLeaseError
from agentlease.ledger.store import Ledger
from agentlease.names import STATUS_QUERY
from agentlease.records import RunStatus
from agentlease.settings import AgentLeaseSettings
from agentlease.shutdown import stop_event
from workflows.agent_run import AgentRunWorkflow


async def run_demo(
    settings: AgentLeaseSettings, plans_dir: Path, out: Console, err: Console, *, timeout_s: float
) -> bool:
    """Start the stack, run every plan in ``plans_dir`` and each example agent, print the ledger's tasks, stop.

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
        try:
            async with asyncio.timeout(timeout_s):
                results = await asyncio.gather(*(_approving(h, err) for h in [*handles, *(h for _, h in agents)]))
        except TimeoutError:
            raise AgentLeaseError(f"the demo runs did not finish within {timeout_s:.0f}s") from None
        for (agent, handle), answer in zip(agents, results[len(handles) :], strict=True):
            err.print(f"{agent.framework} agent {handle.id} answered: {answer}", markup=False)
        ledger = Ledger.from_url(stack.settings.ledger_url)
        try:
            by_run = {h.id: await ledger.list_tasks(h.id) for h in [*handles, *(h for _, h in agents)]}
        finally:
            await ledger.close()
    records = [r for run in by_run.values() for r in run]
    out.print(tasks_table(records, title="demo: tasks in the ledger"))
    expected = sum(len(plan.steps) for plan in plans.values())
    plan_tasks = sum(len(by_run[h.id]) for h in handles)
    settled = all(r.status is TaskStatus.SETTLED for r in records) and plan_tasks == expected
    settled = settled and all(by_run[h.id] for _, h in agents)
    out.print(f"{sum(r.status is TaskStatus.SETTLED for r in records)}/{len(records)} tasks settled")
    return settled


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


async def run_dev(settings: AgentLeaseSettings, err: Console, *, port: int, ui_port: int) -> None:
    """Run the stack in the foreground until SIGINT, SIGTERM or SIGHUP; then stop all of it."""
    stop = stop_event()
    async with local_stack(settings, port=port, ui_port=ui_port) as stack:
        s = stack.settings
        err.print(f"Temporal UI:      {stack.ui_url}")
        err.print(f"Temporal server:  {s.temporal_address} (namespace {s.namespace}, queue {s.task_queue})")
        err.print(f"ledger:           {s.ledger_url}")
        if s.metrics_address is not None:
            err.print(f"lease metrics:    http://{s.metrics_address}/metrics")
        err.print(f"example services: files {s.http_base_url}  sql {s.sql_target_url}")
        err.print(f"                  publishing {s.publish_base_url}  smtp {s.smtp_host}:{s.smtp_port}")
        err.print("in another shell:")
        err.print(f"  export AGENTLEASE_TEMPORAL_ADDRESS={s.temporal_address} AGENTLEASE_TASK_QUEUE={s.task_queue}")
        err.print(f"  export AGENTLEASE_LEDGER_URL={s.ledger_url}")
        err.print(f"  export AGENTLEASE_HTTP_BASE_URL={s.http_base_url} AGENTLEASE_SQL_TARGET_URL={s.sql_target_url}")
        err.print(f"  export AGENTLEASE_SQL_ALLOWED_TABLES={','.join(s.sql_allowed_tables)}")
        err.print(
            f"  export AGENTLEASE_PUBLISH_BASE_URL={s.publish_base_url} "
            f"AGENTLEASE_SMTP_HOST={s.smtp_host} AGENTLEASE_SMTP_PORT={s.smtp_port}"
        )
        err.print("  agentlease run examples/plans/restock.json --wait")
        err.print("Ctrl-C stops everything.")
        await stop.wait()
