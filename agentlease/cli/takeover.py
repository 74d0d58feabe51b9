"""The demo's operational test, run live and narrated: a paused holder, a takeover, refused late writes.

One fenced call (``takeover_write`` of :mod:`agentlease.demo.takeover`, lease TTL 3 s) runs on a task queue
of its own. Worker
``demo-worker-a`` (a separate ``agentlease worker`` process) claims it with generation 1 and holds
it in ``external_call``; the demo pauses that process (SIGSTOP). Its lease lapses; worker
``demo-worker-b`` (started in the demo's process only now) takes over with generation 2, writes
and settles. The demo resumes the first worker (SIGCONT): its renewal, its downstream write and
its settle are refused, and the evidence trail records each. Every line is narrated from what the
ledger recorded, not from timers (``docs/operator-views.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from temporalio.client import Client, WorkflowHandle

from agentlease.enums import EventKind, Stage, TaskStatus
from agentlease.errors import AgentLeaseError
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep, TaskRecord, task_id_for
from agentlease.settings import AgentLeaseSettings
from agentlease.workflow._plan import AgentRunWorkflow

TOOL_MODULE = "agentlease.demo.takeover"
"""The module of the demo's fenced tool (``takeover_write``)."""
STEP_ID = "write-runbook"
PAUSED_WORKER = "demo-worker-a"
TAKING_OVER_WORKER = "demo-worker-b"
WAIT_S = 60.0
"""How long each phase may take before the takeover is reported as not shown (a loaded machine)."""
_POLL_S = 0.2

_T = TypeVar("_T")


@dataclass
class Takeover:
    """What the takeover showed.

    Attributes:
        run_id / task_id: its agent run and task.
        handle: the run.
        generation: the generation that settled (2 when the takeover happened).
        refused: what the ledger and the downstream refused of generation 1, one line each.
    """

    run_id: str
    task_id: str
    handle: WorkflowHandle[Any, Any]
    generation: int = 0
    refused: list[str] = field(default_factory=list)


