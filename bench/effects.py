"""Effect safety: how often a crash duplicates or loses a tool's effect, natively and with agentlease.

::

    python -m bench.effects --trials 20
    python -m bench.effects --matrix --trials 10    # first the edge's whole crash-point matrix (docs/edge.md)

The same scripted agent (:mod:`bench.effects_agents`: the model calls ``issue_refund`` once, then
answers) runs on eight systems, the OpenAI Agents SDK, Pydantic AI, LangGraph and Google ADK each with their native
Temporal tool and with agentlease's leased one, all with worker processes on one Temporal dev
server (``bench.faults.TemporalProcess``, one partition per task queue so that it lists a worker's
pollers as soon as they poll). The tool posts a refund to a service in a process of
its own that counts the refunds it applied per target (:mod:`bench.effects_downstream`); each
trial is one agent run with a target of its own. Crash points (:mod:`bench.effects_tools`):

=================  ==========================================================================
``kill_before``    SIGKILL while the first attempt holds before its request
``kill_after``     SIGKILL after the refund was applied and answered, before the tool returns
``kill_returned``  SIGKILL after the tool's activity returned (a leased one has settled), before
                   Temporal hears of it
``pause``          SIGSTOP before the request, until the call was taken over and the run ended;
                   then SIGCONT: the paused attempt sends its request at once
``response_lost``  no fault in the worker: the service applies the first refund and its answer
                   never arrives (the tool gives up after 2 s)
=================  ==========================================================================

The trials of a cell run ``--per-fault`` at a time: their first attempts all hold on a worker of
their own (started ahead, idle), a second worker of the system starts polling the queue, and the
first one is signalled once. Per cell it prints the duplicate-effect rate (a target refunded twice
or more), the lost-effect rate (never refunded, whatever the run says), the takeover latency (the
fault, or the lost answer's refund, to the start of the tool activity's next attempt, from the
attempts the workers log) and the refund requests sent per trial, then a summary table in
Markdown for the README. ``--systems openai-native-keyed`` adds the native tool sending a key made
from its activity (workflow id and activity id), as a careful Temporal user can.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.runtime.shutdown import exit_process
from bench.effects_downstream import RefundService, running_refund_service
from bench.effects_tools import AFTER_RETURN, DIR_ENV, DOWNSTREAM_ENV, refund_prompt
from bench.effects_worker import EXTRA_SYSTEMS, LEDGER_ENV, SYSTEMS, TEMPORAL_ENV, connect, workflow_class
from bench.faults import TemporalProcess
from tests.acceptance.runner import wait_for_poller
from tests.eventually import assert_eventually

REPO = Path(__file__).resolve().parents[1]

POINTS = {
    "kill_before": ("before_effect", signal.SIGKILL),
    "kill_after": ("after_effect", signal.SIGKILL),
    "kill_returned": (AFTER_RETURN, signal.SIGKILL),
    "pause": ("before_effect", signal.SIGSTOP),
    "response_lost": ("", None),
}
"""Each crash point: where the first attempt holds, and the signal its worker gets."""

ONE_PARTITION = {"matching.numTaskqueueReadPartitions": "1", "matching.numTaskqueueWritePartitions": "1"}
"""Dynamic config of the benchmark's dev server."""

RUN_TIMEOUT_S = 120.0
"""How long a trial's agent run may take after its fault before it counts as unfinished."""
LATE_WRITE_TIMEOUT_S = 15.0
"""How long a resumed attempt has to send its late request (or be cancelled before it)."""


