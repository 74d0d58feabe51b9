"""The demo's story, narrated live: a worker paused mid-write, without a lease (:func:`run_unleased`: two writes
land) and with one (:func:`run_takeover`: one lands). ``docs/operator-views.md`` ("The demo's story")."""

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
from temporalio.client import Client
from temporalio.worker import Worker

from agentlease.demo.takeover import TAKEOVER_TTL, landed_writes
from agentlease.demo.unleased import HEARTBEAT_TIMEOUT, PlainWrite, PlainWriter, PlainWriteWorkflow
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
PLAIN_PAUSED_WORKER = "plain-worker-a"
PLAIN_RETRYING_WORKER = "plain-worker-b"
WAIT_S = 60.0
"""How long each phase may take before the story is reported as not shown (a loaded machine)."""
_POLL_S = 0.2
_INDENT = "   "

_T = TypeVar("_T")


@dataclass
class Takeover:
    """What the leased half showed: the ``generation`` that settled (2 after a takeover), what was ``refused`` of
    generation 1 (a line each) and who ``writes`` the row (one entry per write landed)."""

    run_id: str
    task_id: str
    generation: int = 0
    refused: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)

    @property
    def late_write_refused(self) -> bool:
        """Whether the downstream's fence refused generation 1's late write (its result says so)."""
        return any(line.startswith("downstream write") and "refused by the fence" in line for line in self.refused)


@dataclass
class Unleased:
    """What the plain half showed: its workflow, the row, and who ``writes`` it (one entry per write landed)."""

    run_id: str
    record_key: str
    writes: list[str] = field(default_factory=list)