async def _until(what: str, probe: Callable[[], Awaitable[_T | None]], timeout_s: float = WAIT_S) -> _T:
    """Poll ``probe`` until it answers (not ``None``).

    Raises:
        AgentLeaseError: naming ``what``, after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise AgentLeaseError(f"the takeover demo did not get to {what} within {timeout_s:.0f}s")
        await asyncio.sleep(_POLL_S)


def _worker_env(settings: AgentLeaseSettings, queue: str) -> dict[str, str]:
    values = {
        "AGENTLEASE_TEMPORAL_ADDRESS": settings.temporal_address,
        "AGENTLEASE_NAMESPACE": settings.namespace,
        "AGENTLEASE_TASK_QUEUE": queue,
        "AGENTLEASE_LEDGER_URL": settings.ledger_url,
        "AGENTLEASE_TOOL_MODULES": TOOL_MODULE,
        "AGENTLEASE_WORKER_IDENTITY": PAUSED_WORKER,
        "AGENTLEASE_SQL_TARGET_URL": settings.sql_target_url or "",
        "AGENTLEASE_SHUTDOWN_GRACE": "2",
        "AGENTLEASE_MIGRATE_ON_START": "false",
    }
    kept = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEASE_")}
    return {**kept, **values}


async def run_takeover(
    settings: AgentLeaseSettings,
    client: Client,
    data_dir: Path,
    batch: str,
    err: Console,
    worker: Callable[[AgentLeaseSettings], contextlib.AbstractAsyncContextManager[Any]],
) -> Takeover:
    """Run the takeover (see the module docstring), narrating on ``err``.

    Args:
        settings: the demo stack's settings (its ledger, Temporal and publishing service).
        client: a client of the stack's Temporal.
        data_dir: where the paused worker's log goes (``takeover-worker.log``).
        batch: the demo's batch id (run id ``demo-takeover-<batch>``).
        err: where the narration goes.
        worker: starts an in-process worker on the given settings (``agentlease.worker.running_worker``).

    Returns:
        What it showed; the run has settled or failed by then.

    Raises:
        AgentLeaseError: a phase did not happen within :data:`WAIT_S`.
    """
    queue = f"{settings.task_queue}-takeover"
    run_id = f"demo-takeover-{batch}"
    task_id = task_id_for(run_id, STEP_ID)
    log = (data_dir / "takeover-worker.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentlease.cli.app",
        "worker",
        env=_worker_env(settings, queue),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    ledger = Ledger.from_url(settings.ledger_url)
    paused = False
    try:
        plan = AgentRunPlan(
            agent_run_id=run_id,
            steps=[
                PlanStep(
                    step_id=STEP_ID,
                    tool="takeover_write",
                    arguments={"record_key": f"runbook-{batch}", "row": {"step": "restart the ingest job"}},
                )
            ],
        )
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=queue)
        shown = Takeover(run_id=run_id, task_id=task_id, handle=handle)
        err.print(f"takeover: run {run_id}, one fenced call (lease TTL 3s) on queue {queue}")

        async def holding() -> TaskRecord | None:
            record = await _task(ledger, task_id)
            ok = record is not None and record.stage is Stage.EXTERNAL_CALL and record.claim_generation == 1
            return record if ok else None

        record = await _until("the first claim", holding)
        err.print(
            f"takeover: {record.lease_owner} (pid {process.pid}) claimed {task_id} with generation 1 "
            "and holds it in external_call, just before its write"
        )
        process.send_signal(signal.SIGSTOP)
        paused = True
        err.print(f"takeover: paused {PAUSED_WORKER} (SIGSTOP): it can no longer renew; its lease lapses in 3s")
        second = settings.model_copy(
            update={
                "task_queue": queue,
                "tool_modules": [*settings.tool_modules, TOOL_MODULE],
                "worker_identity": TAKING_OVER_WORKER,
                "migrate_on_start": False,
            }
        )
        async with worker(second):

            async def settled() -> TaskRecord | None:
                record = await _task(ledger, task_id)
                return record if record is not None and record.status is TaskStatus.SETTLED else None

            record = await _until("the takeover's settle", settled)
            shown.generation = record.claim_generation
            err.print(
                f"takeover: {record.lease_owner} took over with generation {record.claim_generation}, "
                "wrote the row (fencing token 2) and settled"
            )
            process.send_signal(signal.SIGCONT)
            paused = False
            err.print(f"takeover: resumed {PAUSED_WORKER} (SIGCONT); it carries on as if nothing happened")
            late = await _until("the refused late settle", lambda: _late(ledger, task_id))
            shown.refused = _refusals(await ledger.events(task_id), late)
            for line in shown.refused:
                err.print(f"takeover: refused: {line}", markup=False, soft_wrap=True)
            await handle.result()
        return shown
    finally:
        if paused:
            process.send_signal(signal.SIGCONT)
        await _stop(process)
        log.close()
        await ledger.close()


async def _task(ledger: Ledger, task_id: str) -> TaskRecord | None:
    tasks = [t for t in await ledger.list_tasks(task_id.rsplit("/", 1)[0]) if t.task_id == task_id]
    return tasks[0] if tasks else None


async def _late(ledger: Ledger, task_id: str) -> LeaseEvent | None:
    return next(
        (e for e in await ledger.events(task_id) if e.kind is EventKind.LATE_UNAPPLIED and e.claim_generation == 1),
        None,
    )


def _refusals(trail: list[LeaseEvent], late: LeaseEvent) -> list[str]:
    """What generation 1 was refused, from its evidence trail: renewal, downstream write, settle."""
    lines = [
        f"renewal of generation 1 ({e.kind.value}): {e.reason}"
        for e in trail
        if e.kind is EventKind.LEASE_LOST and e.claim_generation == 1
    ][:1]
    result = (late.details or {}).get("result") or {}
    if isinstance(result, dict) and "write" in result:
        lines.append(f"downstream write by generation 1: {result['write']}")
    lines.append("settle of generation 1 (late_unapplied): its result is kept as evidence, never applied")
    return lines


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the paused worker's process and wait for it (SIGKILL after 15 s)."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 15)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
