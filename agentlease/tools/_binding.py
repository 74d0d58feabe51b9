"""Binding a leased activity (and the decision activity) to the workflow that scheduled it: a call's task, run,
key, heartbeat timeout and tool derive from the activity Temporal dispatched, never from its input
(``docs/security-review.md``, "Receipts and tasks bound to their run").
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select

from agentlease.enums import EventKind
from agentlease.ledger.tables import EVENTS as _EVENTS
from agentlease.records import (
    SHARED_KEY_PREFIX,
    TaskSpec,
    idempotency_key_for,
    is_step_id,
    run_key_prefix,
    step_id_from,
    task_id_for,
)

if TYPE_CHECKING:
    from agentlease.ledger.store import Ledger
    from agentlease.records import Claim


def task_refusal(workflow_id: str | None, task: TaskSpec, *, shared_key: bool) -> str | None:
    """Why ``task`` is not a task of workflow ``workflow_id`` (``None``: not scheduled by one); ``None`` when it is."""
    if workflow_id is None:
        return "a leased activity runs only when a workflow schedules it"
    if task.agent_run_id != workflow_id:
        return f"its run id {task.agent_run_id!r} is not the scheduling workflow's id"
    if not is_step_id(task.step_id):  # "42/mail" of run "tenant" would be step "mail" of run "tenant/42"
        return "its step id is not 1-128 letters, digits, '_', '.', '-' (a '/' would name another run's task)"
    if task.task_id != task_id_for(workflow_id, task.step_id):
        return f"its task id is not {task_id_for(workflow_id, task.step_id)!r} (the workflow id and the step id)"
    key = task.idempotency_key
    if shared_key:
        if not key.startswith(SHARED_KEY_PREFIX):
            return f"a key shared across runs begins with {SHARED_KEY_PREFIX!r}"
    elif run_key_prefix(workflow_id) == SHARED_KEY_PREFIX or workflow_id.startswith(SHARED_KEY_PREFIX):
        return f"a run id may not be 'shared' nor begin with {SHARED_KEY_PREFIX!r} (its keys would be shared ones)"
    elif not key.startswith(run_key_prefix(workflow_id)):
        return "its idempotency key is not of its own run (and the call does not share it across runs)"
    return None


def tool_refusal(activity_type: str, named: str) -> str | None:
    """Why a call whose input names tool ``named`` may not run as the activity ``activity_type``."""
    if named != activity_type:
        return (
            f"its input names tool {named!r}, but the activity that runs is {activity_type!r} "
            "(the ledger records the tool that runs, never the one an input names)"
        )
    return None


def as_run(task: TaskSpec, activity_type: str) -> TaskSpec:
    """``task`` as the tool that runs it: its ``tool`` is the activity type, whatever the input said."""
    return task if task.tool == activity_type else task.model_copy(update={"tool": activity_type})


async def claimed_refusal(
    ledger: Ledger, claim: Claim, tool: str, *, requires_approval: bool, approvers: int = 1
) -> str | None:
    """Why the task ``claim`` holds may not run ``tool`` now: another recorded tool, no approval, or approvals
    by fewer different people than the tool's ``approvers``."""
    if claim.tool != tool:
        return (
            f"the ledger records task {claim.task_id!r} as tool {claim.tool!r}, not {tool!r}: "
            "a step's task runs the tool it was recorded for"
        )
    if requires_approval and not await _approved(ledger, claim.task_id):
        return (
            f"tool {tool!r} requires approval, and the ledger shows no approval of task {claim.task_id!r}: "
            "it runs only once an operator approves it"
        )
    if requires_approval and approvers > 1:
        request = (await ledger.get_task(claim.task_id)).approval_request
        given = set(request.approved_by) if request is not None else set()
        if len(given) < approvers:
            return (
                f"tool {tool!r} requires approval by {approvers} different people, and the ledger shows "
                f"{len(given)} for task {claim.task_id!r}: it runs only once that many approved it"
            )
    return None


async def _approved(ledger: Ledger, task_id: str) -> bool:
    """Whether the trail of ``task_id`` holds an ``approved`` entry (one index probe)."""
    query = (
        select(_EVENTS.c.event_id)
        .where(_EVENTS.c.task_id == task_id, _EVENTS.c.kind == EventKind.APPROVED.value)
        .limit(1)
    )
    return await ledger.database.read(lambda conn: conn.execute(query).first() is not None)


def ttl_refusal(heartbeat_timeout: timedelta | None, lease_ttl: timedelta) -> str | None:
    """Why an attempt scheduled with ``heartbeat_timeout`` may not hold a lease of ``lease_ttl``."""
    if heartbeat_timeout is not None and heartbeat_timeout != lease_ttl:
        return (
            f"it was scheduled with a heartbeat timeout of {heartbeat_timeout.total_seconds():g}s, "
            f"not the tool's lease TTL of {lease_ttl.total_seconds():g}s"
        )
    return None


MAX_RECORDED_RUN_ID_CHARS = 120
"""Longest workflow id whose refused call is recorded on its own task (a longer one is only logged and raised)."""


def own_task(workflow_id: str, task: TaskSpec) -> TaskSpec | None:
    """The task a refused call of ``workflow_id`` is recorded on: its own (``None``: the id is too long)."""
    if len(workflow_id) > MAX_RECORDED_RUN_ID_CHARS:
        return None
    step_id = step_id_from(task.step_id)
    return task.model_copy(
        update={
            "task_id": task_id_for(workflow_id, step_id),
            "agent_run_id": workflow_id,
            "step_id": step_id,
            "idempotency_key": idempotency_key_for(workflow_id, step_id),
        }
    )


__all__ = ["as_run", "claimed_refusal", "own_task", "task_refusal", "tool_refusal", "ttl_refusal"]
