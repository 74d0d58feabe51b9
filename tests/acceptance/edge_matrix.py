"""The crash-point matrix of the downstream's edge: every edge x crash point x fault, with real processes.

Used by ``tests/acceptance/test_edge_matrix.py`` (a short form) and ``python -m bench.effects --matrix``
(the whole matrix); ``docs/edge.md`` keeps its table. A cell is one agent run (``AgentRunWorkflow``, one
step) whose tool call holds at a crash point (:mod:`tests.acceptance.edge_holds`) until the driver applies
a fault. Workers are ``agentlease worker`` processes (tools: :mod:`tests.acceptance.edge_tools`), the
downstreams processes of their own; effects are counted at the downstream, never in the ledger.

Edges: ``http`` (:class:`~agentlease.idempotency.IdempotencyMiddleware` in a real ASGI service,
:mod:`tests.acceptance.edge_service`), ``mcp-http`` and ``mcp-stdio`` (``LeaseGuard`` on the example CRM,
:mod:`tests.integration.mcp_crm`), ``sql`` (``fenced_write`` into a database). Crash points: ``before``
the request is sent (for MCP: at the server, before the guard sees it), ``inside`` the service before its
commit, ``committed`` before the answer, ``answered`` (the answer lost on its way back), ``after`` the
answer before the worker settles. Faults: ``kill`` (SIGKILL the worker; a second one takes over),
``pause`` (SIGSTOP past the lease TTL, a second worker takes over, then SIGCONT), ``drop`` (the client's
connection dropped, through a proxy the driver cuts), ``restart`` (the downstream's process killed and
started again). A cell passes with exactly one effect at the downstream and a ledger that agrees: settled
with the effect's receipt, or parked for a person naming the possible effect; never dead-lettered or
cancelled with the effect in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import make_url
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.enums import EventKind, TaskStatus
from agentlease.ledger.engine import create_async_database_engine
from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.records import AgentRunPlan, LeaseEvent, PlanStep, TaskRecord
from agentlease.runtime.devserver import scratch_postgres_database
from agentlease.workflow._plan import AgentRunWorkflow
from examples.mcp.crm_server import contacts
from tests.acceptance import edge_holds
from tests.acceptance.edge_service import charges
from tests.acceptance.edge_tools import LEASE_TTL, sql_charges
from tests.acceptance.fleet import REPO, Fleet, Worker, wait_polling
from tests.acceptance.runner import Cli
from tests.eventually import assert_eventually

EDGES = ("http", "mcp-http", "mcp-stdio", "sql")
POINTS = ("before", "inside", "committed", "answered", "after")
FAULTS = ("kill", "pause", "drop", "restart")
TOOLS = {
    "http": "edge_http_charge",
    "mcp-http": "crmhttp_create_contact",
    "mcp-stdio": "crmstdio_create_contact",
    "sql": "edge_sql_charge",
}
STEP = "act"
LEASE_TTL_S = LEASE_TTL.total_seconds()
LOCK_TIMEOUT_S = 3.0
"""The downstreams' key lock timeout: how long a key whose holder vanished before its commit stays blocked."""
START_TIMEOUT_S = 120.0
"""Deadline for workers and servers to come up and calls to reach their crash point (2 cores, many processes)."""
END_TIMEOUT_S = 150.0
"""Deadline for every call of a group to end once its fault was applied."""


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix."""

    edge: str
    point: str
    fault: str

    @property
    def id(self) -> str:
        return f"{self.edge}-{self.point}-{self.fault}"


def not_applicable(cell: Cell, dialect: str = "postgresql") -> str | None:
    """Why a cell does not exist, or ``None``."""
    if cell.edge == "sql":
        if cell.point == "answered":
            return "a SQL write's answer is its commit"
        if cell.fault == "restart":
            return "the SQL downstream is the database itself; its restart is the ledger-outage tests' subject"
        if cell.fault == "drop" and (cell.point != "inside" or dialect != "postgresql"):
            return "no database connection is open there" if cell.point != "inside" else "SQLite has no connection"
    if cell.edge == "http" and cell.fault == "drop" and cell.point in ("before", "after"):
        return "the worker holds no connection open there"
    if cell.edge == "mcp-stdio" and cell.fault == "drop":
        return "a stdio server's connection is its process: see restart"
    return None


def cells(dialect: str = "postgresql") -> list[Cell]:
    """Every cell that exists, in order."""
    every = [Cell(e, p, f) for e in EDGES for f in FAULTS for p in POINTS]
    return [cell for cell in every if not_applicable(cell, dialect) is None]


@dataclass
class Outcome:
    """What one cell left: effects at the downstream, the ledger's record, the downstream's answers."""

    cell: Cell
    target: str
    effects: list[dict[str, Any]]
    task: TaskRecord
    events: list[LeaseEvent]
    answers: list[dict[str, Any]]

    def problems(self) -> list[str]:
        """What is wrong with this cell (empty: it passes)."""
        found = []
        if len(self.effects) != 1:
            found.append(f"{len(self.effects)} effects at the downstream: {self.effects}")
        status = self.task.status
        if status is TaskStatus.SETTLED:
            receipt = self.task.receipt
            if receipt is None:
                found.append("settled without a receipt")
            elif self.cell.edge.startswith("mcp"):
                if (receipt.status, receipt.details.get("read_back")) != ("applied", True):
                    found.append(f"receipt {receipt.status} without readback: {receipt}")
            elif len(self.effects) == 1 and receipt.external_id != str(self.effects[0]["id"]):
                found.append(f"receipt {receipt.external_id} is not the effect {self.effects[0]['id']}")
        elif status is TaskStatus.NEEDS_RECONCILIATION:
            if "may have" not in (self.task.last_error or ""):
                found.append(f"parked without naming the possible effect: {self.task.last_error}")
        else:
            found.append(f"ended {status.value}: {self.task.last_error}")
        return found

    @property
    def ledger(self) -> str:
        """How the ledger ended, in a word: ``settled gN`` or ``parked``."""
        if self.task.status is TaskStatus.SETTLED:
            return f"settled g{self.task.claim_generation}"
        return self.task.status.value

    @property
    def refused_late(self) -> int:
        """Requests of generation 1 the downstream refused (stale, in flight, in doubt)."""
        refusals = ("stale_fencing_token", "idempotency_key_in_flight", "idempotency_key_in_doubt", "stale fencing")
        return sum(1 for a in self.answers if a.get("token") == "1" and any(r in str(a.get("error")) for r in refusals))

    @property
    def verdict(self) -> str:
        """A cell of :func:`grid`: effects and the ledger's end, or what is wrong."""
        problems = self.problems()
        return f"{len(self.effects)}, {self.ledger}" if not problems else f"**{'; '.join(problems)[:80]}**"


