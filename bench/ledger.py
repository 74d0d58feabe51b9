"""The ledger alone: claim + renew + settle cycles per second, with latency per operation.

For each database (SQLite, PostgreSQL), each ledger size (``--rows``, filled in bulk by
:mod:`bench.fill`) and each number of concurrent claimers (``--claimers``), run cycles for
``--seconds``: claim a new task, renew it once (entering ``external_call``), settle it with a
receipt. Claimers are asyncio tasks sharing one :class:`~agentlease.ledger.store.Ledger`
(``--mode tasks``) or processes with a ledger each (``--mode processes``). No Temporal: this is
what the ledger database and its driver can do.

Also, per database and size: the sweeper recording ``--expired`` lapsed leases among the rows
(leases/s), and the CLI's ``waiting`` page read.

Run: ``python -m bench.ledger --rows 1000,100000 --claimers 1,8,32 --seconds 5`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agentlease.devserver import scratch_postgres_database
from agentlease.enums import SideEffectClass, Stage
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import SettlementReceipt, TaskSpec
from bench.fill import Fill, fill_ledger

OPERATIONS = ("claim", "renew", "settle")


@dataclass
class Cell:
    """One measured combination."""

    database: str
    rows: int
    mode: str
    claimers: int
    cycles: int = 0
    seconds: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPERATIONS})
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.cycles / self.seconds if self.seconds else 0.0


def _spec(prefix: str, n: int) -> TaskSpec:
    run = f"bench-{prefix}"
    return TaskSpec(
        task_id=f"{run}/c{n}",
        agent_run_id=run,
        step_id=f"c{n}",
        tool="bench_ledger",
        side_effect_class=SideEffectClass.IDEMPOTENT,
        idempotency_key=f"{run}:c{n}",
        lease_ttl=timedelta(seconds=30),
    )


def _receipt(n: int) -> SettlementReceipt:
    return SettlementReceipt(external_system="bench", external_id=str(n), status="done", verified_at=datetime.now(UTC))


async def _claimer(ledger: Ledger, deadline: float, latencies: dict[str, list[float]]) -> int:
    prefix = uuid.uuid4().hex[:10]
    n = 0
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        claim = await ledger.claim(_spec(prefix, n), "bench-claimer")
        t1 = time.perf_counter()
        await ledger.renew(claim, reason="calling the (simulated) external system", stage=Stage.EXTERNAL_CALL)
        t2 = time.perf_counter()
        await ledger.settle(claim, _receipt(n))
        t3 = time.perf_counter()
        latencies["claim"].append(t1 - t0)
        latencies["renew"].append(t2 - t1)
        latencies["settle"].append(t3 - t2)
        n += 1
    return n


async def _run_tasks(url: str, claimers: int, seconds: float) -> tuple[int, float, dict[str, list[float]], float]:
    ledger = Ledger.from_url(url, pool_size=claimers)
    latencies: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    try:
        await ledger.db_now()  # connect before the clock starts
        cpu = time.process_time()
        started = time.perf_counter()
        counts = await asyncio.gather(*(_claimer(ledger, started + seconds, latencies) for _ in range(claimers)))
        return sum(counts), time.perf_counter() - started, latencies, time.process_time() - cpu
    finally:
        await ledger.close()


def _process_main(url: str, seconds: float, start_at: float, out: Any) -> None:
    async def run() -> tuple[int, dict[str, list[float]], float]:
        ledger = Ledger.from_url(url, pool_size=1)
        latencies: dict[str, list[float]] = {op: [] for op in OPERATIONS}
        try:
            await ledger.db_now()
            await asyncio.sleep(max(0.0, start_at - time.time()))
            cpu = time.process_time()
            count = await _claimer(ledger, time.perf_counter() + seconds, latencies)
            return count, latencies, time.process_time() - cpu
        finally:
            await ledger.close()

    out.put(asyncio.run(run()))


def _run_processes(url: str, claimers: int, seconds: float) -> tuple[int, float, dict[str, list[float]], float]:
    """Claimer processes, started together once each has connected; CPU counted over the timed part only."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start_at = time.time() + 3.0  # every process connected before the clock starts
    processes = [context.Process(target=_process_main, args=(url, seconds, start_at, queue)) for _ in range(claimers)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    latencies: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    for _count, lat, _cpu in results:
        for op in OPERATIONS:
            latencies[op].extend(lat[op])
    return sum(r[0] for r in results), seconds, latencies, sum(r[2] for r in results)


async def _sweep(url: str, expired: int) -> tuple[int, float]:
    """Sweep the filled ledger's lapsed leases once: (recorded, seconds)."""
    from agentlease.recovery._sweeper import ExpiredLeaseSweeper

    ledger = Ledger.from_url(url)
    try:
        started = time.perf_counter()
        result = await ExpiredLeaseSweeper(ledger).run_once()
        return result.recorded, time.perf_counter() - started
    finally:
        await ledger.close()


def postgres_cpu_s() -> float:
    """CPU seconds used so far by this machine's ``postgres`` processes (the ledger's server, when local)."""
    total = 0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if "(postgres)" not in stat:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])  # utime stime cutime cstime
    return total / tick


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _print_cell(cell: Cell, out: Any) -> None:
    lat = "  ".join(
        f"{op} {_percentile(cell.latencies[op], 0.5):6.2f}/{_percentile(cell.latencies[op], 0.95):6.2f}"
        for op in OPERATIONS
    )
    per_cycle = max(cell.cycles, 1)
    cpu = f"{cell.client_cpu_s * 1000 / per_cycle:6.2f} {cell.server_cpu_s * 1000 / per_cycle:6.2f}"
    print(
        f"{cell.database:<10} {cell.rows:>9} {cell.mode:<9} {cell.claimers:>3} {cell.rate:>9.0f} {cpu}   {lat}",
        file=out,
        flush=True,
    )


