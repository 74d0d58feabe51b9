"""The lease inside whole agent runs: AgentRunWorkflow runs against plain workflows of plain activities.

One Temporal dev server. Per *side*, its own task queue served by ``--workers`` worker processes
(1, then 2: separate OS processes, as a deployment runs them):

- ``plain``: ``bench.workflow.ToolCallsWorkflow`` running ``--steps`` plain activities one after
  the other, each heartbeating once (``bench.tools.plain_read``); no ledger, no search attributes;
- ``agent-run-sqlite`` / ``agent-run-pg``: ``AgentRunWorkflow`` runs of a ``--steps``-step plan of
  the fast read-only tool ``bench_read`` (one ``ctx.advance``, then a receipt), on workers built by
  :func:`worker.build_worker` (the plugin, the leased activities, the decision activity) with a
  SQLite or PostgreSQL ledger.

Each round starts ``--runs`` runs of every side at once and waits for them; rounds alternate the
sides (rotating which goes first). Reported per side (medians over the timed rounds): runs/s,
calls/s, worker CPU and Temporal server CPU per call (read from ``/proc``), their ratios to plain,
and one run's history (events, bytes, search-attribute upserts, markers, workflow tasks).

Run: ``python -m bench.runs --runs 200 --steps 5 --rounds 3 --workers 1,2`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from importlib.metadata import version
from importlib.util import cache_from_source
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep
from agentlease.runtime.devserver import scratch_postgres_database
from agentlease.runtime.names import AGENT_RUN_WORKFLOW
from agentlease.runtime.shutdown import exit_process
from agentlease.settings import AgentLeaseSettings
from bench.overhead import default_pg_url, quiet_dev_server, rotated
from bench.tools import PLAIN_READ_ACTIVITY, READ_TOOL
from bench.workflow import BENCH_WORKFLOW, BenchBatch

PLAIN = "plain"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, with reaped children) of process ``pid``, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / TICK


def server_pids(data_dir: Path) -> list[int]:
    """The Temporal dev server's processes: those whose command line names its database in ``data_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(data_dir) in cmdline and "temporal" in cmdline and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


# -- worker processes ----------------------------------------------------------------------------


def _serve(kind: str, task_queue: str, address: str, ledger_url: str | None, ready: Any, stop: Any) -> None:
    """Entry point of one worker process (spawned): serve ``task_queue`` until ``stop`` is set."""

    async def main() -> None:
        from temporalio.worker import Worker

        from agentlease.runtime.temporal import connect
        from agentlease.tools._registry import ToolRegistry
        from agentlease.worker import build_worker
        from bench.tools import plain_read
        from bench.workflow import ToolCallsWorkflow

        settings = AgentLeaseSettings(temporal_address=address, task_queue=task_queue, ledger_url=ledger_url or "")
        client = await connect(settings)
        ledger = None
        if kind == PLAIN:
            worker = Worker(
                client,
                task_queue=task_queue,
                workflows=[ToolCallsWorkflow],
                activities=[plain_read],
                max_concurrent_activities=settings.max_concurrent_activities,
                graceful_shutdown_timeout=settings.shutdown_grace,
            )
        else:
            ledger = Ledger.from_url(settings.ledger_url)
            worker = build_worker(client, ledger, ToolRegistry([READ_TOOL]), settings, workflows=[])
        try:
            async with worker:
                ready.put(os.getpid())
                await asyncio.to_thread(stop.wait)
        finally:
            if ledger is not None:
                await ledger.close()

    asyncio.run(main())


@dataclass
class Side:
    """One way of running the runs: its task queue, worker processes and measurements."""

    name: str
    ledger_url: str | None
    task_queue: str = field(default_factory=lambda: f"bench-runs-{uuid.uuid4().hex[:8]}")
    pids: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    worker_ms: list[float] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)
    unsettled: int = 0
    last_run: str | None = None


def start_workers(sides: list[Side], count: int, address: str, stack: Any) -> None:
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    ready = context.Queue()
    processes = []
    for side in sides:
        side.task_queue = f"bench-runs-{side.name}-{uuid.uuid4().hex[:8]}"
        for _ in range(count):
            kind = PLAIN if side.name == PLAIN else "leased"
            process = context.Process(
                target=_serve, args=(kind, side.task_queue, address, side.ledger_url, ready, stop), daemon=True
            )
            process.start()
            processes.append((side, process))
    for side, process in processes:
        ready.get(timeout=120)
        side.pids.append(process.pid)  # type: ignore[arg-type]

    def stop_all() -> None:
        stop.set()
        for side, process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
            side.pids.clear()

    stack.callback(stop_all)


