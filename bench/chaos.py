"""The chaos run: many agent runs while workers, Temporal and the ledger fail under them (``docs/recovery.md``).

::

    python -m bench.chaos --runs 1000 --seed 7          # the long form (tens of minutes on 2 cores)
    python -m bench.chaos --runs 24 --faults-every 6    # about the short form CI runs (tests/chaos)

What runs:

- a Temporal dev server of its own on a database file (:class:`bench.faults.TemporalProcess`);
- a PostgreSQL ledger, a cluster of its own on another port (:class:`bench.faults.PostgresCluster`);
- the downstream of :mod:`tests.acceptance.matrix_downstream`, which counts every write it accepts, on a
  scratch database of ``--downstream-pg-url`` (the machine's PostgreSQL, never faulted);
- three ``agentlease worker`` processes serving :mod:`bench.chaos_tools`;
- ``--runs`` agent runs of three steps each (idempotent, fenced, unsafe), at most ``--in-flight`` at once.

While runs are under way a driver makes a fault every ``--faults-every`` seconds (± half), each kind
once in every round of five, in a random order (``--seed``): SIGKILL a worker (restarted a moment
later), SIGSTOP one for two lease TTLs then SIGCONT, SIGTERM one and start another, restart the
Temporal server on its database file, stop the ledger's PostgreSQL and start it again. Once every run
has started (and at least ``--min-faults`` faults were made), the faults stop, everything is up again,
and the runs are given ``--heal-s`` seconds to end.

What it prints, from the downstream's and the ledger's own records: runs completed; runs waiting for a
person and why (an unsafe send interrupted past ``external_call`` waits for reconciliation, G7);
duplicate effects per idempotency key; writes of a superseded generation the downstream accepted; tasks
settled twice; lost runs (neither ended nor waiting when the time is up); recovery times (a takeover's
new claim minus the superseded holder's last renewal; the first settle after a Temporal or ledger
restart). The goal is 0 duplicates, 0 stale writes accepted, 0 settled twice, 0 lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

from agentlease.enums import EventKind, RunState, TaskStatus
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep, RunStatus
from agentlease.runtime.devserver import scratch_postgres_database
from agentlease.runtime.names import STATUS_QUERY
from agentlease.runtime.shutdown import exit_process
from agentlease.workflow._plan import AgentRunWorkflow
from bench.chaos_tools import CHAOS_TOOLS, LEASE_TTL
from bench.faults import PostgresCluster, TemporalProcess
from tests.acceptance.fleet import Fleet, Worker
from tests.acceptance.matrix_downstream import Effect, MatrixDownstream, running_matrix_downstream
from tests.acceptance.runner import Cli

_RPC = timedelta(seconds=3)
"""Deadline of one describe or query of a run."""
PG_ADMIN_URL = os.environ.get("AGENTLEASE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
FAULTS = ("kill_worker", "pause_worker", "restart_worker", "restart_temporal", "restart_ledger")
WORKERS = 3
TTL_S = LEASE_TTL.total_seconds()


@dataclass
class ChaosOptions:
    """One chaos run's shape (the CLI flags, see the module docstring)."""

    runs: int = 1000
    in_flight: int = 12
    faults_every: float = 10.0
    seed: int = 7
    work_s: float = 0.6
    heal_s: float = 300.0
    min_faults: int = len(FAULTS)
    downstream_pg_url: str = PG_ADMIN_URL