class Proxy:
    """A TCP forwarder on a loopback port, whose open connections the driver can drop."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = {writer, upstream_writer}
        self._open |= pair

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))
        self._open -= pair

    def drop(self) -> int:
        """Abort every open connection (both sides); returns how many were open."""
        dropped = len(self._open)
        for writer in list(self._open):
            writer.transport.abort()
        return dropped

    async def close(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Service:
    """A downstream process on a fixed port that the driver can kill and start again."""

    def __init__(self, args: Sequence[str], env: dict[str, str], port: int, log: Path) -> None:
        self.args = [sys.executable, *args]
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **env}
        self.port = port
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(  # noqa: ASYNC220 - a server that outlives this call
                self.args, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

        async def listening() -> None:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()[-2000:]
            with socket.socket() as sock:
                sock.settimeout(1)
                assert sock.connect_ex(("127.0.0.1", self.port)) == 0, "not listening yet"

        await assert_eventually(listening, timeout=START_TIMEOUT_S, interval=0.1, message=f"{self.args} listens")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@dataclass
class Downstream:
    """What a group's cells talk to: the worker's settings for it, and how to count effects and restart it."""

    edge: str
    database_url: str
    worker_env: dict[str, str]
    service: Service | None = None
    proxy: Proxy | None = None

    async def effects(self, target: str) -> list[dict[str, Any]]:
        table, column = {
            "http": (charges, charges.c.target),
            "sql": (sql_charges, sql_charges.c.target),
        }.get(self.edge, (contacts, contacts.c.email))
        engine = create_async_database_engine(self.database_url.replace("{target}", target), pool_size=1)
        try:
            async with engine.connect() as conn:
                rows = (await conn.execute(select(table).where(column == target))).mappings().all()
        finally:
            await engine.dispose()
        return [{"id": row.get("charge_id", row.get("id")), **dict(row)} for row in rows]


@asynccontextmanager
async def downstream(edge: str, database_url: str, control: Path, work: Path) -> AsyncIterator[Downstream]:
    """Start the downstream of ``edge`` on ``database_url`` (its tables made by the first request or here)."""
    env = {edge_holds.CONTROL_ENV: str(control), "EDGE_LOCK_TIMEOUT_S": str(LOCK_TIMEOUT_S)}
    async with AsyncExitStack() as stack:
        if edge == "sql":
            url = make_url(database_url)
            if url.get_backend_name() == "postgresql":
                proxy = Proxy(url.port or 5432)
                await proxy.start()
                stack.push_async_callback(proxy.close)
                proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
                yield Downstream(edge, database_url, {**env, "EDGE_SQL_URL": proxied}, proxy=proxy)
            else:  # a file per call: SQLite has one writer at a time
                per_call = database_url.replace(".db", "-{target}.db")
                yield Downstream(edge, per_call, {**env, "EDGE_SQL_URL": per_call})
            return
        if edge == "mcp-stdio":
            yield Downstream(edge, database_url, {**env, "EDGE_CRM_DATABASE_URL": database_url})
            return
        port = free_port()
        if edge == "http":
            service = Service(
                ["-m", "tests.acceptance.edge_service", database_url, str(port)], env, port, work / "svc.log"
            )
        else:
            service_env = {**env, "CRM_DATABASE_URL": database_url}
            service = Service(
                ["-m", "tests.integration.mcp_crm", "--http", str(port)], service_env, port, work / "svc.log"
            )
        await service.start()
        stack.callback(service.kill)
        proxy = Proxy(port)
        await proxy.start()
        stack.push_async_callback(proxy.close)
        url_env = (
            {"EDGE_HTTP_URL": f"http://127.0.0.1:{proxy.port}/"}
            if edge == "http"
            else {"EDGE_CRM_URL": f"http://127.0.0.1:{proxy.port}/mcp"}
        )
        yield Downstream(edge, database_url, {**env, **url_env}, service=service, proxy=proxy)


@dataclass
class Group:
    """The cells of one edge and one fault, sharing a task queue and a pair of worker processes."""

    client: Client
    ledger: Ledger
    fleet: Fleet
    down: Downstream
    control: Path
    fault: str
    cells: list[Cell]
    name: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    targets: dict[Cell, str] = field(default_factory=dict)
    handles: dict[Cell, WorkflowHandle[Any, Any]] = field(default_factory=dict)
    failed: dict[Cell, str] = field(default_factory=dict)
    first: Worker | None = None
    second: Worker | None = None

    @property
    def queue(self) -> str:
        return f"edge-{self.name}"

    def live(self) -> list[Cell]:
        return [cell for cell in self.cells if cell not in self.failed]

    def task_id(self, cell: Cell) -> str:
        return f"{self.targets[cell]}/{STEP}"

    async def task(self, cell: Cell) -> TaskRecord:
        return await self.ledger.get_task(self.task_id(cell))

    async def each(self, what: str, check: Callable[[Cell], Awaitable[object]], timeout: float) -> None:
        async def one(cell: Cell) -> None:
            try:
                await assert_eventually(
                    lambda: check(cell), timeout=timeout, interval=0.25, message=f"{cell.id}: {what}"
                )
            except AssertionError as exc:
                self.failed[cell] = str(exc)

        await asyncio.gather(*(one(cell) for cell in self.live()))

    def worker(self, role: str) -> Worker:
        env = {"AGENTLEASE_TOOL_MODULES": "tests.acceptance.edge_tools", **self.down.worker_env}
        return self.fleet.start(self.queue, f"edge-{self.name}-{role}", slots=len(self.cells) + 2, env=env)

    async def start(self) -> None:
        self.first = self.worker("first")
        await wait_polling(self.client, self.queue, self.first, timeout=START_TIMEOUT_S)
        for cell in self.cells:
            target = self.targets[cell] = f"{cell.id}-{uuid.uuid4().hex[:6]}"
            edge_holds.plan(self.control, self.subject(cell), cell.point)
            arguments: dict[str, Any] = {"target": target}
            if cell.edge.startswith("mcp"):
                arguments = {"name": "Ada", "email": self.subject(cell)}
            plan = AgentRunPlan(
                agent_run_id=target, steps=[PlanStep(step_id=STEP, tool=TOOLS[cell.edge], arguments=arguments)]
            )
            self.handles[cell] = await self.client.start_workflow(
                AgentRunWorkflow.run, plan, id=target, task_queue=self.queue
            )

    def subject(self, cell: Cell) -> str:
        """What the downstream calls the cell's call: the charge's target, the contact's email."""
        target = self.targets[cell]
        return f"{target}@example.com" if cell.edge.startswith("mcp") else target

    async def held(self, cell: Cell) -> None:
        assert edge_holds.is_held(self.control, self.subject(cell)), "not at its crash point yet"

    async def taken_over(self, cell: Cell) -> None:
        task = await self.task(cell)
        assert task.claim_generation >= 2 or task.status.is_terminal, task

    async def ended(self, cell: Cell) -> None:
        task = await self.task(cell)
        assert task.status.is_terminal or task.status.awaits_decision, task

    async def all_ended(self) -> None:
        for cell in self.live():
            await self.ended(cell)

    async def late_evidence(self, cell: Cell, since: float) -> None:
        """Generation 1, resumed, ended: a refused ledger write, or (MCP) its call refused by the server, which
        ends a leased MCP attempt without a ledger write; and its late request, when it sends one (the worker
        held it before sending), was answered."""
        events = await self.ledger.events(self.task_id(cell))
        claim2 = next((e for e in events if e.kind is EventKind.CLAIMED and e.claim_generation == 2), None)
        late = claim2 is not None and any(e.claim_generation == 1 and e.event_id > claim2.event_id for e in events)
        answers = [a for a in edge_holds.logged(self.control, self.subject(cell)) if a.get("token") == "1"]
        refused_at_server = cell.edge.startswith("mcp") and any(a.get("error") for a in answers)
        answered_late = any(a["t"] >= since for a in answers)
        sends_late = cell.point == "before" and cell.edge in ("http", "sql")
        assert (late or refused_at_server) and (answered_late or not sends_late), "generation 1 has not ended"

    def resume_all(self) -> None:
        for cell in self.cells:
            edge_holds.resume(self.control, self.subject(cell))

    async def apply_fault(self) -> None:
        assert self.first is not None
        if self.fault == "kill":
            self.second = self.worker("second")
            await wait_polling(self.client, self.queue, self.second, timeout=START_TIMEOUT_S)
            self.first.signal(signal.SIGKILL)
            await self.each("generation 2 claimed", self.taken_over, START_TIMEOUT_S)
            self.resume_all()
        elif self.fault == "pause":
            self.first.signal(signal.SIGSTOP)
            self.second = self.worker("second")
            await self.each("generation 2 claimed", self.taken_over, START_TIMEOUT_S)
            self.resume_all()
            # A paused holder inside a database transaction holds its locks until it runs again: give the
            # newer generation a while, then resume it (its late commit comes before the newer one's).
            with contextlib.suppress(AssertionError):
                await assert_eventually(self.all_ended, timeout=3 * LEASE_TTL_S, interval=0.25)
            resumed_at = time.time()
            self.first.signal(signal.SIGCONT)
            await self.each("the call ended", self.ended, END_TIMEOUT_S)
            await self.each("generation 1 acted late", lambda cell: self.late_evidence(cell, resumed_at), END_TIMEOUT_S)
        elif self.fault == "drop":
            assert self.down.proxy is not None
            self.down.proxy.drop()
            self.resume_all()
        else:  # restart
            if self.down.service is not None:
                self.down.service.kill()
            for cell in self.cells:  # a stdio server is the worker's child
                pid = edge_holds.held_pid(self.control, self.subject(cell))
                if self.down.edge == "mcp-stdio" and pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            self.resume_all()
            if self.down.service is not None:
                await self.down.service.start()

    async def run(self) -> dict[Cell, Outcome | str]:
        try:
            await self.start()
            await self.each("at its crash point", self.held, START_TIMEOUT_S)
            if self.live():
                await self.apply_fault()
            await self.each("the call ended", self.ended, END_TIMEOUT_S)
        except Exception as exc:  # every cell of the group reports what broke it
            for cell in self.live():
                self.failed[cell] = f"{type(exc).__name__}: {exc}"
        finally:
            self.resume_all()
        results: dict[Cell, Outcome | str] = {}
        for cell in self.cells:
            if cell in self.failed:
                tails = "".join(f"\n--- {w.identity} ---\n{w.stderr_tail(25)}" for w in (self.first, self.second) if w)
                results[cell] = f"{self.failed[cell]}{tails}"
                continue
            results[cell] = Outcome(
                cell=cell,
                target=self.targets[cell],
                effects=await self.down.effects(self.subject(cell)),
                task=await self.task(cell),
                events=await self.ledger.events(self.task_id(cell)),
                answers=edge_holds.logged(self.control, self.subject(cell)),
            )
        for handle in self.handles.values():
            with contextlib.suppress(Exception):  # ended already, or waits for a person
                await handle.terminate("edge matrix cell over")
        return results