class WorkerProcess:
    """A ``bench.effects_worker`` process: started ahead, told which queue to serve over its stdin."""

    def __init__(self, system: str, identity: str, process: asyncio.subprocess.Process) -> None:
        self.system, self.identity, self.process = system, identity, process

    @classmethod
    async def start(cls, system: str, identity: str, env: dict[str, str], log: Path) -> WorkerProcess:
        with log.open("ab") as sink:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.effects_worker",
                system,
                identity,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=sink,
                env=env,
                cwd=REPO,
            )
        started = cls(system, identity, process)
        await started.expect("ready", timeout=120)
        return started

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def expect(self, prefix: str, *, timeout: float) -> str:
        assert self.process.stdout is not None
        while True:
            line = (await asyncio.wait_for(self.process.stdout.readline(), timeout)).decode()
            if not line:
                raise RuntimeError(f"worker {self.identity} exited ({self.process.returncode}) instead of {prefix!r}")
            if line.startswith(prefix):
                return line.strip()

    async def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{command}\n".encode())
        await self.process.stdin.drain()

    async def serve(self, queue: str, client: Client) -> None:
        """Serve ``queue`` and return once Temporal lists this worker (``<identity>/<queue>``) among its pollers."""
        await self.send(f"serve {queue}")
        await self.expect("serving", timeout=60)

        def alive() -> None:
            assert self.alive, f"worker {self.identity} exited"

        await wait_for_poller(client, queue, f"{self.identity}/{queue}", timeout=60, alive=alive)

    async def release(self) -> None:
        await self.send("stop")
        await self.expect("stopped", timeout=60)

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            os.kill(self.process.pid, sig)

    async def close(self) -> None:
        if self.alive:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        await self.process.wait()


class Pool:
    """Idle worker processes of one system, started ahead so that a cell waits for none."""

    def __init__(self, system: str, env: dict[str, str], logs: Path, size: int) -> None:
        self.system, self.env, self.logs, self.size = system, env, logs, size
        self.starting: list[asyncio.Task[WorkerProcess]] = []
        self.started = 0

    def fill(self) -> None:
        while len(self.starting) < self.size:
            self.started += 1
            identity = f"{self.system}-{self.started}-{uuid.uuid4().hex[:6]}"
            log = self.logs / f"{identity}.log"
            self.starting.append(asyncio.create_task(WorkerProcess.start(self.system, identity, self.env, log)))

    async def take(self) -> WorkerProcess:
        self.fill()
        worker = await self.starting.pop(0)
        self.fill()
        return worker

    def give_back(self, worker: WorkerProcess) -> None:
        done: asyncio.Future[WorkerProcess] = asyncio.get_running_loop().create_future()
        done.set_result(worker)
        self.starting.insert(0, asyncio.ensure_future(done))

    async def close(self) -> None:
        for task in self.starting:
            task.cancel()
        for task in self.starting:
            with contextlib.suppress(BaseException):
                await (await task).close()


@dataclass
class Trial:
    """One agent run at one crash point, and what came of it."""

    target: str
    effects: int = 0
    requests: int = 0
    """Refund requests the tool sent (every attempt), answered, refused or lost."""
    outcome: str = "unfinished"
    takeover_s: float | None = None
    late: str = ""
    """``pause`` only: what the resumed attempt's late request got (``201``, ``409``...) or ``cancelled``."""


@dataclass
class Cell:
    system: str
    point: str
    trials: list[Trial] = field(default_factory=list)
    faults: int = 0
    seconds: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)

    @property
    def duplicates(self) -> int:
        return sum(t.effects > 1 for t in self.trials)

    @property
    def lost(self) -> int:
        return sum(t.effects == 0 for t in self.trials)

    @property
    def takeovers(self) -> list[float]:
        return [t.takeover_s for t in self.trials if t.takeover_s is not None]