@dataclass
class ChaosReport:
    """What the run left behind, counted from the downstream's and the ledger's own records."""

    runs: int = 0
    completed: int = 0
    waiting: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    stale_accepted: list[str] = field(default_factory=list)
    settled_twice: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    takeovers_s: list[float] = field(default_factory=list)
    resumed_after_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    elapsed_s: float = 0.0

    @property
    def clean(self) -> bool:
        """0 duplicates, 0 stale writes accepted, 0 settled twice, 0 lost or failed; every run accounted for."""
        waiting = sum(self.waiting.values())
        return not (self.duplicates or self.stale_accepted or self.settled_twice or self.lost or self.failed) and (
            self.completed + waiting == self.runs
        )

    def lines(self) -> list[str]:
        waiting = ", ".join(f"{why}: {n}" for why, n in sorted(self.waiting.items())) or "none"
        out = [
            f"chaos run: {self.runs} runs x {len(CHAOS_TOOLS)} tool calls in {self.elapsed_s:.0f}s; faults: "
            + ", ".join(f"{name} x{self.faults[name]}" for name in FAULTS),
            f"runs completed: {self.completed}",
            f"runs waiting for a person: {sum(self.waiting.values())} ({waiting})",
            f"duplicate effects per idempotency key: {len(self.duplicates)} {sorted(self.duplicates.items())[:5]}",
            f"stale-generation writes accepted: {len(self.stale_accepted)} {self.stale_accepted[:5]}",
            f"tasks settled twice: {len(self.settled_twice)} {self.settled_twice[:5]}",
            f"lost runs: {len(self.lost)} {self.lost[:5]}; failed runs: {len(self.failed)} {self.failed[:5]}",
            f"recovery: takeover (new claim - last renewal, TTL {TTL_S:g}s) {_spread(self.takeovers_s)}",
        ]
        for fault, seconds in sorted(self.resumed_after_s.items()):
            out.append(f"recovery: first settle after {fault} {_spread(seconds)}")
        return out


def _spread(values: list[float]) -> str:
    if not values:
        return "n=0"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"n={len(ordered)} p50 {statistics.median(ordered):.1f}s p95 {p95:.1f}s max {ordered[-1]:.1f}s"


