"""How fast a lease is taken over after its worker is killed or paused (``docs/recovery.md``).

::

    python -m bench.recovery --faults 5 --runs-per-fault 3 --ttl 2 --ttl 10
    python -m bench.recovery --agent openai --ttl 5   # or --agent pydantic: the call inside an agent run

For each mode (``kill``: SIGKILL, ``pause``: SIGSTOP until the task settled elsewhere, then
SIGCONT) and each lease TTL, it runs ``--faults`` rounds. A round starts two ``agentlease worker``
processes on a fresh task queue, starts ``--runs-per-fault`` agent runs of one step each whose
first attempt holds its lease in ``external_call`` (renewing every TTL / 4,
:mod:`bench.recovery_tools`), waits until every one is held, signals the worker holding the most
and measures, for each task that worker held, from the ledger's evidence trail:

- ``takeover``: the new claim minus the superseded holder's last renewal (ledger clock);
- ``settle``: the settle minus the fault (ledger clock);
- ``run end``: the run's close time (Temporal's clock, same host) minus the fault;
- ``attempt``: the Temporal attempt that settled.

It prints p50 / p95 / max per mode and TTL, then each run's takeover and how many are within the aim, the
TTL + 3 s (``docs/ttl.md``, "How soon another worker takes over"). The ledger is a scratch PostgreSQL database on
``--pg-url`` (default ``AGENTLEASE_TEST_PG_URL``, else the local server), or ``--sqlite``;
Temporal is a dev server of its own (``--dynamic-config KEY=VALUE`` to try server settings);
``--worker-env KEY=VALUE`` sets worker settings (``AGENTLEASE_STICKY_SCHEDULE_TO_START``...).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.clock import to_ms
from agentlease.enums import EventKind, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep
from agentlease.runtime.devserver import scratch_postgres_database
from agentlease.runtime.shutdown import exit_process
from agentlease.workflow._plan import AgentRunWorkflow
from bench.faults import TemporalProcess
from bench.recovery_tools import HOLDING, TOOL_OF_TTL
from tests.acceptance.fleet import Fleet, Worker, wait_polling
from tests.acceptance.runner import Cli
from tests.eventually import assert_eventually

MODES = ("kill", "pause")
STEP = "hold"
AGENTS = ("plan", "openai", "pydantic")
"""What calls the holding tool: an ``AgentRunWorkflow`` plan, or an agent on the OpenAI Agents SDK or Pydantic AI."""
AGENT_WORKERS = {
    "openai": ("agentlease.demo.agents.openai_agent", "bench.recovery_openai"),
    "pydantic": ("agentlease.demo.agents.pydantic_ai_agent", "bench.recovery_pydantic"),
}
"""Per agent: the example's worker module that serves it, and the benchmark's workflow module it loads."""
TAKEOVER_SLACK_S = 3
"""The aim: every takeover, after a kill or a pause, within the lease TTL plus this many seconds."""
PG_ADMIN_URL = os.environ.get("AGENTLEASE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass
class Sample:
    """One task taken over after a fault."""

    takeover_s: float
    settle_s: float
    run_end_s: float
    attempt: int


@dataclass
class Cell:
    mode: str
    ttl: int
    agent: str = "plan"
    samples: list[Sample] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _seconds(later: datetime, earlier: datetime) -> float:
    return (to_ms(later) - to_ms(earlier)) / 1000


def _last(events: list[LeaseEvent], kind: EventKind, generation: int) -> LeaseEvent:
    return [e for e in events if e.kind is kind and e.claim_generation == generation][-1]


class Round:
    """Two workers, some held runs, one fault."""

    def __init__(
        self, client: Client, ledger: Ledger, fleet: Fleet, work: Path, mode: str, ttl: int, runs: int, agent: str
    ):
        self.client, self.ledger, self.fleet, self.work = client, ledger, fleet, work
        self.mode, self.ttl, self.agent = mode, ttl, agent
        name = f"{mode}-{ttl}s-{uuid.uuid4().hex[:8]}"
        self.queue = f"recovery-{name}"
        self.runs = [f"{name}-{i}" for i in range(runs)]
        self.workers: list[Worker] = []

    def release_file(self, run_id: str) -> Path:
        return self.work / f"{run_id}.release"

    async def holders(self) -> dict[str, str]:
        """Run id -> the worker identity holding generation 1, once every run holds."""
        found: dict[str, str] = {}
        for run_id in self.runs:
            events = await self.ledger.events(agent_run_id=run_id)
            held = [
                e for e in events if e.kind is EventKind.RENEWED and e.reason == HOLDING and e.claim_generation == 1
            ]
            assert held, f"{run_id} does not hold yet"
            found[run_id] = held[-1].lease_owner or ""
        return found

    async def run(self) -> list[Sample]:
        self.workers = [self._start_worker(f"{self.queue}-{side}") for side in ("a", "b")]
        await asyncio.gather(*(wait_polling(self.client, self.queue, w, timeout=90) for w in self.workers))
        handles = {run_id: await self._start_run(run_id) for run_id in self.runs}
        holders = await assert_eventually(self.holders, timeout=90, interval=0.25, message="every run holds")
        victim = max(self.workers, key=lambda w: sum(owner == w.identity for owner in holders.values()))
        victims = [run_id for run_id, owner in holders.items() if owner == victim.identity]
        for run_id in self.runs:  # only generation 1 reads it: the survivor's own runs settle now
            self.release_file(run_id).touch()
        fault_at = await self.ledger.db_now()
        victim.signal(signal.SIGKILL if self.mode == "kill" else signal.SIGSTOP)
        try:
            results = await asyncio.gather(*(self._measure(handles[r], r, fault_at) for r in victims))
        finally:
            for worker in self.workers:
                await asyncio.to_thread(worker.stop)
        return list(results)

    def _start_worker(self, identity: str) -> Worker:
        if self.agent == "plan":
            return self.fleet.start(self.queue, identity)
        program, workflows = AGENT_WORKERS[self.agent]
        env = {"AGENTLEASE_TOOL_MODULES": "bench.recovery_tools", "AGENTLEASE_WORKFLOW_MODULES": workflows}
        return self.fleet.start(self.queue, identity, env=env, program=Path(sys.executable), args=("-m", program))

    async def _start_run(self, run_id: str) -> Any:
        """Start one run whose one call is the holding tool of the round's TTL."""
        tool, arguments = TOOL_OF_TTL[self.ttl], {"release_file": str(self.release_file(run_id))}
        if self.agent == "openai":
            from agentlease.demo.agents import scripted_prompt
            from agentlease.demo.agents.openai_agent import AgentRequest

            prompt = scripted_prompt(f"hold {run_id}", [{"tool": tool, "arguments": arguments}])
            return await self.client.start_workflow(
                "RecoveryOpenAIAgent", AgentRequest(prompt=prompt), id=run_id, task_queue=self.queue
            )
        if self.agent == "pydantic":
            from tests.integration.pydantic_ai_agents import prompt_for

            prompt = prompt_for([(tool, arguments)])
            return await self.client.start_workflow("RecoveryPydanticAgent", prompt, id=run_id, task_queue=self.queue)
        plan = AgentRunPlan(agent_run_id=run_id, steps=[PlanStep(step_id=STEP, tool=tool, arguments=arguments)])
        return await self.client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=self.queue)

    async def _measure(self, handle: Any, run_id: str, fault_at: datetime) -> Sample:
        await asyncio.wait_for(handle.result(), timeout=30 * self.ttl + 120)
        closed = (await handle.describe()).close_time
        [task_id] = {e.task_id for e in await self.ledger.events(agent_run_id=run_id)}
        events = await self.ledger.events(task_id)
        record = await self.ledger.get_task(task_id)
        assert record.status is TaskStatus.SETTLED and record.claim_generation >= 2, record
        claim = _last(events, EventKind.CLAIMED, record.claim_generation)
        renewed = _last(events, EventKind.RENEWED, 1)
        settled = _last(events, EventKind.SETTLED, record.claim_generation)
        return Sample(
            takeover_s=_seconds(claim.at, renewed.at),
            settle_s=_seconds(settled.at, fault_at),
            run_end_s=_seconds(closed.astimezone(UTC), fault_at),
            attempt=claim.trace.attempt or 0,
        )


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0], ordered[0], ordered[0]
    cuts = statistics.quantiles(ordered, n=20, method="inclusive")
    return statistics.median(ordered), cuts[18], ordered[-1]


