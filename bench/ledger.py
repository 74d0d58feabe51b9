"""The ledger alone: claim + renew + settle cycles per second, beside a bare driver loop of the same SQL.

For each database (SQLite, PostgreSQL), each ledger size (``--rows``, filled in bulk by
:mod:`bench.fill`) and each number of concurrent claimers (``--claimers``), run cycles for
``--seconds``: claim a new task, renew it once (entering ``external_call``), settle it with a
receipt. Claimers are asyncio tasks sharing one :class:`~agentlease.ledger.store.Ledger`
(``--mode tasks``) or processes with a ledger each (``--mode processes``). No Temporal: this is
what the ledger database and its driver can do.

Each cell is measured for every *side*, in rotating order, each side in a fresh interpreter:

- ``ledger``: the :class:`~agentlease.ledger.store.Ledger` API (``claim``, ``renew``, ``settle``);
- ``bare``: the same cycle on the bare driver, no agentlease code on the path: the SQL the ledger
  sends for it (the lease writes of :func:`~agentlease.ledger.writes.lease_writes`, rendered
  once), with hand-built parameters; ``asyncpg`` (one connection per claimer, autocommit) on
  PostgreSQL, ``sqlite3`` on SQLite (one connection per process, ``BEGIN IMMEDIATE`` transactions;
  claimers of one process run as one loop, since one connection serialises them anyway);
- ``seed`` (PostgreSQL): the floor a hand-written lease table gives, on the bare driver: the three
  conditional statements of the design this ledger grew from (claim the oldest claimable row with
  ``FOR UPDATE SKIP LOCKED``, the guarded renewal, the guarded completion), on a table of their own
  with only the columns they use, filled with queued rows before the clock starts; no evidence
  trail, no receipts, no token;
- ``old`` (with ``--old DIR``): the ``Ledger`` of another source tree (``git worktree add DIR REV``),
  on the same filled database.

On PostgreSQL every cell starts on a vacuumed database (``VACUUM (ANALYZE)``, outside its window), so that no
side's window holds autovacuum's work on rows earlier cells wrote.

Also, per database and size: the sweeper recording ``--expired`` lapsed leases among the rows
(leases/s).

Run: ``python -m bench.ledger --rows 1000,1000000 --claimers 1,8,32 --seconds 3`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPERATIONS = ("claim", "renew", "settle")
ROOT = Path(__file__).resolve().parents[1]
"""The source tree this file belongs to (``agentlease`` and ``bench`` of the ``ledger`` and ``bare`` sides)."""

_BOOT = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('agentlease_bench_ledger_cell', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "sys.modules[spec.name] = module\n"
    "spec.loader.exec_module(module)\n"
    "module.cell_main(sys.argv[2])\n"
)
"""Runs one cell of this file in a fresh interpreter whose ``agentlease`` comes from ``PYTHONPATH``."""


@dataclass
class Cell:
    """One measured combination of database, size, mode, claimers and side."""

    database: str
    rows: int
    mode: str
    claimers: int
    side: str
    cycles: int = 0
    seconds: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    latency_ms: dict[str, list[float]] = field(default_factory=dict)
    """p50 and p95 (ms) per operation; empty for the bare side's SQLite loop (not timed per operation)."""

    @property
    def rate(self) -> float:
        return self.cycles / self.seconds if self.seconds else 0.0

    @property
    def client_ms(self) -> float:
        return self.client_cpu_s * 1000 / max(self.cycles, 1)

    @property
    def server_ms(self) -> float:
        return self.server_cpu_s * 1000 / max(self.cycles, 1)


# -- the ledger side ---------------------------------------------------------------------------