def read_events(directory: Path) -> list[dict[str, Any]]:
    path = directory / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Bench:
    """Everything one run of the benchmark shares: the server, the service, the pools, the survivors."""

    def __init__(self, opts: argparse.Namespace, work: Path, service: RefundService, clients: dict[str, Client]):
        self.opts, self.work, self.service, self.clients = opts, work, service, clients
        self.control = work / "control"
        self.pools: dict[str, Pool] = {}
        self.survivors: dict[str, WorkerProcess] = {}

    async def chunk(self, cell: Cell, targets: list[str]) -> None:
        """Run ``targets`` at ``cell.point`` with one fault; fill in their trials."""
        system, (hold_at, sig) = cell.system, POINTS[cell.point]
        client = self.clients[system]
        victim = await self.pools[system].take()
        queue = f"effects-{system}-{cell.point}-{uuid.uuid4().hex[:6]}"
        await victim.serve(queue, client)
        for target in targets:
            (self.control / f"{target}.plan").write_text(hold_at)
        if sig is None:
            await self.service.lose_next_response(targets)
        workflow = workflow_class(system)
        handles = [await client.start_workflow(workflow.run, refund_prompt(t), id=t, task_queue=queue) for t in targets]
        fault_at = None
        survivor = self.survivors[system]
        if sig is not None:

            def held() -> None:
                missing = [t for t in targets if not (self.control / f"{t}.held").exists()]
                assert not missing, f"{len(missing)} of {len(targets)} not held yet"

            await assert_eventually(held, timeout=120, interval=0.1, message=f"{cell.system} {cell.point} held")
            await survivor.serve(queue, client)
            fault_at = time.time()
            victim.signal(sig)
            cell.faults += 1
        outcomes = await asyncio.gather(*(self._outcome(handle) for handle in handles))
        if cell.point == "pause":
            resumed_at = time.time()
            for target in targets:
                (self.control / f"{target}.resume").touch()
            victim.signal(signal.SIGCONT)
            await self._late_writes(victim, targets, resumed_at)
        if sig is None:
            await victim.release()
            self.pools[system].give_back(victim)
        else:
            await victim.close()
            await survivor.release()
        await self._record(cell, targets, outcomes, fault_at, victim)

    async def _outcome(self, handle: Any) -> str:
        try:
            await asyncio.wait_for(handle.result(), timeout=RUN_TIMEOUT_S)
        except TimeoutError:
            return "unfinished"
        except Exception as exc:  # noqa: BLE001 - a failed run is an outcome to report
            return f"failed ({type(exc).__name__})"
        return "completed"

    async def _late_writes(self, victim: WorkerProcess, targets: list[str], after: float) -> None:
        """Wait until each resumed attempt sent its request or cannot any more (cancelled, timed out)."""
        pid = victim.process.pid

        def settled() -> None:
            done = {
                e["target"]
                for e in read_events(self.control)
                if e["pid"] == pid and e["t"] >= after and e["event"] in ("refunded", "refund_failed")
            }
            assert done >= set(targets), f"{len(set(targets) - done)} late requests not sent yet"

        with contextlib.suppress(AssertionError):
            await assert_eventually(settled, timeout=LATE_WRITE_TIMEOUT_S, interval=0.2, message="late requests")

    async def _record(
        self, cell: Cell, targets: list[str], outcomes: list[str], fault_at: float | None, victim: WorkerProcess
    ) -> None:
        effects = await self.service.effects(targets[0].rsplit("-", 1)[0])
        events = read_events(self.control)
        for target, outcome in zip(targets, outcomes, strict=True):
            trial = Trial(target, outcome=outcome)
            found = effects.get(target)
            trial.effects = found.count if found else 0
            mine = [e for e in events if e["target"] == target]
            trial.requests = sum(e["event"] in ("refunded", "refund_failed") for e in mine)
            if fault_at is not None:
                fault = fault_at
            elif found is not None and found.first_at_ms is not None:
                fault = found.first_at_ms / 1000  # the refund whose answer was lost
            else:
                fault = None
            if fault is not None:
                later = [e["t"] for e in mine if e["event"] == "started" and e["t"] > fault and e["attempt"] > 1]
                trial.takeover_s = min(later) - fault if later else None
            if cell.point == "pause":
                late = [
                    e
                    for e in mine
                    if e["pid"] == victim.process.pid and e["event"] in ("refunded", "refund_failed") and e["t"] > fault
                ]
                trial.late = (str(late[0].get("status") or late[0].get("error"))) if late else "cancelled"
            cell.trials.append(trial)

    async def cell(self, system: str, point: str) -> Cell:
        cell = Cell(system, point)
        started, load = time.monotonic(), os.getloadavg()[0]
        run = uuid.uuid4().hex[:6]
        targets = [f"{system}-{point}-{run}-{n}" for n in range(self.opts.trials)]
        for first in range(0, len(targets), self.opts.per_fault):
            await self.chunk(cell, targets[first : first + self.opts.per_fault])
        cell.seconds = time.monotonic() - started
        cell.load = (load, os.getloadavg()[0])
        return cell