def report(cells: list[Cell], opts: argparse.Namespace, out: Any) -> None:
    print(
        f"\nrecovery after a fault: {opts.agent} runs, 2 workers, {opts.runs_per_fault} held runs per fault, "
        f"ledger {'SQLite' if opts.sqlite else 'PostgreSQL'}",
        file=out,
    )
    if opts.dynamic_config:
        print(f"server dynamic config: {', '.join(opts.dynamic_config)}", file=out)
    if opts.worker_env:
        print(f"worker settings: {', '.join(opts.worker_env)}", file=out)
    header = f"{'mode':<6} {'TTL':>4} {'n':>3}  {'takeover p50/p95/max':>22}  {'settle-fault p50/p95/max':>26}"
    print(header + f"  {'run end-fault p50/p95/max':>27}  attempts", file=out)
    for cell in cells:
        if not cell.samples:
            print(f"{cell.mode:<6} {cell.ttl:>3}s   0  (no sample: {'; '.join(cell.failures)[:200]})", file=out)
            continue
        cols = []
        for values in (
            [s.takeover_s for s in cell.samples],
            [s.settle_s for s in cell.samples],
            [s.run_end_s for s in cell.samples],
        ):
            p50, p95, top = _quantiles(values)
            cols.append(f"{p50:6.1f} {p95:6.1f} {top:6.1f}s")
        attempts = sorted(s.attempt for s in cell.samples)
        line = f"{cell.mode:<6} {cell.ttl:>3}s {len(cell.samples):>3}  {cols[0]:>22}  {cols[1]:>26}  {cols[2]:>27}"
        print(f"{line}  {attempts}", file=out)
        if cell.failures:
            print(f"       {len(cell.failures)} failed round(s): {'; '.join(cell.failures)[:300]}", file=out)
    for cell in cells:
        if cell.samples:
            aim = cell.ttl + TAKEOVER_SLACK_S
            runs = " ".join(f"{s.takeover_s:.1f}" for s in cell.samples)
            within = sum(s.takeover_s <= aim for s in cell.samples)
            print(
                f"{cell.mode} TTL {cell.ttl}s: takeover per run {runs} s; {within} of {len(cell.samples)} within "
                f"TTL + {TAKEOVER_SLACK_S}s ({aim}s)",
                file=out,
            )


