"""What a lease costs a tool call: plain Temporal activities against leased ones, interleaved.

One Temporal dev server, one worker per side with the same settings, and the same workflow
(:mod:`bench.workflow`) driving N calls per round on each side, each call passing through
``preflight -> external_call -> commit`` and returning:

- ``plain``: a plain activity that heartbeats the stage details (no ledger);
- ``leased-sqlite``: the bench tool through :class:`agentlease.tools._leased.LeasedActivities` on a SQLite ledger;
- ``leased-pg``: the same on PostgreSQL, when ``--pg-url`` or ``AGENTLEASE_LEDGER_URL`` names one;
- ``agent-run-sqlite`` (``--agent-run``): the bench tool through ``AgentRunWorkflow``, for reference.

Rounds alternate the sides (rotating which goes first) so machine noise hits all of them alike.
The report gives each side's median calls/s over the rounds and its ratio to ``plain``.

Run: ``python -m bench.overhead --calls 200 --rounds 7 --concurrency 20`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from agentlease.decisions._activity import DecisionActivities
from agentlease.errors import AgentLeaseError, one_line
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, PlanStep, RunStatus
from agentlease.runtime.devserver import dev_server, scratch_postgres_database
from agentlease.runtime.names import AGENT_RUN_WORKFLOW
from agentlease.runtime.shutdown import exit_process
from agentlease.settings import AgentLeaseSettings, default_identity
from agentlease.tools._leased import LeasedActivities
from agentlease.tools._registry import ToolRegistry
from agentlease.workflow._plan import AgentRunWorkflow
from bench.tools import BENCH_TOOL, PLAIN_ACTIVITY, plain_stages
from bench.workflow import BENCH_WORKFLOW, BenchBatch, ToolCallsWorkflow

SideT = TypeVar("SideT")

PLAIN = "plain"
LEASED_SQLITE = "leased-sqlite"
LEASED_PG = "leased-pg"
AGENT_RUN_SQLITE = "agent-run-sqlite"
TARGET_RATIO = 0.95
"""The leased/plain ratio each ledger should reach."""

PG_CONNECT_TIMEOUT_S = 5.0
"""How long to wait for the PostgreSQL server when making the scratch database. Default 5s."""


# -- sides ---------------------------------------------------------------------------------------


@dataclass
class Side:
    """One way of running the bench's tool calls, with its own worker and task queue.

    Attributes:
        name: the row label.
        ledger: ``-``, ``sqlite`` or ``postgresql``.
        task_queue: ``agentlease-bench-<name>-<hex>``; only this side's worker polls it.
        activities: registered on the side's worker.
        start: starts one workflow of ``calls`` calls and returns how many settled.
        rates: calls/s of each timed round.
        cpu_ms: CPU time of this Python process (worker, client, ledger driver) per call, each round.
        unsettled: calls that did not settle (should stay 0).
    """

    name: str
    ledger: str
    task_queue: str
    activities: list[Any]
    start: Callable[[Client, Side, str, int], Awaitable[int]]
    rates: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    unsettled: int = 0


async def _run_bench_workflow(activity_name: str, client: Client, side: Side, workflow_id: str, calls: int) -> int:
    batch = BenchBatch(activity=activity_name, tool=BENCH_TOOL.info(), calls=calls)
    return await client.execute_workflow(
        BENCH_WORKFLOW, batch, id=workflow_id, task_queue=side.task_queue, result_type=int
    )


async def _run_agent_run(client: Client, side: Side, workflow_id: str, calls: int) -> int:
    plan = AgentRunPlan(
        agent_run_id=workflow_id,
        steps=[PlanStep(step_id=f"call-{i}", tool=BENCH_TOOL.name, arguments={"index": i}) for i in range(calls)],
    )
    status = await client.execute_workflow(
        AGENT_RUN_WORKFLOW, plan, id=workflow_id, task_queue=side.task_queue, result_type=RunStatus
    )
    return sum(task.status == "settled" for task in status.tasks)


def _task_queue(name: str) -> str:
    return f"agentlease-bench-{name}-{uuid.uuid4().hex[:8]}"


def plain_side() -> Side:
    """Plain heartbeating activities, no ledger."""
    return Side(
        PLAIN,
        "-",
        _task_queue(PLAIN),
        [plain_stages],
        lambda client, side, wid, n: _run_bench_workflow(PLAIN_ACTIVITY, client, side, wid, n),
    )


def leased_side(name: str, ledger: Ledger, settings: AgentLeaseSettings, *, agent_run: bool = False) -> Side:
    """The bench tool through the real leased-activity path on ``ledger``, with the activities of
    :func:`worker.build_worker` (tools and decisions)."""
    identity = f"{name}@{default_identity()}"
    leased = LeasedActivities(ledger, ToolRegistry([BENCH_TOOL]), identity, settings)
    activities = [*leased.activities(), *DecisionActivities(ledger).activities()]

    async def start(client: Client, side: Side, workflow_id: str, calls: int) -> int:
        if agent_run:
            return await _run_agent_run(client, side, workflow_id, calls)
        return await _run_bench_workflow(BENCH_TOOL.name, client, side, workflow_id, calls)

    return Side(name, ledger.database.dialect, _task_queue(name), activities, start)


def bench_worker(client: Client, side: Side, settings: AgentLeaseSettings) -> Worker:
    """The worker of one side: the settings of :func:`worker.build_worker`, the same for every side."""
    return Worker(
        client,
        task_queue=side.task_queue,
        workflows=[ToolCallsWorkflow, AgentRunWorkflow],
        activities=side.activities,
        identity=f"{side.name}@{default_identity()}",
        max_concurrent_activities=settings.max_concurrent_activities,
        graceful_shutdown_timeout=settings.shutdown_grace,
    )


# -- Temporal ----------------------------------------------------------------------------------


@asynccontextmanager
async def quiet_dev_server(data_dir: Path) -> AsyncIterator[tuple[WorkflowEnvironment, Path]]:
    """:func:`agentlease.runtime.devserver.dev_server` with its banner and logs in ``data_dir/temporal.log``.

    The server process inherits the standard streams it is started with; they point at the log
    file while it starts, so its output never interleaves with the report.
    """
    log_path = data_dir / "temporal.log"
    async with AsyncExitStack() as stack:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        try:
            with open(log_path, "ab") as log:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                env = await stack.enter_async_context(dev_server(data_dir / "temporal"))
        finally:
            for fd, original in zip((1, 2), saved, strict=True):
                os.dup2(original, fd)
                os.close(original)
        yield env, log_path


def server_errors(log_path: Path) -> list[str]:
    """Lines of the dev server's log at level ERROR (it logs none unless it struggled)."""
    if not log_path.exists():
        return []
    return [line for line in log_path.read_text(errors="replace").splitlines() if "level=ERROR" in line]


