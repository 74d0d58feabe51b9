"""Reaching a run whose worker may be gone: its ``status`` query asked again within a limit, and a
``reconcile`` of a run that already ended, made in the ledger."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError

from agentlease.cli.session import RPC
from agentlease.decisions.table import ReconcileRequest
from agentlease.errors import AgentLeaseError, ConfigurationError
from agentlease.ledger.store import Ledger
from agentlease.records import RunStatus, TaskRecord
from agentlease.runtime.names import STATUS_QUERY
from agentlease.settings import AgentLeaseSettings


async def query_within(handle: Any, agent_run_id: str, limit: float) -> RunStatus:
    """The run's ``status`` query, asked again while no worker answers it, for at most ``limit`` seconds (after
    its worker dies, Temporal sends queries to its sticky queue until it notices)."""
    from temporalio.service import RPCStatusCode

    unanswered = (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        left = deadline - loop.time()
        try:
            timeout = timedelta(seconds=max(0.5, min(RPC.total_seconds(), left)))
            return await handle.query(STATUS_QUERY, result_type=RunStatus, rpc_timeout=timeout)
        except WorkflowQueryFailedError as exc:
            raise AgentLeaseError(
                f"workflow {agent_run_id} answers no status query ({exc.message.split(',')[0]}): it makes no leased "
                "calls, or its worker runs without AgentLeasePlugin"
            ) from None
        except RPCError as exc:  # the query's own deadline passed ("Timeout expired"), or the server is away
            if exc.status not in unanswered:
                raise
            if deadline - loop.time() <= 0.5:
                raise AgentLeaseError(
                    f"agent run {agent_run_id}: no worker answered its status query within {limit:g}s (the worker "
                    "that ran it may just have stopped, and no other serves its task queue yet); the ledger's "
                    f"view: `agentlease tasks --run {agent_run_id}`"
                ) from None
        await asyncio.sleep(min(0.5, max(0.0, deadline - loop.time())))


async def ended_run_status(client: Any, agent_run_id: str, limit: float) -> RunStatus:
    """A completed run's status: its result when a :class:`RunStatus`, else its ``status`` query (a framework
    agent's result is its own output). AgentLeaseError: no status query answered."""
    from pydantic import ValidationError

    handle = client.get_workflow_handle(agent_run_id)
    result = await handle.result()
    try:
        status = RunStatus.model_validate(result)
    except ValidationError:
        status = None
    if status is None or status.agent_run_id != agent_run_id:  # not its status: another run's, or its own output
        return await query_within(handle, agent_run_id, limit)
    return status


async def reconciled_in_ledger(
    ledger: Ledger, settings: AgentLeaseSettings, agent_run_id: str, request: ReconcileRequest
) -> TaskRecord | None:
    """Reconcile a cancelled task of unknown effect in the ledger when its run has ended; ``None`` when the
    decision goes through the run. ConfigurationError: no such reconcile for the task's status."""
    from temporalio.exceptions import ApplicationError

    from agentlease.decisions._activity import apply
    from agentlease.decisions.table import LedgerDecision
    from agentlease.errors import TaskNotFoundError
    from agentlease.records import TaskSpec, task_id_for
    from agentlease.runtime.temporal import connect

    try:
        record = await ledger.get_task(task_id_for(agent_run_id, request.step_id))
    except TaskNotFoundError:
        return None
    if not record.status.is_terminal:
        return None
    described = await (await connect(settings)).get_workflow_handle(agent_run_id).describe()
    if described.status == WorkflowExecutionStatus.RUNNING:
        return None  # the run takes it: its view of the step follows the decision
    kind = request.kind_for(record.status)
    if kind is None:
        raise ConfigurationError(
            f"reconcile refused: {record.task_id} is {record.status.value}; --action {request.action} "
            "does not apply to it"
        )
    spec = TaskSpec(**record.model_dump(include=set(TaskSpec.model_fields)))
    facts = request.model_dump(include={"by", "reason", "external_id", "observed"})
    decision = LedgerDecision(kind=kind, task=spec, **facts)
    try:
        await apply(ledger, decision)
    except ApplicationError as exc:
        raise ConfigurationError(f"reconcile refused: {exc.message}") from None
    return await ledger.get_task(record.task_id)