@asynccontextmanager
async def _database(ledger_url: str, work: Path, name: str) -> AsyncIterator[str]:
    """A fresh downstream database of the ledger's dialect."""
    if make_url(ledger_url).get_backend_name() == "postgresql":
        async with scratch_postgres_database(ledger_url, f"agentlease_edge_{name.replace('-', '_')}") as url:
            yield url
    else:
        yield f"sqlite:///{work / f'{name}.db'}"


async def run_cells(
    temporal_address: str, ledger_url: str, work: Path, wanted: Sequence[Cell]
) -> dict[Cell, Outcome | str]:
    """Run ``wanted`` cells, one group (edge, fault) after another; each cell's outcome, or why it failed."""
    ledger = Ledger.from_url(ledger_url)
    fleet = Fleet(
        temporal_address, ledger_url, Cli(cwd=work, data_dir=work / "data"), tool_modules="tests.acceptance.edge_tools"
    )
    (work / "data").mkdir(parents=True, exist_ok=True)
    results: dict[Cell, Outcome | str] = {}
    try:
        await upgrade(ledger.database)
        client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
        groups: dict[tuple[str, str], list[Cell]] = {}
        for cell in wanted:
            groups.setdefault((cell.edge, cell.fault), []).append(cell)
        for (edge, fault), members in groups.items():
            group_dir = work / f"{edge}-{fault}"
            control = group_dir / "control"
            control.mkdir(parents=True)
            async with _database(ledger_url, group_dir, edge) as url, downstream(edge, url, control, group_dir) as down:
                group = Group(client, ledger, fleet, down, control, fault, members)
                try:
                    results.update(await group.run())
                finally:
                    await asyncio.gather(*(asyncio.to_thread(w.stop) for w in (group.first, group.second) if w))
    finally:
        await fleet.stop_all()
        await ledger.close()
    return results