async def bench(opts: argparse.Namespace) -> None:
    out = sys.stdout
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=out)
    print(
        f"{'database':<10} {'rows':>9} {'mode':<9} {'n':>3} {'cycles/s':>9} {'client':>6} {'server':>6}   "
        "p50/p95 ms per operation (claim, renew, settle)",
        file=out,
    )
    for database in opts.databases:
        for rows in opts.rows:
            async with AsyncExitStack() as stack:
                if database == "sqlite":
                    directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="agentlease-bench-ledger-"))
                    url = f"sqlite:///{Path(directory) / 'ledger.db'}"
                else:
                    url = await stack.enter_async_context(
                        scratch_postgres_database(opts.pg_url, "agentlease_bench_ledger", timeout_s=5.0)
                    )
                ledger = Ledger.from_url(url)
                try:
                    await upgrade(ledger.database)
                    await fill_ledger(ledger.database, Fill(tasks=rows, expired=min(opts.expired, rows)))
                finally:
                    await ledger.close()
                if opts.expired:
                    recorded, seconds = await _sweep(url, opts.expired)
                    print(
                        f"{database:<10} {rows:>9} sweeper: {recorded} lapsed leases in {seconds:.2f}s "
                        f"= {recorded / seconds:,.0f} leases/s",
                        file=out,
                        flush=True,
                    )
                for mode in opts.modes:
                    for claimers in opts.claimers:
                        cell = Cell(database, rows, mode, claimers)
                        server = postgres_cpu_s()
                        if mode == "tasks":
                            measured = await _run_tasks(url, claimers, opts.seconds)
                        else:
                            measured = await asyncio.to_thread(_run_processes, url, claimers, opts.seconds)
                        cell.cycles, cell.seconds, cell.latencies, cell.client_cpu_s = measured
                        cell.server_cpu_s = postgres_cpu_s() - server if database == "postgresql" else 0.0
                        _print_cell(cell, out)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=out)
    print(
        f"cycles/s: claim + renew + settle of a new task, all claimers together, over {opts.seconds:g}s; "
        "client / server: CPU ms per cycle of the claimers' processes and of the local postgres processes",
        file=out,
    )


def _ints(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=_ints, default=[1000, 100_000], help="ledger sizes (default 1000,100000)")
    parser.add_argument("--claimers", type=_ints, default=[1, 8, 32], help="concurrent claimers (default 1,8,32)")
    parser.add_argument(
        "--mode", dest="modes", default="tasks,processes", help="tasks, processes or both (default both)"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each cell (default 5)")
    parser.add_argument("--db", dest="databases", default="sqlite,postgresql", help="sqlite, postgresql or both")
    parser.add_argument(
        "--expired", type=int, default=10_000, help="lapsed leases among the rows for the sweeper (default 10000)"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AGENTLEASE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="PostgreSQL server; a scratch database is made there and dropped",
    )
    opts = parser.parse_args(argv)
    opts.modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    opts.databases = [d.strip() for d in opts.databases.split(",") if d.strip()]
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(bench(parse_args(argv)))


if __name__ == "__main__":
    main()