class Chaos:
    """The stack, the runs and the fault driver of one chaos run."""

    def __init__(self, opts: ChaosOptions, work: Path) -> None:
        self.opts = opts
        self.work = work
        self.rng = random.Random(opts.seed)
        self.report = ChaosReport(runs=opts.runs)
        self.tag = uuid.uuid4().hex[:6]
        self.queue = f"chaos-{self.tag}"
        self.temporal = TemporalProcess(work / "temporal")
        self.ledger_pg = PostgresCluster()
        self.workers: list[Worker] = []
        self.started = 0
        self.restarts: list[tuple[str, float]] = []
        """(fault, when the stack was whole again, ledger clock epoch seconds)."""
        self.bag: list[str] = []
        self.handles: dict[str, WorkflowHandle[Any, RunStatus]] = {}
        self.pending: set[str] = set()
        self.fleet: Fleet | None = None
        self.client: Client | None = None

    # -- the stack -----------------------------------------------------------------------------

    def start_worker(self, slot: int) -> Worker:
        assert self.fleet is not None
        worker = self.fleet.start(self.queue, f"chaos-{self.tag}-w{slot}-{len(self.fleet.started)}")
        if slot < len(self.workers):
            self.workers[slot] = worker
        else:
            self.workers.append(worker)
        return worker

    def next_fault(self) -> str:
        """The next fault: every kind once in each round of five, in a random order."""
        if not self.bag:
            self.bag = list(FAULTS)
            self.rng.shuffle(self.bag)
        return self.bag.pop()

    async def fault(self, ledger: Ledger) -> None:
        name = self.next_fault()
        self.report.faults[name] += 1
        slot = self.rng.randrange(WORKERS)
        worker = self.workers[slot]
        if name == "kill_worker":
            worker.stop(signal.SIGKILL)
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
            self.start_worker(slot)
        elif name == "pause_worker":
            worker.signal(signal.SIGSTOP)
            await asyncio.sleep(self.rng.uniform(1.5, 2.5) * TTL_S)
            worker.signal(signal.SIGCONT)
        elif name == "restart_worker":
            await asyncio.to_thread(worker.stop, signal.SIGTERM, timeout=60)
            self.start_worker(slot)
        elif name == "restart_temporal":
            self.temporal.kill()
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
            await asyncio.to_thread(self.temporal.start)
            self.restarts.append((name, time.time()))
        else:
            await asyncio.to_thread(self.ledger_pg.stop, self.rng.choice(("immediate", "fast")))
            await asyncio.sleep(self.rng.uniform(1.0, 6.0))
            await asyncio.to_thread(self.ledger_pg.start)
            self.restarts.append((name, time.time()))

    async def drive_faults(self, ledger: Ledger, done: asyncio.Event) -> None:
        while not done.is_set():
            pause = self.rng.uniform(0.5, 1.5) * self.opts.faults_every
            try:
                await asyncio.wait_for(done.wait(), timeout=pause)
                return
            except TimeoutError:
                pass
            await self.fault(ledger)

    def heal(self) -> None:
        """Everything up again: the ledger, Temporal, every worker running (and none stopped)."""
        try:
            self.ledger_pg.start()
        except RuntimeError:
            pass  # already running
        if self.temporal.process is None or self.temporal.process.poll() is not None:
            self.temporal.start()
        for slot, worker in enumerate(self.workers):
            if worker.alive:
                worker.signal(signal.SIGCONT)
            else:
                self.start_worker(slot)

    # -- the runs ------------------------------------------------------------------------------

    def plan(self, run_id: str, base_url: str) -> AgentRunPlan:
        steps = [
            PlanStep(
                step_id=tool.removeprefix("chaos_"),
                tool=tool,
                arguments={"base_url": base_url, "target": f"{run_id}-{tool}", "work_s": self.opts.work_s},
            )
            for tool in CHAOS_TOOLS
        ]
        return AgentRunPlan(agent_run_id=run_id, steps=steps)

    async def start_runs(self, base_url: str) -> None:
        assert self.client is not None
        while self.started < self.opts.runs and len(self.pending) < self.opts.in_flight:
            run_id = f"chaos-{self.tag}-{self.started:05d}"
            try:
                self.handles[run_id] = await self.client.start_workflow(
                    AgentRunWorkflow.run, self.plan(run_id, base_url), id=run_id, task_queue=self.queue
                )
            except Exception:  # noqa: BLE001 - Temporal is restarting: try again on the next round
                return
            self.pending.add(run_id)
            self.started += 1

    async def settle_pending(self) -> None:
        """Move runs that ended, or wait for a person, out of the pending set."""
        for run_id in sorted(self.pending):
            handle = self.handles[run_id]
            try:
                described = await handle.describe(rpc_timeout=_RPC)
                if described.status == WorkflowExecutionStatus.COMPLETED:
                    self.pending.discard(run_id)
                    self.report.completed += 1
                elif described.status != WorkflowExecutionStatus.RUNNING:
                    self.pending.discard(run_id)
                    self.report.failed.append(f"{run_id}: {described.status}")
                else:
                    status = await handle.query(STATUS_QUERY, result_type=RunStatus, rpc_timeout=_RPC)
                    if status.status is RunState.WAITING:
                        self.pending.discard(run_id)
                        why = ", ".join(sorted({t.status.value for t in status.tasks if t.status.awaits_decision}))
                        self.report.waiting[why] = self.report.waiting.get(why, 0) + 1
            except Exception:  # noqa: BLE001 - no worker or no server at this moment: ask again later
                continue

    async def run(self) -> ChaosReport:
        began = time.monotonic()
        async with AsyncExitStack() as stack:
            self.temporal.start()
            stack.callback(self.temporal.close)
            self.ledger_pg.init()
            stack.callback(self.ledger_pg.close)
            ledger = Ledger.from_url(self.ledger_pg.url)
            stack.push_async_callback(ledger.close)
            await upgrade(ledger.database)
            downstream_url = await stack.enter_async_context(
                scratch_postgres_database(self.opts.downstream_pg_url, "agentlease_chaos")
            )
            downstream = await stack.enter_async_context(running_matrix_downstream(downstream_url))
            # Its own runtime, quiet below ERROR: the driver's calls fail on purpose while Temporal restarts.
            quiet = TelemetryConfig(
                logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
            )
            self.client = await Client.connect(
                self.temporal.address, data_converter=pydantic_data_converter, runtime=Runtime(telemetry=quiet)
            )
            (self.work / "data").mkdir(exist_ok=True)
            self.fleet = Fleet(
                self.temporal.address,
                self.ledger_pg.url,
                Cli(cwd=self.work, data_dir=self.work / "data"),
                "bench.chaos_tools",
                {"AGENTLEASE_SHUTDOWN_GRACE": "2"},
            )
            stack.push_async_callback(self.fleet.stop_all)
            for slot in range(WORKERS):
                self.start_worker(slot)
            all_started = asyncio.Event()
            driver = asyncio.ensure_future(self.drive_faults(ledger, all_started))
            try:
                while self.started < self.opts.runs or self.report.faults.total() < self.opts.min_faults:
                    await self.start_runs(downstream.base_url)
                    await self.settle_pending()
                    await asyncio.sleep(0.5)
            finally:
                all_started.set()
                await driver
            self.heal()
            deadline = time.monotonic() + self.opts.heal_s
            while self.pending and time.monotonic() < deadline:
                await self.settle_pending()
                await asyncio.sleep(1.0)
            self.report.lost = sorted(self.pending)
            await self.count(ledger, downstream)
        self.report.elapsed_s = time.monotonic() - began
        return self.report

    # -- counting ------------------------------------------------------------------------------

    async def count(self, ledger: Ledger, downstream: MatrixDownstream) -> None:
        accepted = await downstream.accepted()
        by_action: dict[str, list[Effect]] = defaultdict(list)
        for effect in accepted:
            by_action[effect.action].append(effect)
        self.report.duplicates = {key: len(found) for key, found in by_action.items() if len(found) > 1}
        newest: dict[str, int] = {}
        for effect in accepted:  # in the order the downstream accepted them
            generation = _generation(effect.writer)
            if generation < newest.get(effect.target, 0):
                self.report.stale_accepted.append(f"{effect.target} g{generation} after g{newest[effect.target]}")
            newest[effect.target] = max(newest.get(effect.target, 0), generation)
        trail = await ledger.events()
        settles = Counter(e.task_id for e in trail if e.kind is EventKind.SETTLED)
        self.report.settled_twice = sorted(task for task, n in settles.items() if n > 1)
        self.report.takeovers_s = _takeovers(trail)
        settled_at = sorted(e.at.timestamp() for e in trail if e.kind is EventKind.SETTLED)
        for fault, healed in self.restarts:
            after = [at - healed for at in settled_at if at >= healed]
            if after:
                self.report.resumed_after_s[fault].append(after[0])
        unsettled = [r for r in await ledger.list_tasks() if r.status is not TaskStatus.SETTLED]
        for record in unsettled:
            if record.agent_run_id in self.report.lost:
                continue
            if not (record.status.is_terminal or record.status.waits_for_person):
                self.report.lost.append(f"{record.task_id}: {record.status.value}")


