"""Memory per in-flight call: a worker's resident memory with N long leased calls against N long plain ones.

For each ``--calls`` count N (100, 500, 1,000) and each side, a fresh worker process (separate OS
process, ``max_concurrent_activities`` >= N) serves ``bench.workflow.ToolCallsWorkflow`` runs of one
long call each:

- ``plain``: ``bench.tools.plain_hold``, which heartbeats its stage and waits, heartbeating;
- ``leased-sqlite`` / ``leased-pg``: the tool ``bench_hold`` through the leased activities
  (claim, ``ctx.advance``, renewals every TTL/3, settle), on a SQLite or PostgreSQL ledger.

The worker first runs ``--warmup`` calls to completion (imports, connections, compiled statements),
then its resident memory is read (``VmRSS``, idle); N runs are started and, once all N calls hold
(counted inside the worker) and the memory is steady, it is read again. Per call = the difference
over N; each leased side is also shown over plain at the same N, against the aim of
:data:`AIM_OVER_PLAIN_KB`. The calls are then released and the worker stopped. Sides alternate
within each N.

The worker reports through a small JSON status file that it replaces atomically (written beside it,
then renamed over it), so a read never sees half a report; a read that finds none yet is retried,
never counted as 0 MB. The worker process leaves with ``os._exit`` once its worker and ledger have
stopped, as the ``agentlease`` command does: a process that finalizes the interpreter after using
Temporal's client may abort in its Rust runtime's threads (temporalio/sdk-python#300).

Run: ``python -m bench.memory --calls 100,500,1000`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agentlease.devserver import scratch_postgres_database
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.shutdown import exit_process
from bench.overhead import default_pg_url, quiet_dev_server, rotated
from bench.tools import HOLD_TOOL, PLAIN_HOLD_ACTIVITY
from bench.workflow import BENCH_WORKFLOW, BenchBatch

PLAIN = "plain"
AIM_OVER_PLAIN_KB = 50.0
"""What a leased in-flight call may cost in resident memory beyond a plain one (KB)."""


def rss_kb() -> int:
    """This process's resident memory (KB), from ``/proc/self/status``."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def _serve(kind: str, task_queue: str, address: str, ledger_url: str | None, slots: int, status: str) -> None:
    """One worker process: serve until the ``<status>.stop`` file appears; report to ``status`` (JSON)."""

    async def main() -> None:
        from temporalio.worker import Worker

        from agentlease.settings import AgentLeaseSettings, default_identity
        from agentlease.temporal import connect
        from agentlease.tools._decisions import DecisionActivities
        from agentlease.tools._leased import LeasedActivities
        from agentlease.tools._registry import ToolRegistry
        from bench.tools import Holding, plain_hold
        from bench.workflow import ToolCallsWorkflow

        settings = AgentLeaseSettings(temporal_address=address, task_queue=task_queue, ledger_url=ledger_url or "")
        client = await connect(settings)
        ledger = None
        if kind == PLAIN:
            activities: list[Any] = [plain_hold]
        else:
            ledger = Ledger.from_url(settings.ledger_url)
            leased = LeasedActivities(ledger, ToolRegistry([HOLD_TOOL]), default_identity(), settings)
            activities = [*leased.activities(), *DecisionActivities(ledger).activities()]
        worker = Worker(
            client,
            task_queue=task_queue,
            workflows=[ToolCallsWorkflow],
            activities=activities,
            max_concurrent_activities=slots,
            max_cached_workflows=slots + 100,
            graceful_shutdown_timeout=settings.shutdown_grace,
        )
        path = Path(status)
        try:
            async with worker:
                while not Path(f"{status}.stop").exists():
                    if Path(f"{status}.release").exists():
                        Holding.released.set()
                    else:
                        Holding.released.clear()
                    _report(path, {"in_flight": Holding.in_flight, "rss_kb": rss_kb()})
                    await asyncio.sleep(0.2)
        finally:
            if ledger is not None:
                await ledger.close()

    code = 0
    try:
        asyncio.run(main())
    except BaseException:  # noqa: BLE001 - reported, then the same exit as a clean stop
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)  # worker and ledger stopped: skip finalizing (temporalio/sdk-python#300)


def _report(path: Path, state: dict[str, int]) -> None:
    """Replace the status file atomically: a reader sees the previous report or this one, never a part."""
    partial = path.with_name(f"{path.name}.partial")
    partial.write_text(json.dumps(state))
    os.replace(partial, path)


def _status(path: Path) -> dict[str, int] | None:
    """The worker's last report; ``None`` before its first one."""
    try:
        state: dict[str, int] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return state


async def _wait(path: Path, check: Any, timeout: float, what: str) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _status(path)
        if state is not None and check(state):
            return state
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{what} within {timeout}s (last report: {_status(path)})")