@asynccontextmanager
async def ledger_url(opts: argparse.Namespace, work: Path) -> AsyncIterator[str]:
    if opts.sqlite:
        yield f"sqlite:///{work / 'ledger.db'}"
        return
    async with scratch_postgres_database(opts.pg_url, "agentlease_recovery") as url:
        yield url


async def bench(opts: argparse.Namespace) -> list[Cell]:
    work = Path(tempfile.mkdtemp(prefix="agentlease-recovery-"))
    (work / "data").mkdir()
    dynamic = dict(item.split("=", 1) for item in opts.dynamic_config)
    async with AsyncExitStack() as stack:
        temporal = TemporalProcess(work / "temporal", dynamic_config=dynamic)
        temporal.start()
        stack.callback(temporal.close)
        url = await stack.enter_async_context(ledger_url(opts, work))
        ledger = Ledger.from_url(url)
        stack.push_async_callback(ledger.close)
        await upgrade(ledger.database)
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
        env = dict(item.split("=", 1) for item in opts.worker_env)
        fleet = Fleet(temporal.address, url, Cli(cwd=work, data_dir=work / "data"), "bench.recovery_tools", env)
        stack.push_async_callback(fleet.stop_all)
        cells = [Cell(mode, ttl, opts.agent) for mode in opts.mode for ttl in opts.ttl]
        for cell in cells:
            for index in range(opts.faults):
                one = Round(client, ledger, fleet, work, cell.mode, cell.ttl, opts.runs_per_fault, cell.agent)
                try:
                    cell.samples.extend(await one.run())
                except Exception as exc:  # noqa: BLE001 - a failed round is reported, the others still run
                    cell.failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                print(f"{cell.mode} TTL {cell.ttl}s round {index + 1}/{opts.faults} done", file=sys.stderr, flush=True)
        return cells


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n")[0])
    parser.add_argument("--faults", type=int, default=5, help="faults per mode and TTL (default 5)")
    parser.add_argument("--runs-per-fault", type=int, default=3, help="held runs per fault (default 3)")
    parser.add_argument("--ttl", type=int, action="append", choices=sorted(TOOL_OF_TTL), help="lease TTL, s")
    parser.add_argument("--mode", action="append", choices=MODES, help="kill and/or pause (default both)")
    parser.add_argument("--agent", choices=AGENTS, default="plan", help="what calls the tool (default plan)")
    parser.add_argument("--sqlite", action="store_true", help="a SQLite ledger instead of PostgreSQL")
    parser.add_argument("--pg-url", default=PG_ADMIN_URL, help="PostgreSQL server for the scratch ledger")
    parser.add_argument("--dynamic-config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE")
    opts = parser.parse_args(argv)
    opts.ttl = opts.ttl or sorted(TOOL_OF_TTL)
    opts.mode = opts.mode or list(MODES)
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    report(asyncio.run(bench(opts)), opts, sys.stdout)


if __name__ == "__main__":
    main()
    exit_process(0)  # not a finalization the Temporal SDK's threads can abort (agentlease.runtime.shutdown)
