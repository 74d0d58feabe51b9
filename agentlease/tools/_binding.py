"""Binding a leased activity (and the decision activity) to the workflow that scheduled it.

Anyone who can reach a task queue can schedule any activity on it, with any input. A tool call's
task, run and idempotency key are therefore not taken from its input on trust: they must derive
from ``activity.info().workflow_id`` (``docs/security.md``, "Receipts and tasks bound to their run"):

- the task id is ``task_id_for(<workflow id>, <step id>)`` and the run id is the workflow id;
- the idempotency key is of the run (``"<workflow id>:..."``), or shared across runs by the
  caller's explicit choice (``"shared:..."``, :func:`~agentlease.records.scoped_idempotency_key`);
- a tool call's heartbeat timeout, as scheduled, is the tool's lease TTL (G9: the workflow side
  schedules every call so; an operator's later ``temporal activity update-options`` is recorded
  with the claim instead).

Anything else is refused before the ledger is touched, non-retryably, and recorded on the call's own
task (:func:`~agentlease.ledger.refusals.record_refusal`).
"""

from __future__ import annotations

from datetime import timedelta

from agentlease.records import (
    SHARED_KEY_PREFIX,
    TaskSpec,
    idempotency_key_for,
    step_id_from,
    task_id_for,
)


def task_refusal(workflow_id: str | None, task: TaskSpec, *, shared_key: bool) -> str | None:
    """Why ``task`` is not a task of workflow ``workflow_id``; ``None`` when it is.

    Args:
        workflow_id: ``activity.info().workflow_id`` of the attempt (``None``: not scheduled by a workflow).
        task: the task the call names.
        shared_key: the caller shares the key across runs.
    """
    if workflow_id is None:
        return "a leased activity runs only when a workflow schedules it"
    if task.agent_run_id != workflow_id:
        return f"its run id {task.agent_run_id!r} is not the scheduling workflow's id"
    if task.task_id != task_id_for(workflow_id, task.step_id):
        return f"its task id is not {task_id_for(workflow_id, task.step_id)!r} (the workflow id and the step id)"
    key = task.idempotency_key
    if shared_key:
        if not key.startswith(SHARED_KEY_PREFIX):
            return f"a key shared across runs begins with {SHARED_KEY_PREFIX!r}"
    elif workflow_id.startswith(SHARED_KEY_PREFIX):
        return f"a run id may not begin with {SHARED_KEY_PREFIX!r} (its keys would be shared ones)"
    elif not key.startswith(f"{workflow_id}:"):
        return "its idempotency key is not of its own run (and the call does not share it across runs)"
    return None


def ttl_refusal(heartbeat_timeout: timedelta | None, lease_ttl: timedelta) -> str | None:
    """Why an attempt scheduled with ``heartbeat_timeout`` may not hold a lease of ``lease_ttl``."""
    if heartbeat_timeout is not None and heartbeat_timeout != lease_ttl:
        return (
            f"it was scheduled with a heartbeat timeout of {heartbeat_timeout.total_seconds():g}s, "
            f"not the tool's lease TTL of {lease_ttl.total_seconds():g}s"
        )
    return None


MAX_RECORDED_RUN_ID_CHARS = 120
"""Longest workflow id whose refused call is recorded on its own task (longer ones do not fit the
ledger's columns: the refusal is then only logged and raised)."""


def own_task(workflow_id: str, task: TaskSpec) -> TaskSpec | None:
    """The task a refused call of ``workflow_id`` is recorded on: its own, from its workflow id and step;
    ``None`` when the workflow id is too long for the ledger's columns."""
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


__all__ = ["own_task", "task_refusal", "ttl_refusal"]