class PausedWorker:
    """A worker process (``argv``, ``env``, output to ``log``) the demo starts, pauses (SIGSTOP), resumes, stops."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.env, self.log_path = argv, env, log
        self.process: asyncio.subprocess.Process | None = None
        self.paused = False

    async def start(self) -> None:
        with self.log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.process = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.process is not None and self.paused:
            self.process.send_signal(signal.SIGCONT)
        self.paused = False

    async def stop(self) -> None:
        """Resume if paused, SIGTERM, and wait for it (SIGKILL after 15 s)."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        self.resume()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def _until(what: str, probe: Callable[[], Awaitable[_T | None]], timeout_s: float = WAIT_S) -> _T:
    """Poll ``probe`` until it answers (not ``None``); AgentLeaseError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise AgentLeaseError(f"the demo did not get to {what} within {timeout_s:.0f}s")
        await asyncio.sleep(_POLL_S)


def _kept_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEASE_")}


def plain_worker(settings: AgentLeaseSettings, data_dir: Path, batch: str) -> PausedWorker:
    """The plain Temporal worker the first half pauses (not started yet)."""
    queue = _plain_queue(settings, batch)
    argv = [sys.executable, "-m", "agentlease.demo.unleased", settings.temporal_address, queue]
    return PausedWorker([*argv, PLAIN_PAUSED_WORKER], _kept_env(), data_dir / "plain-worker.log")


def leased_worker(settings: AgentLeaseSettings, data_dir: Path) -> PausedWorker:
    """The ``agentlease worker`` process the second half pauses (not started yet)."""
    values = {
        "AGENTLEASE_TEMPORAL_ADDRESS": settings.temporal_address,
        "AGENTLEASE_NAMESPACE": settings.namespace,
        "AGENTLEASE_TASK_QUEUE": _leased_queue(settings),
        "AGENTLEASE_LEDGER_URL": settings.ledger_url,
        "AGENTLEASE_TOOL_MODULES": TOOL_MODULE,
        "AGENTLEASE_WORKER_IDENTITY": PAUSED_WORKER,
        "AGENTLEASE_SQL_TARGET_URL": settings.sql_target_url or "",
        "AGENTLEASE_SHUTDOWN_GRACE": "2",
        "AGENTLEASE_MIGRATE_ON_START": "false",
        "AGENTLEASE_MAX_CONCURRENT_ACTIVITIES": "1",
    }
    argv = [sys.executable, "-m", "agentlease.cli.app", "worker"]
    return PausedWorker(argv, {**_kept_env(), **values}, data_dir / "takeover-worker.log")


def plain_record_key(batch: str) -> str:
    """The row the first half writes: ``runbooks/runbook-<batch>-plain``."""
    return f"runbook-{batch}-plain"


def leased_record_key(batch: str) -> str:
    """The row the second half writes: ``runbooks/runbook-<batch>``."""
    return f"runbook-{batch}"


def _plain_queue(settings: AgentLeaseSettings, batch: str) -> str:
    return f"{settings.task_queue}-plain-{batch}"


def _leased_queue(settings: AgentLeaseSettings) -> str:
    return f"{settings.task_queue}-takeover"


async def run_unleased(
    settings: AgentLeaseSettings, client: Client, paused: PausedWorker, batch: str, err: Console
) -> Unleased:
    """The first half, narrated on ``err``: run ``demo-plain-<batch>`` with the started :func:`plain_worker`
    ``paused`` (stopped here). AgentLeaseError: a phase did not happen within :data:`WAIT_S`."""
    assert settings.sql_target_url is not None
    queue = _plain_queue(settings, batch)
    shown = Unleased(run_id=f"demo-plain-{batch}", record_key=plain_record_key(batch))
    args = PlainWrite(
        record_key=shown.record_key,
        row={"step": "restart the ingest job"},
        sql_target_url=settings.sql_target_url,
        activity_queue=queue,
        hold_s=WAIT_S / 3,  # Temporal cancels it first, on its first heartbeat after SIGCONT
    )
    timeout = f"{HEARTBEAT_TIMEOUT.total_seconds():g}s"
    try:
        async with Worker(client, task_queue=f"{queue}-runs", workflows=[PlainWriteWorkflow]):
            handle = await client.start_workflow(
                PlainWriteWorkflow.run, args, id=shown.run_id, task_queue=f"{queue}-runs"
            )

            async def holding() -> int | None:
                for pending in (await handle.describe()).raw_description.pending_activities:
                    started = pending.last_worker_identity == PLAIN_PAUSED_WORKER and pending.attempt == 1
                    if started and pending.HasField("last_heartbeat_time"):
                        return pending.attempt
                return None

            await _until("the plain activity's first attempt", holding)
            err.print(
                f"{_INDENT}{PLAIN_PAUSED_WORKER} (pid {paused.pid}) started attempt 1; it holds just before its write"
            )
            paused.pause()
            err.print(f"{_INDENT}paused {PLAIN_PAUSED_WORKER} (SIGSTOP): no heartbeat reaches Temporal")
            writer = PlainWriter(PLAIN_RETRYING_WORKER)
            async with Worker(client, task_queue=queue, activities=[writer.plain_write], identity=writer.identity):
                async with asyncio.timeout(WAIT_S):
                    await handle.result()
            so_far = await landed_writes(settings.sql_target_url, shown.record_key)
            err.print(
                f"{_INDENT}Temporal heard no heartbeat for {timeout} and retried the activity: "
                f"{' and '.join(so_far) or 'nobody'} wrote the row, and the run completed"
            )
            paused.resume()
            err.print(f"{_INDENT}resumed {PLAIN_PAUSED_WORKER} (SIGCONT); it carries on as if nothing happened")

            async def both() -> list[str] | None:
                writes = await landed_writes(settings.sql_target_url or "", shown.record_key)
                return writes if len(writes) >= 2 else None

            shown.writes = await _until("the paused attempt's late write", both)
            await asyncio.sleep(0.5)  # a third write, if any, is counted too
            shown.writes = await landed_writes(settings.sql_target_url, shown.record_key)
    except TimeoutError:
        raise AgentLeaseError(f"the plain activity's run did not complete within {WAIT_S:.0f}s") from None
    finally:
        await paused.stop()
    return shown


async def run_takeover(
    settings: AgentLeaseSettings,
    client: Client,
    paused: PausedWorker,
    batch: str,
    err: Console,
    worker: Callable[[AgentLeaseSettings], contextlib.AbstractAsyncContextManager[Any]],
) -> Takeover:
    """The second half, narrated on ``err``: run ``demo-takeover-<batch>`` with the started :func:`leased_worker`
    ``paused`` (stopped here), taken over by an in-process ``worker``; returns once the run ended.
    AgentLeaseError: a phase did not happen within :data:`WAIT_S`."""
    queue = _leased_queue(settings)
    run_id = f"demo-takeover-{batch}"
    task_id = task_id_for(run_id, STEP_ID)
    record_key = leased_record_key(batch)
    ttl = f"{TAKEOVER_TTL.total_seconds():g}s"
    ledger = Ledger.from_url(settings.ledger_url)
    try:
        arguments = {"record_key": record_key, "row": {"step": "restart the ingest job"}}
        plan = AgentRunPlan(
            agent_run_id=run_id, steps=[PlanStep(step_id=STEP_ID, tool="takeover_write", arguments=arguments)]
        )
        handle = await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=queue)
        shown = Takeover(run_id=run_id, task_id=task_id)

        async def holding() -> TaskRecord | None:
            record = await _task(ledger, task_id)
            ok = record is not None and record.stage is Stage.EXTERNAL_CALL and record.claim_generation == 1
            return record if ok else None

        record = await _until("the first claim", holding)
        err.print(
            f"{_INDENT}{record.lease_owner} (pid {paused.pid}) claimed {task_id} with generation 1; "
            "it holds just before its write"
        )
        paused.pause()
        err.print(f"{_INDENT}paused {PAUSED_WORKER} (SIGSTOP): it can no longer renew; its lease lapses in {ttl}")
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
                f"{_INDENT}{record.lease_owner} took over with generation {record.claim_generation}, "
                f"wrote the row (fencing token {record.claim_generation}) and settled"
            )
            paused.resume()
            err.print(f"{_INDENT}resumed {PAUSED_WORKER} (SIGCONT); it carries on as if nothing happened")
            late = await _until("the refused late settle", lambda: _late(ledger, task_id))
            shown.refused = _refusals(await ledger.events(task_id), late)
            for line in shown.refused:
                err.print(f"{_INDENT}refused: {line}", markup=False, soft_wrap=True)
            await handle.result()
        assert settings.sql_target_url is not None
        shown.writes = await landed_writes(settings.sql_target_url, record_key)
        return shown
    finally:
        await paused.stop()
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
