"""Agent runs on Temporal: ``agentlease run`` starts one from a plan, ``agentlease status`` shows one."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentlease.cli.session import RPC as _RPC
from agentlease.cli.session import out
from agentlease.cli.session import settings as _settings
from agentlease.enums import RunState
from agentlease.errors import AgentLeaseError, one_line
from agentlease.runtime.names import STATUS_QUERY
from agentlease.settings import AgentLeaseSettings

if TYPE_CHECKING:
    from agentlease.records import RunStatus


def run(
    ctx: typer.Context,
    plan_file: Annotated[Path, typer.Argument(help='Plan JSON: {"steps": [{"step_id", "tool", "arguments"}]}')],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the run with live progress until it ends.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    run_id: Annotated[
        str | None, typer.Option(help="Agent run id (workflow id); default from the plan or new.")
    ] = None,
) -> None:
    """Start an agent run from a plan file on the configured Temporal."""
    from agentlease.cli.plans import load_plan, with_run_id
    from agentlease.tools._registry import load_registry

    settings = _settings(ctx)
    plan = load_plan(plan_file, load_registry(settings.tool_modules))
    agent_run_id = run_id or plan.agent_run_id or f"run-{uuid.uuid4().hex[:12]}"
    plan = with_run_id(plan, agent_run_id)
    status = asyncio.run(_start_run(settings, plan, wait, as_json))
    if status is not None:
        show_run(status, as_json)
        if status.status is RunState.WAITING:
            waiting = ", ".join(f"{t.step_id} is {t.status.value}" for t in status.tasks if t.status.awaits_decision)
            raise AgentLeaseError(f"agent run {agent_run_id} waits for a person ({waiting}); see `agentlease waiting`")
        if status.status is not RunState.COMPLETED:
            raise AgentLeaseError(f"agent run {agent_run_id} is {status.status.value}")
    elif as_json:
        out.print_json(data={"agent_run_id": agent_run_id})
    else:
        out.print(f"started agent run {agent_run_id}")


async def _start_run(settings: AgentLeaseSettings, plan: Any, wait: bool, as_json: bool) -> RunStatus | None:
    from rich.live import Live
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError

    from agentlease.runtime.temporal import connect
    from agentlease.workflow._plan import AgentRunWorkflow

    client = await connect(settings)
    try:
        handle = await client.start_workflow(
            AgentRunWorkflow.run, plan, id=plan.agent_run_id, task_queue=settings.task_queue
        )
    except WorkflowAlreadyStartedError:
        raise AgentLeaseError(
            f"cannot start run {plan.agent_run_id}: an agent run with this id is already running; "
            "choose another --run-id, or follow it with `agentlease status`"
        ) from None
    except RPCError as exc:
        raise AgentLeaseError(f"cannot start run {plan.agent_run_id}: {exc.message}") from None
    if not wait:
        return None
    if as_json or not out.is_terminal:
        return await _follow(client, handle, plan.agent_run_id, None)
    with Live(console=out, refresh_per_second=4) as live:
        return await _follow(client, handle, plan.agent_run_id, live)


async def _follow(client: Any, handle: Any, agent_run_id: str, live: Any) -> RunStatus:
    """Follow a run until it ends or waits for a person, live in ``live`` if given, through a Temporal outage of
    at most :data:`_FOLLOW_OUTAGE`."""
    from temporalio.service import RPCError

    from agentlease.cli.render import run_table
    from agentlease.records import RunStatus

    result = asyncio.ensure_future(handle.result())
    lost_since: float | None = None
    while True:
        if result.done():
            failure = result.exception()
            if not isinstance(failure, RPCError):
                break
            now = asyncio.get_running_loop().time()
            lost_since = now if lost_since is None else lost_since
            if now - lost_since > _FOLLOW_OUTAGE.total_seconds():
                raise AgentLeaseError(
                    f"lost Temporal while following agent run {agent_run_id}: {failure.message}; the run goes on, "
                    f"follow it with `agentlease status {agent_run_id}`"
                ) from None
            await asyncio.sleep(0.5)
            result = asyncio.ensure_future(handle.result())
            continue
        try:
            current = await handle.query(STATUS_QUERY, result_type=RunStatus, rpc_timeout=_RPC)
        except RPCError:
            current = None  # The run has not been picked up by a worker yet.
        if current is not None:
            if live is not None:
                with contextlib.suppress(RPCError):
                    current = await with_heartbeats(client, await handle.describe(rpc_timeout=_RPC), current)
                live.update(run_table(current))
            if current.status is RunState.WAITING:
                result.cancel()
                return current
            lost_since = None
        await asyncio.wait([result], timeout=0.5)
    return await result_of(result, agent_run_id)


_FOLLOW_OUTAGE = timedelta(seconds=60)
"""How long ``run --wait`` keeps following a run while Temporal does not answer. Default 60s."""


async def result_of(result: Any, agent_run_id: str) -> RunStatus:
    from temporalio.client import WorkflowFailureError

    try:
        return await result
    except WorkflowFailureError as exc:
        raise AgentLeaseError(f"agent run {agent_run_id} failed: {one_line(exc.cause or exc)}") from None


async def with_heartbeats(client: Any, description: Any, current: RunStatus) -> RunStatus:
    """``current`` with the stage and generation of its running tasks from their latest heartbeat details (a
    throttled copy of what the ledger recorded), where the run's own view is behind."""
    from agentlease.records import RunStatus

    latest: dict[str, dict[str, Any]] = {}
    for pending in description.raw_description.pending_activities:
        if not pending.heartbeat_details.payloads:
            continue
        with contextlib.suppress(Exception):  # details of another shape: nothing to show
            [details] = await client.data_converter.decode(pending.heartbeat_details.payloads)
            latest[details["task_id"]] = details

    def fresher(task: Any) -> dict[str, Any]:
        seen = latest.get(task.task_id)
        # the run's own view is live (its attempt signals each claim and stage): a heartbeat only fills a gap
        if seen and task.status == "running" and (task.claim_generation or 0) < seen["claim_generation"]:
            return {**task.model_dump(), "stage": seen["stage"], "claim_generation": seen["claim_generation"]}
        return task.model_dump()

    if not latest:
        return current
    return RunStatus.model_validate({**current.model_dump(), "tasks": [fresher(task) for task in current.tasks]})