def table(results: dict[Cell, Outcome | str]) -> str:
    """The matrix as Markdown: one row per cell, effects and how the ledger ended."""
    lines = [
        "| edge | crash point | fault | effects | ledger | late writes refused | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell, outcome in results.items():
        if isinstance(outcome, str):
            lines.append(
                f"| {cell.edge} | {cell.point} | {cell.fault} | ? | ? | ? | FAILED: {outcome.splitlines()[0]} |"
            )
            continue
        verdict = "; ".join(outcome.problems()) or "ok"
        lines.append(
            f"| {cell.edge} | {cell.point} | {cell.fault} | {len(outcome.effects)} | {outcome.ledger} | "
            f"{outcome.refused_late} | {verdict} |"
        )
    return "\n".join(lines)


def grid(results: dict[Cell, Outcome | str], dialect: str) -> str:
    """The matrix as a Markdown grid: a row per edge and crash point, a column per fault; each cell the effects
    counted at the downstream and how the ledger ended (``1, settled g2``), ``n/a`` where the cell does not exist."""
    lines = ["| edge | crash point | " + " | ".join(FAULTS) + " |", "|---|---|" + "---|" * len(FAULTS)]
    for edge in EDGES:
        for point in POINTS:
            row = []
            for fault in FAULTS:
                cell = Cell(edge, point, fault)
                outcome = results.get(cell)
                if not_applicable(cell, dialect) is not None:
                    row.append("n/a")
                elif outcome is None:
                    row.append("")
                else:
                    row.append("**failed to run**" if isinstance(outcome, str) else outcome.verdict)
            if any(row):
                lines.append(f"| {edge} | {point} | " + " | ".join(row) + " |")
    return "\n".join(lines)


__all__ = ["CELLS", "Cell", "Outcome", "cells", "grid", "not_applicable", "run_cells", "table"]
CELLS = cells()