# -- rounds --------------------------------------------------------------------------------------


async def _one_run(client: Client, side: Side, workflow_id: str, steps: int) -> int:
    if side.name == PLAIN:
        batch = BenchBatch(activity=PLAIN_READ_ACTIVITY, tool=READ_TOOL.info(), calls=steps)
        return await client.execute_workflow(
            BENCH_WORKFLOW, batch, id=workflow_id, task_queue=side.task_queue, result_type=int
        )
    plan = AgentRunPlan(
        agent_run_id=workflow_id,
        steps=[PlanStep(step_id=f"step-{i}", tool=READ_TOOL.name, arguments={"index": i}) for i in range(steps)],
    )
    status = await client.execute_workflow(AGENT_RUN_WORKFLOW, plan, id=workflow_id, task_queue=side.task_queue)
    return sum(task["status"] == "settled" for task in status["tasks"])


async def run_round(client: Client, side: Side, opts: argparse.Namespace, server: list[int], label: str) -> None:
    tag = f"{side.name}-{label}-{uuid.uuid4().hex[:6]}"
    ids = [f"bench-runs-{tag}-{i}" for i in range(opts.runs)]
    worker_cpu = sum(cpu_s(pid) for pid in side.pids)
    server_cpu = sum(cpu_s(pid) for pid in server)
    started = time.perf_counter()
    settled = await asyncio.gather(*(_one_run(client, side, wid, opts.steps) for wid in ids))
    seconds = time.perf_counter() - started
    calls = opts.runs * opts.steps
    if label.startswith("r"):
        side.rates.append(calls / seconds)
        side.worker_ms.append((sum(cpu_s(pid) for pid in side.pids) - worker_cpu) * 1000 / calls)
        side.server_ms.append((sum(cpu_s(pid) for pid in server) - server_cpu) * 1000 / calls)
        side.unsettled += calls - sum(settled)
        side.last_run = ids[-1]


async def history_of(client: Client, workflow_id: str) -> dict[str, int]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    events = list(history.events)
    kinds = [event.event_type for event in events]
    return {
        "events": len(events),
        "bytes": sum(event.ByteSize() for event in events),
        "upserts": kinds.count(EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES),
        "markers": kinds.count(EventType.EVENT_TYPE_MARKER_RECORDED),
        "workflow_tasks": kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED),
        "activities": kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED),
        "signals": kinds.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED),
    }