# -- ledgers -------------------------------------------------------------------------------------


@asynccontextmanager
async def migrated_ledger(url: str) -> AsyncIterator[Ledger]:
    """A ledger on ``url``, migrated to head; closed afterwards."""
    ledger = Ledger.from_url(url)
    try:
        await upgrade(ledger.database)
        yield ledger
    finally:
        await ledger.close()


def default_pg_url() -> str | None:
    """``AGENTLEASE_LEDGER_URL`` when it names a PostgreSQL database, else ``None``."""
    url = os.environ.get("AGENTLEASE_LEDGER_URL", "")
    return url if url.startswith(("postgresql", "postgres:")) else None


# -- rounds --------------------------------------------------------------------------------------


def split(calls: int, workflows: int) -> list[int]:
    """``calls`` spread over at most ``workflows`` workflows, as evenly as possible."""
    workflows = max(1, min(workflows, calls))
    base, extra = divmod(calls, workflows)
    return [base + (1 if i < extra else 0) for i in range(workflows)]


async def run_round(client: Client, side: Side, calls: int, concurrency: int, label: str) -> tuple[float, float, int]:
    """Run ``calls`` calls over ``concurrency`` concurrent workflows.

    Returns:
        (wall seconds, CPU seconds of this process, calls settled).
    """
    tag = uuid.uuid4().hex[:8]
    cpu = time.process_time()
    started = time.perf_counter()
    settled = await asyncio.gather(
        *(
            side.start(client, side, f"bench-{side.name}-{label}-{tag}-{i}", n)
            for i, n in enumerate(split(calls, concurrency))
        )
    )
    return time.perf_counter() - started, time.process_time() - cpu, sum(settled)