async def _ledger_claimer(ledger: Any, deadline: float, latencies: dict[str, list[float]]) -> int:
    from datetime import UTC, datetime, timedelta

    from agentlease.enums import SideEffectClass, Stage
    from agentlease.records import SettlementReceipt, TaskSpec

    run = f"bench-{uuid.uuid4().hex[:10]}"
    n = 0
    while time.perf_counter() < deadline:
        spec = TaskSpec(
            task_id=f"{run}/c{n}",
            agent_run_id=run,
            step_id=f"c{n}",
            tool="bench_ledger",
            side_effect_class=SideEffectClass.IDEMPOTENT,
            idempotency_key=f"{run}:c{n}",
            lease_ttl=timedelta(seconds=30),
        )
        t0 = time.perf_counter()
        claim = await ledger.claim(spec, "bench-claimer")
        t1 = time.perf_counter()
        await ledger.renew(claim, reason="calling the (simulated) external system", stage=Stage.EXTERNAL_CALL)
        t2 = time.perf_counter()
        receipt = SettlementReceipt(
            external_system="bench", external_id=str(n), status="done", verified_at=datetime.now(UTC)
        )
        await ledger.settle(claim, receipt)
        t3 = time.perf_counter()
        latencies["claim"].append(t1 - t0)
        latencies["renew"].append(t2 - t1)
        latencies["settle"].append(t3 - t2)
        n += 1
    return n


async def _ledger_cycles(url: str, claimers: int, start_at: float, seconds: float) -> dict[str, Any]:
    from agentlease.ledger.store import Ledger

    ledger = Ledger.from_url(url, pool_size=claimers)
    latencies: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    try:
        await ledger.db_now()  # connect before the clock starts
        # Each claimer's first cycle opens its pool connection: done once before timing.
        await asyncio.gather(*(ledger.db_now() for _ in range(claimers)))
        return await _timed(
            start_at,
            seconds,
            lambda deadline: asyncio.gather(*(_ledger_claimer(ledger, deadline, latencies) for _ in range(claimers))),
            latencies,
        )
    finally:
        await ledger.close()


# -- the bare side -----------------------------------------------------------------------------


def _bare_statements(dialect_name: str) -> dict[str, Any]:
    """The SQL of the ledger's cycle, rendered once, with its parameter order: on PostgreSQL each write's
    one statement, on SQLite each write's statements in the order the ledger runs them."""
    from sqlalchemy.dialects import postgresql, sqlite

    from agentlease.ledger.compiled import Compiled
    from agentlease.ledger.statements import lease_statements
    from agentlease.ledger.writes import lease_writes

    writes = lease_writes(dialect_name)
    if dialect_name == "postgresql":
        dialect: Any = postgresql.asyncpg.dialect()
        return {name: Compiled(getattr(writes, name).statement, dialect) for name in ("claim_new", "renew", "settle")}
    dialect = sqlite.pysqlite.dialect()
    return {
        "clock": Compiled(lease_statements(dialect_name).clock_check, dialect),
        "claim": Compiled(writes.claim_new.change, dialect),
        "claimed": Compiled(writes.claim_new.made[0], dialect),
        "stored": Compiled(writes.claim_new.result, dialect),
        "renew": Compiled(writes.renew.change, dialect),
        "renewed": Compiled(writes.renew.made[0], dialect),
        "receipt": Compiled(writes.settle.first, dialect),
        "settle": Compiled(writes.settle.change, dialect),
        "settled": Compiled(writes.settle.made[0], dialect),
    }