def report(sides: list[Side], workers: int, histories: dict[str, dict[str, int]], opts: Any, out: Any) -> None:
    plain = sides[0]
    base_rate = statistics.median(plain.rates)
    base_worker = statistics.median(plain.worker_ms)
    base_server = statistics.median(plain.server_ms)
    print(
        f"\n{workers} worker process(es) per side; {opts.runs} concurrent runs x {opts.steps} steps; "
        f"{opts.rounds} timed rounds (+{opts.warmup} warm-up); load average {os.getloadavg()[0]:.2f}",
        file=out,
    )
    header = (
        f"{'side':<18} {'runs/s':>7} {'calls/s':>8} {'ratio':>6} {'paired':>6} {'worker ms':>9} "
        f"{'x plain':>7} {'server ms':>9} {'x plain':>7}   history of one run"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for side in sides:
        rate = statistics.median(side.rates)
        worker = statistics.median(side.worker_ms)
        server = statistics.median(side.server_ms)
        ratio = paired = ""
        if side is not plain:
            ratio = f"{rate / base_rate:.2f}"
            paired = f"{statistics.median(s / p for s, p in zip(side.rates, plain.rates, strict=True)):.2f}"
        h = histories.get(side.name, {})
        shown = (
            f"{h.get('events', 0)} events, {h.get('bytes', 0) / 1024:.1f} KB, {h.get('upserts', 0)} upserts, "
            f"{h.get('markers', 0)} markers, {h.get('workflow_tasks', 0)} workflow tasks, {h.get('signals', 0)} signals"
        )
        print(
            f"{side.name:<18} {rate / opts.steps:>7.1f} {rate:>8.1f} {ratio:>6} {paired:>6} {worker:>9.2f} "
            f"{worker / base_worker:>7.2f} {server:>9.2f} {server / base_server:>7.2f}   {shown}",
            file=out,
            flush=True,
        )
        if side.unsettled:
            print(f"note: {side.unsettled} call(s) of {side.name} did not settle", file=out)


def compile_bytecode() -> None:
    """Write the bytecode of the project's packages (as a wheel install does), whatever
    ``PYTHONDONTWRITEBYTECODE`` says: the workflow sandbox re-imports the workflow modules per run."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for package in ("agentlease", "activities", "workflows", "reconciliation", "bench"):
        compileall.compile_dir(root / package, quiet=1)


def bytecode_note() -> str:
    """Whether the workflow sandbox's re-imports of the workflow modules find bytecode."""
    import agentlease.workflow

    modules = sorted(Path(agentlease.workflow.__file__ or "").parent.glob("*.py"))
    cached = all(Path(cache_from_source(str(module))).exists() for module in modules)
    writes = "off" if sys.dont_write_bytecode else "on"
    return (
        f"workflow sandbox re-imports per run: the {len(modules)} modules of agentlease.workflow "
        f"{'with' if cached else 'without'} bytecode (.pyc present: {cached}; bytecode writing {writes})"
    )


async def bench(opts: argparse.Namespace) -> None:
    out = sys.stdout
    load = os.getloadavg()
    print(
        f"python {platform.python_version()}, temporalio {version('temporalio')}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        file=out,
    )
    if opts.bytecode:
        compile_bytecode()
    print(bytecode_note(), file=out, flush=True)
    async with AsyncExitStack() as stack:
        data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentlease-bench-runs-")))
        env, _log = await stack.enter_async_context(quiet_dev_server(data_dir))
        address = env.client.service_client.config.target_host
        server = server_pids(data_dir)
        sides = [Side(PLAIN, None)]
        urls = {"agent-run-sqlite": f"sqlite:///{data_dir / 'ledger.db'}"}
        if opts.pg_url:
            urls["agent-run-pg"] = await stack.enter_async_context(
                scratch_postgres_database(opts.pg_url, "agentlease_bench_runs", timeout_s=5.0)
            )
        for name, url in urls.items():
            ledger = Ledger.from_url(url)
            try:
                await upgrade(ledger.database)
            finally:
                await ledger.close()
            sides.append(Side(name, url))
        for workers in opts.workers:
            for side in sides:
                for measured in (side.rates, side.worker_ms, side.server_ms):
                    measured.clear()
            async with AsyncExitStack() as running:
                start_workers(sides, workers, address, running)
                for index in range(opts.warmup):
                    for side in rotated(sides, index):
                        await run_round(env.client, side, opts, server, f"w{index}")
                for index in range(opts.rounds):
                    for side in rotated(sides, index):
                        await run_round(env.client, side, opts, server, f"r{index}")
                    cells = "   ".join(f"{side.name} {side.rates[-1]:7.1f} calls/s" for side in sides)
                    print(f"{workers} worker(s), round {index + 1}/{opts.rounds}: {cells}", file=out, flush=True)
                histories = {side.name: await history_of(env.client, side.last_run) for side in sides if side.last_run}
            report(sides, workers, histories, opts, out)
    print(
        "\ncalls/s: median over rounds; ratio: of medians; paired: median of per-round ratios; worker ms / server ms: "
        "CPU per call of the side's worker processes / of the Temporal dev server, median over rounds",
        file=out,
    )


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.runs", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="concurrent runs per side per round (default 200)")
    parser.add_argument("--steps", type=int, default=5, help="tool calls per run (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--workers", type=_ints, default=[1, 2], help="worker processes per side (default 1,2)")
    parser.add_argument("--pg-url", default=default_pg_url() or "postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL side")
    parser.add_argument(
        "--no-bytecode",
        dest="bytecode",
        action="store_false",
        help="do not compile the project's bytecode first (an editable install under PYTHONDONTWRITEBYTECODE has "
        "none: the sandbox then compiles the workflow modules from source on every run)",
    )
    opts = parser.parse_args(argv)
    if opts.no_pg:
        opts.pg_url = None
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(bench(parse_args(argv)))


if __name__ == "__main__":
    main()
    exit_process(0)  # not a finalization the Temporal SDK's threads can abort (agentlease.runtime.shutdown)