async def _rss_samples(path: Path, count: int) -> list[int]:
    """``count`` readings of the worker's resident memory (KB), 0.4 s apart."""
    samples = []
    for _ in range(count):
        await asyncio.sleep(0.4)
        state = await _wait(path, lambda _state: True, 30, "a report")
        samples.append(state["rss_kb"])
    return samples


async def measure(
    client: Any, side: str, url: str | None, calls: int, opts: argparse.Namespace, work: Path
) -> tuple[float, float]:
    """The idle worker's resident memory (MB) and the KB per in-flight call of ``side`` at ``calls`` calls."""
    task_queue = f"bench-memory-{side}-{uuid.uuid4().hex[:8]}"
    status = work / f"{task_queue}.json"
    context = multiprocessing.get_context("spawn")
    kind = PLAIN if side == PLAIN else "leased"
    address = client.service_client.config.target_host
    process = context.Process(target=_serve, args=(kind, task_queue, address, url, calls, str(status)), daemon=True)
    process.start()
    activity = PLAIN_HOLD_ACTIVITY if side == PLAIN else HOLD_TOOL.name

    async def run(label: str, n: int) -> list[Any]:
        batch = BenchBatch(activity=activity, tool=HOLD_TOOL.info(), calls=1)
        return [
            await client.start_workflow(BENCH_WORKFLOW, batch, id=f"{task_queue}-{label}-{i}", task_queue=task_queue)
            for i in range(n)
        ]

    try:
        await _wait(status, lambda s: s["in_flight"] == 0, 120, "worker started")
        Path(f"{status}.release").touch()  # warm-up calls finish at once
        await asyncio.gather(*(handle.result() for handle in await run("warmup", opts.warmup)))
        Path(f"{status}.release").unlink()
        await asyncio.sleep(0.5)  # the worker sees the calls are to hold again
        idle = min(await _rss_samples(status, 5))
        handles = await run("held", calls)
        await _wait(status, lambda s: s["in_flight"] == calls, 300 + 0.3 * calls, f"{calls} calls holding")
        held = max(await _rss_samples(status, 5))
        Path(f"{status}.release").touch()
        await asyncio.gather(*(handle.result() for handle in handles))
        return idle / 1024, (held - idle) / calls
    finally:
        Path(f"{status}.stop").touch()
        process.join(timeout=60)
        if process.is_alive():
            process.kill()


async def bench(opts: argparse.Namespace) -> None:
    out = sys.stdout
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=out)
    async with AsyncExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentlease-bench-memory-")))
        env, _log = await stack.enter_async_context(quiet_dev_server(work))
        sides: dict[str, str | None] = {PLAIN: None, "leased-sqlite": f"sqlite:///{work / 'ledger.db'}"}
        if opts.pg_url:
            sides["leased-pg"] = await stack.enter_async_context(
                scratch_postgres_database(opts.pg_url, "agentlease_bench_memory", timeout_s=5.0)
            )
        for url in sides.values():
            if url is not None:
                ledger = Ledger.from_url(url)
                try:
                    await upgrade(ledger.database)
                finally:
                    await ledger.close()
        results: dict[tuple[str, int], float] = {}
        idle: dict[str, list[float]] = {side: [] for side in sides}
        for index, calls in enumerate(opts.calls):
            for side in rotated(list(sides), index):
                idle_mb, results[side, calls] = await measure(env.client, side, sides[side], calls, opts, work)
                idle[side].append(idle_mb)
                print(
                    f"{side:<14} {calls:>5} calls in flight: {results[side, calls]:7.1f} KB per call "
                    f"(idle worker {idle_mb:.0f} MB)",
                    flush=True,
                )
    print(
        f"\n{'side':<14} " + " ".join(f"{n:>9}" for n in opts.calls) + "   KB per in-flight call; idle worker MB",
        file=out,
    )
    for side in sides:
        per_call = " ".join(f"{results[side, n]:>9.1f}" for n in opts.calls)
        print(f"{side:<14} {per_call}   {min(idle[side]):.0f}", file=out)
        if side != PLAIN:
            over = [results[side, n] - results[PLAIN, n] for n in opts.calls]
            verdict = "meets" if max(over) <= AIM_OVER_PLAIN_KB else "misses"
            shown = " ".join(f"{kb:>+9.1f}" for kb in over)
            print(f"{'  over plain':<14} {shown}   {verdict} the aim of <= +{AIM_OVER_PLAIN_KB:g} KB", file=out)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=out)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=_ints, default=[100, 500, 1000], help="calls in flight (default 100,500,1000)")
    parser.add_argument("--warmup", type=int, default=20, help="calls run to completion first (default 20)")
    parser.add_argument("--pg-url", default=default_pg_url() or "postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL side")
    opts = parser.parse_args(argv)
    if opts.no_pg:
        opts.pg_url = None
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(bench(parse_args(argv)))


if __name__ == "__main__":
    main()
    exit_process(0)  # not a finalization the Temporal SDK's threads can abort (agentlease.shutdown)