def _bare_values(run: str, n: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Parameters of one cycle: the new task, the holder guard, the receipt."""
    import hashlib
    import secrets
    from datetime import UTC, datetime

    token = hashlib.sha256(secrets.token_urlsafe(32).encode()).hexdigest()
    trace = {
        "trace_workflow_id": None,
        "trace_run_id": None,
        "trace_activity_id": None,
        "trace_attempt": None,
        "trace_id": None,
    }
    task = {
        "task_id": f"{run}/c{n}",
        "agent_run_id": run,
        "step_id": f"c{n}",
        "tool": "bench_ledger",
        "side_effect_class": "idempotent",
        "lease_ttl_ms": 30_000,
        "idempotency_key": f"{run}:c{n}",
        "arguments_sha256": None,
        "lease_owner": "bench-claimer",
        "lease_token_sha256": token,
        "now_ms": None,
        **trace,
    }
    held = {
        "held_task_id": task["task_id"],
        "held_owner": "bench-claimer",
        "held_generation": 1,
        "held_token_sha256": token,
        "now_ms": None,
        **{f"event_{k}": v for k, v in trace.items()},
    }
    receipt = {
        "external_system": "bench",
        "external_id": str(n),
        "status": "done",
        "details": {},
        "verified_at": datetime.now(UTC).isoformat(),
    }
    return task, held, receipt


async def _bare_pg_claimer(url: str, deadline_at: list[float], ready: asyncio.Event, out: list[int]) -> None:
    import asyncpg

    sql = _bare_statements("postgresql")
    claim, renew, settle = sql["claim_new"], sql["renew"], sql["settle"]
    conn = await asyncpg.connect(url)
    try:
        run = f"bare-{uuid.uuid4().hex[:10]}"
        await ready.wait()
        n = 0
        while time.perf_counter() < deadline_at[0]:
            task, held, receipt = _bare_values(run, n)
            event = {"event_reason": "attempt 1", "event_details": {}, **held}
            if not await conn.fetch(claim.sql, *claim.args({**task, **event})):
                raise RuntimeError("bare claim refused")
            renewed = {**held, "new_stage": "external_call", "lease_ttl_override_ms": None}
            renewed.update(event_reason="calling the (simulated) external system", event_details={})
            if not await conn.fetch(renew.sql, *renew.args(renewed)):
                raise RuntimeError("bare renew refused")
            settled = {
                **held,
                "receipt": receipt,
                "event_reason": "receipt bench",
                "event_details": {"receipt": receipt},
            }
            if not await conn.fetch(settle.sql, *settle.args(settled)):
                raise RuntimeError("bare settle refused")
            n += 1
        out.append(n)
    finally:
        await conn.close()


async def _bare_pg_cycles(url: str, claimers: int, start_at: float, seconds: float) -> dict[str, Any]:
    ready, deadline_at, counts = asyncio.Event(), [0.0], list[int]()
    tasks = [asyncio.create_task(_bare_pg_claimer(url, deadline_at, ready, counts)) for _ in range(claimers)]
    await asyncio.sleep(0.5)  # connected
    return await _timed(start_at, seconds, _released(tasks, ready, deadline_at, counts), {})


def _released(
    tasks: list[asyncio.Task[None]], ready: asyncio.Event, deadline_at: list[float], counts: list[int]
) -> Any:
    """What :func:`_timed` runs for claimer tasks waiting on ``ready``: set their deadline, release them, wait
    for them all; their cycle counts."""

    async def run(deadline: float) -> list[int]:
        deadline_at[0] = deadline
        ready.set()
        await asyncio.gather(*tasks)
        return counts

    return run


def _bare_sqlite_cycles(url: str, start_at: float, seconds: float) -> dict[str, Any]:
    """One process's claimers on one ``sqlite3`` connection: one synchronous loop, the ledger's transactions."""
    import sqlite3

    from agentlease.ledger.engine import SQLITE_BUSY_TIMEOUT_MS, sqlite_path, sqlite_pragmas

    path = sqlite_path(url, name="ledger")
    conn = sqlite3.connect(str(path), timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    sqlite_pragmas(conn, SQLITE_BUSY_TIMEOUT_MS)
    sql = _bare_statements("sqlite")
    run = f"bare-{uuid.uuid4().hex[:10]}"
    execute = conn.execute

    def step(name: str, params: dict[str, Any]) -> list[Any]:
        statement = sql[name]
        return execute(statement.sql, statement.args(params)).fetchall()

    def cycles(deadline: float) -> list[int]:
        n = 0
        while time.perf_counter() < deadline:
            task, held, receipt = _bare_values(run, n)
            event = {k: v for k, v in held.items() if k.startswith("event_")}
            execute("BEGIN IMMEDIATE")
            step("clock", {"now_ms": None})
            claimed = {**task, **event, "event_reason": "attempt 1", "event_details": {}}
            if not step("claim", claimed):
                raise RuntimeError("bare claim refused")
            step("claimed", claimed)
            step("stored", claimed)
            execute("COMMIT")
            execute("BEGIN IMMEDIATE")
            renewed = {**held, "new_stage": "external_call", "lease_ttl_override_ms": None}
            renewed.update(event_reason="calling the external system", event_details={})
            if not step("renew", renewed):
                raise RuntimeError("bare renew refused")
            step("renewed", renewed)
            execute("COMMIT")
            execute("BEGIN IMMEDIATE")
            settled = {
                **held,
                "receipt": receipt,
                "event_reason": "receipt bench",
                "event_details": {"receipt": receipt},
            }
            step("receipt", settled)
            if not step("settle", settled):
                raise RuntimeError("bare settle refused")
            step("settled", settled)
            execute("COMMIT")
            n += 1
        return [n]

    async def timed(deadline: float) -> list[int]:
        return cycles(deadline)

    try:
        return asyncio.run(_timed(start_at, seconds, timed, {}))
    finally:
        conn.close()


# -- the seed side -----------------------------------------------------------------------------

SEED_TABLE = """
CREATE TABLE IF NOT EXISTS seed_tasks (
    id text PRIMARY KEY,
    status text NOT NULL,
    lease_owner text,
    lease_expires_at timestamptz,
    claim_generation bigint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    result_ref text,
    available_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS seed_tasks_claimable ON seed_tasks (available_at, created_at)
    WHERE status IN ('queued', 'running');
"""
"""The seed side's table: lifecycle, current lease and claim generation in their own columns."""

SEED_CLAIM = """
WITH candidate AS (
    SELECT id FROM seed_tasks
    WHERE status = 'queued' OR (status = 'running' AND lease_expires_at < CURRENT_TIMESTAMP)
    ORDER BY available_at, created_at
    FOR UPDATE SKIP LOCKED
    LIMIT 1
)
UPDATE seed_tasks AS task
SET status = 'running', lease_owner = $1, lease_expires_at = $2,
    claim_generation = task.claim_generation + 1, attempts = task.attempts + 1
FROM candidate WHERE task.id = candidate.id
RETURNING task.id, task.claim_generation
"""
SEED_GUARD = (
    "id = $2 AND status = 'running' AND lease_owner = $3 AND claim_generation = $4"
    " AND lease_expires_at >= CURRENT_TIMESTAMP"
)
SEED_RENEW = f"UPDATE seed_tasks SET lease_expires_at = $1 WHERE {SEED_GUARD}"
SEED_COMPLETE = (
    "UPDATE seed_tasks SET status = 'completed', result_ref = $1, lease_owner = NULL, lease_expires_at = NULL "
    f"WHERE {SEED_GUARD}"
)
SEED_ROWS_PER_SECOND = 12_000
"""Queued rows put in the seed table per second of a cell, before its clock starts (more than any run here
claims; a claim that finds none stops the cell with an error)."""


async def _seed_pg_claimer(conn: Any, deadline_at: list[float], ready: asyncio.Event, out: list[int]) -> None:
    from datetime import UTC, datetime, timedelta

    owner, ttl = f"seed-{uuid.uuid4().hex[:10]}", timedelta(seconds=30)
    await ready.wait()
    n = 0
    while time.perf_counter() < deadline_at[0]:
        claimed = await conn.fetchrow(SEED_CLAIM, owner, datetime.now(UTC) + ttl)
        if claimed is None:
            raise RuntimeError("seed side: no queued row left to claim")
        task_id, generation = claimed
        if await conn.execute(SEED_RENEW, datetime.now(UTC) + ttl, task_id, owner, generation) != "UPDATE 1":
            raise RuntimeError("seed renew refused")
        if await conn.execute(SEED_COMPLETE, f"result/{n}", task_id, owner, generation) != "UPDATE 1":
            raise RuntimeError("seed completion refused")
        n += 1
    out.append(n)


async def _seed_pg_cycles(url: str, claimers: int, start_at: float, seconds: float) -> dict[str, Any]:
    import asyncpg

    conns = [await asyncpg.connect(url) for _ in range(claimers)]
    try:
        batch = f"q-{uuid.uuid4().hex[:10]}"
        await conns[0].execute(
            "INSERT INTO seed_tasks (id, status) SELECT $1 || '/' || g, 'queued' FROM generate_series(1, $2) g",
            batch,
            int(SEED_ROWS_PER_SECOND * seconds),
        )
        ready, deadline_at, counts = asyncio.Event(), [0.0], list[int]()
        tasks = [asyncio.create_task(_seed_pg_claimer(conn, deadline_at, ready, counts)) for conn in conns]
        return await _timed(start_at, seconds, _released(tasks, ready, deadline_at, counts), {})
    finally:
        for conn in conns:
            await conn.close()


# -- timing ------------------------------------------------------------------------------------


async def _timed(start_at: float, seconds: float, run: Any, latencies: dict[str, list[float]]) -> dict[str, Any]:
    """Wait for ``start_at`` (wall clock), run ``run(deadline)`` -> counts, measure CPU of this process and
    of the local postgres processes over that part only."""
    await asyncio.sleep(max(0.0, start_at - time.time()))
    server = postgres_cpu_s()
    cpu = time.process_time()
    started = time.perf_counter()
    counts = await run(started + seconds)
    elapsed = time.perf_counter() - started
    return {
        "cycles": sum(counts),
        "seconds": elapsed,
        "cpu": time.process_time() - cpu,
        "server": postgres_cpu_s() - server,
        "latency_ms": {
            op: [_percentile(values, 0.5), _percentile(values, 0.95)] for op, values in latencies.items() if values
        },
    }


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


def _one_process(job: dict[str, Any]) -> dict[str, Any]:
    """One process's share of a cell: its claimers, from ``start_at`` for ``seconds``."""
    url, claimers, start_at, seconds = job["url"], job["claimers"], job["start_at"], job["seconds"]
    if job["side"] == "bare":
        if url.startswith("sqlite"):
            return _bare_sqlite_cycles(url, start_at, seconds)
        return asyncio.run(_bare_pg_cycles(url, claimers, start_at, seconds))
    if job["side"] == "seed":
        return asyncio.run(_seed_pg_cycles(url, claimers, start_at, seconds))
    return asyncio.run(_ledger_cycles(url, claimers, start_at, seconds))


def cell_main(argument: str) -> None:
    """Entry point of a cell's interpreter: a job (JSON) in, its measurement (JSON) on the last line of stdout.

    Mode ``processes`` starts ``claimers`` interpreters of one claimer each, started together once each
    has connected, and adds them up (CPU of the claimer processes; the postgres server's over the whole).
    """
    job = json.loads(argument)
    if job["mode"] == "processes" and not job.get("child"):
        start_at = time.time() + 3.0 + 0.1 * job["claimers"]  # every process connected before the clock starts
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _BOOT,
                    __file__,
                    json.dumps({**job, "claimers": 1, "child": True, "start_at": start_at}),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(job["claimers"])
        ]
        server = None
        while time.time() < start_at:
            time.sleep(0.01)
        server = postgres_cpu_s()
        results = [
            json.loads(child.communicate(timeout=job["seconds"] + 120)[0].splitlines()[-1]) for child in children
        ]
        server_cpu = postgres_cpu_s() - server
        merged: dict[str, Any] = {
            "cycles": sum(r["cycles"] for r in results),
            "seconds": max(r["seconds"] for r in results),
            "cpu": sum(r["cpu"] for r in results),
            "server": server_cpu,
            "latency_ms": {
                op: [max(r["latency_ms"][op][i] for r in results) for i in (0, 1)]
                for op in OPERATIONS
                if all(op in r["latency_ms"] for r in results)
            },
        }
        import agentlease

        print(json.dumps({**merged, "agentlease": str(Path(agentlease.__file__).parent)}), flush=True)
        return
    job.setdefault("start_at", time.time() + 1.0)
    import agentlease

    print(json.dumps({**_one_process(job), "agentlease": str(Path(agentlease.__file__).parent)}), flush=True)


def _run_cell(cell: Cell, url: str, seconds: float, tree: Path) -> None:
    job = {"url": url, "claimers": cell.claimers, "seconds": seconds, "side": cell.side, "mode": cell.mode}
    if cell.mode == "tasks":
        job["start_at"] = 0.0  # as soon as connected (the cell waits for its own connections)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _BOOT, __file__, json.dumps(job)],
        env=env,
        cwd=tree,  # ``python -c`` puts the working directory first on sys.path
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=seconds + 180,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    if Path(result["agentlease"]).resolve() != (tree / "agentlease").resolve():
        raise RuntimeError(f"the {cell.side} side ran {result['agentlease']}, not {tree / 'agentlease'}")
    cell.cycles, cell.seconds, cell.client_cpu_s = result["cycles"], result["seconds"], result["cpu"]
    cell.server_cpu_s = result["server"] if url.startswith("postgresql") else 0.0
    cell.latency_ms = result["latency_ms"]


async def _execute(url: str, sql: str) -> None:
    """Run ``sql`` on its own connection to the scratch database, outside any cell's window: the seed side's
    table (:data:`SEED_TABLE`, its rows queued by each cell), and ``VACUUM (ANALYZE)`` before each cell, so that
    autovacuum does not clean up the rows earlier cells wrote (every side but ``seed`` writes the ledger's
    tables) inside this cell's window, where the server's CPU is counted."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _sweep(url: str, expired: int) -> tuple[int, float]:
    """Sweep the filled ledger's lapsed leases once: (recorded, seconds)."""
    from agentlease.ledger.store import Ledger
    from agentlease.recovery._sweeper import ExpiredLeaseSweeper

    ledger = Ledger.from_url(url)
    try:
        started = time.perf_counter()
        result = await ExpiredLeaseSweeper(ledger).run_once()
        return result.recorded, time.perf_counter() - started
    finally:
        await ledger.close()


FLOORS = ("bare", "seed")
"""The driver loops a side is compared with: the ledger's own statements, and the seed's."""
NO_RATIO = "    -      -"
"""The ratio columns of a floor itself, or of a floor not run for this database."""


def _ratios(cell: Cell, floors: list[Cell | None]) -> str:
    """Per floor: ``cell``'s cycles/s and its client CPU per cycle over the floor's (:data:`NO_RATIO`)."""
    return " ".join(
        NO_RATIO
        if floor is None or floor is cell or not (floor.rate and cell.rate)
        else f"{cell.rate / floor.rate:5.2f} {cell.client_ms / max(floor.client_ms, 1e-9):5.2f}"
        for floor in floors
    )


def _print_cell(cell: Cell, floors: list[Cell | None], out: Any) -> None:
    lat = "  ".join(f"{op} {cell.latency_ms[op][0]:5.2f}/{cell.latency_ms[op][1]:6.2f}" for op in cell.latency_ms)
    ratio = _ratios(cell, floors)
    load = os.getloadavg()[0]
    print(
        f"{cell.database:<10} {cell.rows:>9} {cell.mode:<9} {cell.claimers:>3} {cell.side:<6} {cell.rate:>8.0f} "
        f"{cell.client_ms:6.2f} {cell.server_ms:6.2f} {ratio} {load:5.2f}   {lat}",
        file=out,
        flush=True,
    )


def _print_medians(rounds: list[dict[str, Cell]], sides: list[str], floors: list[str], out: Any) -> None:
    """Per side: median cycles/s and client CPU per cycle over the rounds, and the medians of the per-round
    ratios to each floor side (each round's sides ran back to back)."""
    first = rounds[0][sides[0]]
    for side in sides:
        cells = [r[side] for r in rounds]
        ratios = []
        for floor in floors:
            if floor == side or floor not in sides:
                ratios.append(NO_RATIO)
                continue
            rate = statistics.median(r[side].rate / max(r[floor].rate, 1e-9) for r in rounds)
            cpu = statistics.median(r[side].client_ms / max(r[floor].client_ms, 1e-9) for r in rounds)
            ratios.append(f"{rate:5.2f} {cpu:5.2f}")
        print(
            f"{first.database:<10} {first.rows:>9} {first.mode:<9} {first.claimers:>3} {side + ' med':<6} "
            f"{statistics.median(c.rate for c in cells):>8.0f} {statistics.median(c.client_ms for c in cells):6.2f} "
            f"{statistics.median(c.server_ms for c in cells):6.2f} {' '.join(ratios)} {os.getloadavg()[0]:5.2f}   "
            f"(min-max {min(c.rate for c in cells):.0f}-{max(c.rate for c in cells):.0f} cycles/s)",
            file=out,
            flush=True,
        )


async def bench(opts: argparse.Namespace) -> None:
    from agentlease.ledger.migrate import upgrade
    from agentlease.ledger.store import Ledger
    from agentlease.runtime.devserver import scratch_postgres_database
    from bench.fill import Fill, fill_ledger

    out = sys.stdout
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=out)
    trees = {"ledger": ROOT, "bare": ROOT, "seed": ROOT}
    if opts.old:
        trees["old"] = Path(opts.old).resolve()
    chosen = [side for side in opts.sides if side in trees]
    floors = [floor for floor in FLOORS if floor in chosen]
    heads = [f"{'/' + floor + ': rate cpu':>11}" for floor in floors]
    print(
        f"{'database':<10} {'rows':>9} {'mode':<9} {'n':>3} {'side':<6} {'cycles/s':>8} {'client':>6} {'server':>6} "
        f"{' '.join(heads)} {'load':>5}   p50/p95 ms per operation",
        file=out,
    )
    rotation = 0
    for database in opts.databases:
        sides = [side for side in chosen if side != "seed" or database == "postgresql"]  # the seed's SQL is PG's
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
                    started = time.perf_counter()
                    await upgrade(ledger.database)
                    await fill_ledger(ledger.database, Fill(tasks=rows, expired=min(opts.expired, rows)))
                    if "seed" in sides:
                        await _execute(url, SEED_TABLE)
                    print(f"{database:<10} {rows:>9} filled in {time.perf_counter() - started:.1f}s", file=out)
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
                        rounds: list[dict[str, Cell]] = []
                        for _round in range(opts.rounds):
                            cells = {side: Cell(database, rows, mode, claimers, side) for side in sides}
                            order = sides[rotation % len(sides) :] + sides[: rotation % len(sides)] if sides else []
                            rotation += 1
                            for side in order:
                                if database == "postgresql":
                                    await _execute(url, "VACUUM (ANALYZE)")
                                await asyncio.to_thread(_run_cell, cells[side], url, opts.seconds, trees[side])
                            for side in sides:
                                _print_cell(cells[side], [cells.get(floor) for floor in floors], out)
                            rounds.append(cells)
                        if opts.rounds > 1:
                            _print_medians(rounds, sides, floors, out)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=out)
    print(
        f"cycles/s: claim + renew + settle of a new task, all claimers together, over {opts.seconds:g}s; "
        "client / server: CPU ms per cycle of the claimers' processes and of the local postgres processes; "
        "/bare, /seed: this side's cycles/s over that floor's, and its client CPU per cycle over the "
        "floor's; load: 1-minute load average after the cell",
        file=out,
    )


def _ints(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part.strip()]


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=_ints, default=[1000, 1_000_000], help="ledger sizes (default 1000,1000000)")
    parser.add_argument("--claimers", type=_ints, default=[1, 8, 32], help="concurrent claimers (default 1,8,32)")
    parser.add_argument("--mode", dest="modes", type=_names, default=["tasks"], help="tasks, processes or both")
    parser.add_argument(
        "--sides", type=_names, default=["ledger", "bare", "seed", "old"], help="ledger, bare, seed (PostgreSQL), old"
    )
    parser.add_argument("--old", default=None, help="source tree of the 'old' side (e.g. a git worktree of HEAD)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds per cell, sides in rotating order each round (default 1)"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each cell and side (default 3)")
    parser.add_argument("--db", dest="databases", type=_names, default=["sqlite", "postgresql"], help="databases")
    parser.add_argument(
        "--expired", type=int, default=0, help="lapsed leases among the rows for the sweeper (default 0)"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AGENTLEASE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="PostgreSQL server; a scratch database is made there and dropped",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(bench(parse_args(argv)))


if __name__ == "__main__":
    main()