def rotated(sides: Sequence[SideT], by: int) -> list[SideT]:
    by %= len(sides)
    return [*sides[by:], *sides[:by]]


async def run_rounds(client: Client, sides: list[Side], opts: argparse.Namespace, out: Any) -> None:
    """Warm up, then run the timed rounds, rotating the order of the sides every round."""
    for index in range(opts.warmup):
        for side in rotated(sides, index):
            await run_round(client, side, opts.calls, opts.concurrency, f"w{index}")
    profiler = cProfile.Profile() if opts.profile else None
    for index in range(opts.rounds):
        cells = []
        for side in rotated(sides, index):
            profiling = profiler if side.name == opts.profile else None
            if profiling is not None:
                profiling.enable()
            seconds, cpu, settled = await run_round(client, side, opts.calls, opts.concurrency, f"r{index}")
            if profiling is not None:
                profiling.disable()
            side.rates.append(opts.calls / seconds)
            side.cpu_ms.append(cpu * 1000 / opts.calls)
            side.unsettled += opts.calls - settled
            cells.append(f"{side.name} {side.rates[-1]:7.1f}/s")
        print(f"round {index + 1}/{opts.rounds}: " + "   ".join(cells), file=out, flush=True)
    if profiler is not None:
        profiler.dump_stats(opts.profile_out)
        print(f"\ncProfile of {opts.profile} (event-loop thread, timed rounds) -> {opts.profile_out}", file=out)
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(25)


# -- report --------------------------------------------------------------------------------------