def _generation(writer: str | None) -> int:
    """The generation in an ``X-Writer`` header (``<owner>#g<generation>``)."""
    return int((writer or "#g0").rsplit("#g", 1)[1])


def _takeovers(trail: list[LeaseEvent]) -> list[float]:
    """New claim minus the superseded generation's last renewal (or claim), for every takeover."""
    last: dict[tuple[str, int], float] = {}
    seconds: list[float] = []
    for event in trail:
        key = (event.task_id, event.claim_generation)
        if event.kind in (EventKind.CLAIMED, EventKind.RENEWED):
            last[key] = event.at.timestamp()
        took_over = event.kind is EventKind.EXPIRED and (event.details or {}).get("by") == "takeover"
        if took_over and key in last:
            seconds.append(event.at.timestamp() - last[key])
    return seconds


async def chaos(opts: ChaosOptions) -> ChaosReport:
    """One chaos run (see the module docstring); everything it started is stopped when it returns."""
    work = Path(tempfile.mkdtemp(prefix="agentlease-chaos-"))
    return await Chaos(opts, work).run()


def parse_args(argv: Sequence[str] | None = None) -> ChaosOptions:
    defaults = ChaosOptions()
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=defaults.runs, help=f"agent runs (default {defaults.runs})")
    parser.add_argument("--in-flight", type=int, default=defaults.in_flight, help="runs under way at most")
    parser.add_argument("--faults-every", type=float, default=defaults.faults_every, help="seconds between faults")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the fault driver")
    parser.add_argument("--work-s", type=float, default=defaults.work_s, help="seconds a tool works in external_call")
    parser.add_argument("--heal-s", type=float, default=defaults.heal_s, help="seconds runs get after the faults")
    parser.add_argument("--min-faults", type=int, default=defaults.min_faults, help="faults made at least")
    parser.add_argument("--downstream-pg-url", default=defaults.downstream_pg_url, help="the downstream's server")
    return ChaosOptions(**{k.replace("-", "_"): v for k, v in vars(parser.parse_args(argv)).items()})


def main(argv: Sequence[str] | None = None) -> None:
    report = asyncio.run(chaos(parse_args(argv)))
    print("\n".join(report.lines()))
    sys.exit(0 if report.clean else 1)


if __name__ == "__main__":
    main()
    exit_process(0)  # not a finalization the Temporal SDK's threads can abort (agentlease.runtime.shutdown)