def show_run(status: RunStatus, as_json: bool, *, title: str | None = None) -> None:
    from agentlease.cli.render import run_table, to_json

    if as_json:
        out.print_json(to_json(status))
    else:
        out.print(run_table(status, title=title))


def status(
    ctx: typer.Context,
    agent_run_id: Annotated[str, typer.Argument(help="The agent run (workflow) id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show one agent run: every task's status, stage, generation, attempts and receipt."""
    show_run(asyncio.run(run_status(_settings(ctx), agent_run_id)), as_json)


async def run_status(settings: AgentLeaseSettings, agent_run_id: str) -> RunStatus:
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    from agentlease.cli.reaching import ended_run_status, query_within
    from agentlease.records import RunStatus
    from agentlease.runtime.temporal import connect
    from agentlease.security.codec import CodecKeysMissingError

    client = await connect(settings)
    handle = client.get_workflow_handle(agent_run_id, result_type=RunStatus)
    try:
        description = await handle.describe()
        if description.status == WorkflowExecutionStatus.RUNNING:
            current = await query_within(handle, agent_run_id, settings.decision_timeout.total_seconds())
            return await with_heartbeats(client, description, current)
        if description.status == WorkflowExecutionStatus.COMPLETED:
            return await ended_run_status(client, agent_run_id, settings.decision_timeout.total_seconds())
        if description.status == WorkflowExecutionStatus.FAILED:
            return await result_of(handle.result(), agent_run_id)  # raises with the cause
    except RPCError as exc:
        # A run that exists but no worker answers for (none polls its queue): the ledger can still tell.
        hint = (
            ""
            if exc.status is RPCStatusCode.NOT_FOUND
            else f"; the ledger's view: `agentlease tasks --run {agent_run_id}`"
        )
        raise AgentLeaseError(f"agent run {agent_run_id}: {exc.message}{hint}") from None
    except CodecKeysMissingError as exc:
        raise AgentLeaseError(f"agent run {agent_run_id}: {exc}") from None
    state = "in an unknown state" if description.status is None else description.status.name.lower()
    raise AgentLeaseError(f"agent run {agent_run_id} is {state}")