def report(sides: list[Side], opts: argparse.Namespace, settings: AgentLeaseSettings, out: Any) -> None:
    """Print each side's median calls/s, its spread, its CPU per call and its ratio to ``plain``."""
    plain = next(side for side in sides if side.name == PLAIN)
    plain_median = statistics.median(plain.rates)
    header = (
        f"{'side':<17} {'ledger':<10} {'calls/s':>8} {'min':>7} {'max':>7} {'cpu ms/call':>11} "
        f"{'leased/plain':>12} {'paired':>6}"
    )
    print(file=out)
    print(
        f"{opts.calls} calls per side per round over {opts.concurrency} concurrent workflows; {opts.rounds} timed "
        f"rounds (+{opts.warmup} warm-up); max_concurrent_activities={settings.max_concurrent_activities}",
        file=out,
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for side in sides:
        median = statistics.median(side.rates)
        if side is plain:
            ratio = paired = ""
        else:
            ratio = f"{median / plain_median:.2f}"
            paired = f"{statistics.median(s / p for s, p in zip(side.rates, plain.rates, strict=True)):.2f}"
        print(
            f"{side.name:<17} {side.ledger:<10} {median:>8.1f} {min(side.rates):>7.1f} {max(side.rates):>7.1f} "
            f"{statistics.median(side.cpu_ms):>11.2f} {ratio:>12} {paired:>6}",
            file=out,
        )
    print(file=out)
    print(
        "calls/s, cpu ms/call: medians over the timed rounds (cpu = this Python process, not the Temporal server)",
        file=out,
    )
    print("leased/plain: ratio of the medians; paired: median of the per-round ratios", file=out)
    for side in sides:
        if side.unsettled:
            print(f"note: {side.unsettled} call(s) of {side.name} did not settle", file=out)
    for side in sides:
        if side.name in (LEASED_SQLITE, LEASED_PG):
            ratio_of_medians = statistics.median(side.rates) / plain_median
            verdict = "meets" if ratio_of_medians >= TARGET_RATIO else "is below"
            print(f"{side.name}/plain = {ratio_of_medians:.2f}, which {verdict} the aim of {TARGET_RATIO}", file=out)


# -- main ----------------------------------------------------------------------------------------


async def bench(opts: argparse.Namespace) -> None:
    out = sys.stdout
    settings = AgentLeaseSettings()
    if opts.max_concurrent_activities is not None:
        settings = settings.model_copy(update={"max_concurrent_activities": opts.max_concurrent_activities})
    print(
        f"python {platform.python_version()}, temporalio {version('temporalio')}, "
        f"sqlalchemy {version('sqlalchemy')}, {os.cpu_count()} CPUs",
        file=out,
    )
    async with AsyncExitStack() as stack:
        data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentlease-bench-")))
        env, server_log = await stack.enter_async_context(quiet_dev_server(data_dir))
        sides = [plain_side()]
        sqlite_ledger = await stack.enter_async_context(migrated_ledger(f"sqlite:///{data_dir / 'ledger.db'}"))
        sides.append(leased_side(LEASED_SQLITE, sqlite_ledger, settings))
        if opts.pg_url:
            pg_url = opts.pg_url
            if not opts.pg_in_place:
                pg_url = await stack.enter_async_context(
                    scratch_postgres_database(opts.pg_url, "agentlease_bench", timeout_s=PG_CONNECT_TIMEOUT_S)
                )
            pg_ledger = await stack.enter_async_context(migrated_ledger(pg_url))
            sides.append(leased_side(LEASED_PG, pg_ledger, settings))
        if opts.agent_run:
            sides.append(leased_side(AGENT_RUN_SQLITE, sqlite_ledger, settings, agent_run=True))
        if opts.profile and opts.profile not in {side.name for side in sides}:
            raise SystemExit(f"--profile {opts.profile}: no such side in this run")
        for side in sides:
            await stack.enter_async_context(bench_worker(env.client, side, settings))
        print(f"sides: {', '.join(side.name for side in sides)}", file=out, flush=True)
        await run_rounds(env.client, sides, opts, out)
        report(sides, opts, settings, out)
        errors = server_errors(server_log)
        if errors:
            print(f"note: the Temporal dev server logged {len(errors)} error(s), e.g. {errors[0][:160]}", file=out)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead",
        description="Throughput of leased tool calls against plain Temporal activities (calls/s, interleaved rounds).",
    )
    parser.add_argument("--calls", type=int, default=200, help="tool calls per side per round (default 200)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds; the report takes medians (default 7)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up rounds first (default 1)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=20,
        help="concurrent workflows per round; each runs its share of the calls one after the other (default 20)",
    )
    parser.add_argument(
        "--max-concurrent-activities",
        type=int,
        default=None,
        help="worker slot count for every side (default AGENTLEASE_MAX_CONCURRENT_ACTIVITIES, else 100)",
    )
    parser.add_argument(
        "--pg-url",
        default=default_pg_url(),
        help="PostgreSQL server for the leased-pg side (default AGENTLEASE_LEDGER_URL when it is postgresql://); "
        "a scratch database is made on it and dropped afterwards",
    )
    parser.add_argument(
        "--pg-in-place",
        action="store_true",
        help="use the --pg-url database itself (migrated, bench tasks left in it) instead of a scratch database",
    )
    parser.add_argument("--no-pg", action="store_true", help="skip the leased-pg side")
    parser.add_argument(
        "--agent-run", action="store_true", help="add agent-run-sqlite: the tool through AgentRunWorkflow"
    )
    parser.add_argument(
        "--profile",
        choices=[PLAIN, LEASED_SQLITE, LEASED_PG, AGENT_RUN_SQLITE],
        help="cProfile this side's timed rounds (event-loop thread) and print the top functions",
    )
    parser.add_argument("--profile-out", default="bench-overhead.pstats", help="where --profile writes its stats")
    opts = parser.parse_args(argv)
    if opts.calls < 1 or opts.rounds < 1 or opts.concurrency < 1 or opts.warmup < 0:
        parser.error("--calls, --rounds and --concurrency must be at least 1, --warmup at least 0")
    if opts.no_pg:
        opts.pg_url = None
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    try:
        asyncio.run(bench(opts))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except (AgentLeaseError, OSError, asyncpg.PostgresError) as exc:
        # Unreachable PostgreSQL, a ledger that cannot be migrated, a missing temporal binary.
        print(f"error: {one_line(exc)}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
    exit_process(0)  # not a finalization the Temporal SDK's threads can abort (agentlease.runtime.shutdown)