def _rate(count: int, total: int) -> str:
    return f"{count}/{total} ({100 * count / total:.0f} %)" if total else "-"


def _latency(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"{statistics.median(ordered):.1f} / {p95:.1f} s (n={len(ordered)})"


def print_cell(cell: Cell, out: Any) -> None:
    n = len(cell.trials)
    requests = sum(t.requests for t in cell.trials) / max(n, 1)
    outcomes = sorted({t.outcome for t in cell.trials})
    late = ""
    if cell.point == "pause":
        fates: dict[str, int] = {}
        for trial in cell.trials:
            fates[trial.late] = fates.get(trial.late, 0) + 1
        late = "  late request: " + ", ".join(f"{k} x{v}" for k, v in sorted(fates.items()))
    print(
        f"{cell.system:<16} {cell.point:<14} n={n:<3} faults={cell.faults:<2} "
        f"duplicate {_rate(cell.duplicates, n):<13} lost {_rate(cell.lost, n):<13} "
        f"takeover p50/p95 {_latency(cell.takeovers):<20} requests/trial {requests:.2f}  "
        f"runs {', '.join(outcomes)}  ({cell.seconds:.0f}s, load {cell.load[0]:.1f}-{cell.load[1]:.1f}){late}",
        file=out,
        flush=True,
    )


def print_summary(cells: list[Cell], opts: argparse.Namespace, out: Any) -> None:
    systems = list(dict.fromkeys(c.system for c in cells))
    points = list(dict.fromkeys(c.point for c in cells))
    by = {(c.system, c.point): c for c in cells}
    print(
        f"\nDuplicate / lost effects per crash point ({opts.trials} trials per cell, {opts.per_fault} per fault; "
        "takeover p50 in brackets)\n",
        file=out,
    )
    print("| crash point | " + " | ".join(systems) + " |", file=out)
    print("|---|" + "---|" * len(systems), file=out)
    for point in points:
        row = []
        for system in systems:
            cell = by.get((system, point))
            if cell is None:
                row.append("")
                continue
            n = len(cell.trials)
            takeovers = cell.takeovers
            median = f" ({statistics.median(takeovers):.1f} s)" if takeovers else ""
            row.append(f"{cell.duplicates}/{n} dup, {cell.lost}/{n} lost{median}")
        print(f"| {point} | " + " | ".join(row) + " |", file=out)


async def edge_matrix(opts: argparse.Namespace, address: str, work: Path, out: Any) -> None:
    """The crash-point matrix of the downstream's edge (``docs/edge.md``), on each ledger of ``--dialects``."""
    from agentlease.runtime.devserver import scratch_postgres_database
    from tests.acceptance.edge_matrix import cells as matrix_cells
    from tests.acceptance.edge_matrix import grid, run_cells, table

    for dialect in opts.dialects:
        began = time.monotonic()
        wanted = matrix_cells(dialect)
        where = work / f"edge-{dialect}"
        where.mkdir()
        if dialect == "sqlite":
            results = await run_cells(address, f"sqlite:///{where / 'ledger.db'}", where, wanted)
        else:
            async with scratch_postgres_database(opts.pg_url, "agentlease_bench_edge") as url:
                results = await run_cells(address, url, where, wanted)
        print(f"\n## The edge's crash-point matrix, {dialect} ledger and downstreams\n", file=out)
        print(grid(results, dialect), file=out)
        broken = {c: o for c, o in results.items() if isinstance(o, str) or o.problems()}
        if opts.keep or broken:  # every cell (or every failed one) in a row, with the refused late requests
            print("\n" + table(results if opts.keep else broken), file=out)
        failed = [cell.id for cell in broken]
        print(
            f"\n{len(results) - len(failed)} of {len(results)} cells at one effect with an agreeing ledger "
            f"({time.monotonic() - began:.0f}s){'; failed: ' + ', '.join(failed) if failed else ''}",
            file=out,
            flush=True,
        )


async def bench(opts: argparse.Namespace) -> list[Cell]:
    out = sys.stdout
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=out, flush=True)
    began = time.monotonic()
    cells: list[Cell] = []
    async with AsyncExitStack() as stack:
        if opts.keep:
            work = Path(tempfile.mkdtemp(prefix="agentlease-bench-effects-"))
            print(f"work directory (kept): {work}", file=out)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentlease-bench-effects-")))
        (work / "control").mkdir()
        (work / "logs").mkdir()
        # One partition per task queue: Temporal then lists every poller of a queue, so a worker is
        # known to poll before its fault (with the dev server's four, a new worker's pollers may sit
        # on the other partitions and go unlisted for a minute).
        server = TemporalProcess(work / "temporal", dynamic_config=ONE_PARTITION)
        await asyncio.to_thread(server.start)
        stack.callback(server.close)
        if opts.matrix:
            await edge_matrix(opts, server.address, work, out)
            print("\n## Beside it: the frameworks' native tool activities and the leased ones\n", file=out, flush=True)
        ledger_url = f"sqlite:///{work / 'ledger.db'}"
        ledger = Ledger.from_url(ledger_url)
        try:
            await upgrade(ledger.database)
        finally:
            await ledger.close()
        service = await stack.enter_async_context(
            running_refund_service(f"sqlite:///{work / 'refunds.db'}", str(work / "logs" / "refunds.log"))
        )
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            TEMPORAL_ENV: server.address,
            LEDGER_ENV: ledger_url,
            DOWNSTREAM_ENV: service.base_url,
            DIR_ENV: str(work / "control"),
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        }
        clients = {system: await connect(system, server.address) for system in opts.systems}
        runner = Bench(opts, work, service, clients)
        for system in opts.systems:
            pool = Pool(system, env, work / "logs", opts.pool)
            pool.fill()
            runner.pools[system] = pool
            stack.push_async_callback(pool.close)
        for system in opts.systems:
            runner.survivors[system] = await runner.pools[system].take()
            stack.push_async_callback(runner.survivors[system].close)
        print(f"workers ready after {time.monotonic() - began:.0f}s", file=out, flush=True)
        for index, point in enumerate(opts.points):
            shift = index % len(opts.systems)
            for system in opts.systems[shift:] + opts.systems[:shift]:
                cell = await runner.cell(system, point)
                cells.append(cell)
                print_cell(cell, out)
    print_summary(cells, opts, out)
    load = os.getloadavg()
    print(
        f"\n{time.monotonic() - began:.0f}s in all; load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        file=out,
    )
    return cells


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.effects", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="agent runs per cell (default 20)")
    parser.add_argument(
        "--per-fault", type=int, default=10, help="trials sharing one fault (one victim worker; default 10)"
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, of {', '.join(SYSTEMS + EXTRA_SYSTEMS)} (default all but the last three)",
    )
    parser.add_argument("--points", default=",".join(POINTS), help=f"comma-separated, of {', '.join(POINTS)}")
    parser.add_argument("--pool", type=int, default=1, help="idle workers started ahead per system (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, events, databases)")
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="first the edge's crash-point matrix (docs/edge.md): every edge x crash point x fault",
    )
    parser.add_argument(
        "--dialects", default="sqlite,postgresql", help="the matrix's ledgers: sqlite, postgresql (default both)"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AGENTLEASE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL server for the matrix's databases (AGENTLEASE_TEST_PG_URL)",
    )
    opts = parser.parse_args(argv)
    opts.dialects = [d.strip() for d in opts.dialects.split(",") if d.strip()]
    opts.systems = [s.strip() for s in opts.systems.split(",") if s.strip()]
    opts.points = [p.strip() for p in opts.points.split(",") if p.strip()]
    unknown = [s for s in opts.systems if s not in SYSTEMS + EXTRA_SYSTEMS] + [
        p for p in opts.points if p not in POINTS
    ]
    unknown += [d for d in opts.dialects if d not in ("sqlite", "postgresql")]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    if opts.trials < 1 or opts.per_fault < 1 or opts.pool < 1:
        parser.error("--trials, --per-fault and --pool must be at least 1")
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(bench(parse_args(argv)))


if __name__ == "__main__":
    main()
    exit_process(0)  # not a finalization the Temporal SDK's threads can abort (agentlease.runtime.shutdown)
