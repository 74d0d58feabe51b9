"""Memory per in-flight call: a worker's resident memory with N long leased calls against N long plain ones.

For each ``--calls`` count N (100, 500, 1,000) and each side, a fresh worker process (separate OS
process, ``max_concurrent_activities`` >= N) serves ``bench.workflow.ToolCallsWorkflow`` runs of one
long call each:

- ``plain``: ``bench.tools.plain_hold``, which heartbeats its stage and waits, heartbeating;
- ``leased-sqlite`` / ``leased-pg``: the tool ``bench_hold`` through the leased activities
  (claim, ``ctx.advance``, renewals every TTL/3, settle), on a SQLite or PostgreSQL ledger.

The worker first runs ``--warmup`` calls to completion (imports, connections, compiled statements),
then its memory is read (idle); N runs are started and, once all N calls hold (counted inside the
worker) and the memory is steady, it is read again. Per call = the difference over N; each leased
side is also shown over plain at the same N, against the aim of :data:`AIM_OVER_PLAIN_KB`. The
calls are then released and the worker stopped. Sides alternate within each N.

Each reading is split (see :meth:`CHeap.report`):

- ``RSS``: ``VmRSS`` of ``/proc/self/status``, what the aim is about;
- ``C heap``: glibc's ``mallinfo2()``, bytes in use (``uordblks`` + ``hblkhd``, all arenas): Python's
  larger objects (> 512 bytes), the Temporal SDK's Rust core, SQLite, asyncpg's buffers;
- ``freed-kept``: ``fordblks``, freed but kept by glibc's allocator (fragmentation, free lists);
- ``SQLite``: ``sqlite3_memory_used()`` of the SQLite library Python's ``sqlite3`` uses;
- ``held``: RSS minus freed-kept (with ``--trim``, RSS itself: freed pages were given back).

Python's small objects (<= 512 bytes) live in pymalloc's own arenas (``mmap``), not in glibc's heap:
they are in RSS and ``held`` but in neither heap column. A column is left out where its source is
unavailable (no glibc, no SQLite library).

Options for the profile:

- ``--trace``: the worker runs :mod:`tracemalloc` with one frame (more made the worker so slow that its
  workflow tasks timed out) and takes a snapshot idle and held; the ``Python`` column is what it
  traces, and for each leased side the source lines where a leased call holds more than a plain
  one are printed (size held minus size idle, per call, leased minus plain, by ``file:line``). The
  tracing itself costs memory (per call, RSS about 1.6x), so compare RSS figures only between runs without it.
- ``--trim``: the worker calls glibc's ``malloc_trim(0)`` before each report, so RSS counts only what
  the allocator cannot give back: what is left of the gap is not freed-but-kept heap.
- ``--heaptrack DIR`` (outside the repository): each worker process runs under ``heaptrack``; its
  recordings go to ``DIR`` as ``memory-<side>-<N>.<pid>`` (multiprocessing's resource tracker, started
  through the same wrapper, gets one too). Read them with ``heaptrack_print``.

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
import ctypes
import ctypes.util
import importlib.util
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.runtime.devserver import scratch_postgres_database
from agentlease.runtime.shutdown import exit_process
from bench.overhead import default_pg_url, quiet_dev_server, rotated
from bench.tools import HOLD_TOOL, PLAIN_HOLD_ACTIVITY
from bench.workflow import BENCH_WORKFLOW, BenchBatch

PLAIN = "plain"
AIM_OVER_PLAIN_KB = 50.0
"""What a leased in-flight call may cost in resident memory beyond a plain one (KB)."""

COLUMNS = {"rss": "RSS", "heap": "C heap", "free": "freed-kept", "sqlite": "SQLite", "held": "held", "python": "Python"}
"""The split of a reading, as printed (KB per call); see the module's docstring."""
TOP_LINES = 15
"""Source lines printed per leased side with ``--trace``."""


def rss_kb() -> int:
    """This process's resident memory (KB), from ``/proc/self/status``."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``: ten ``size_t`` fields."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class CHeap:
    """glibc's allocator and SQLite's, read through ctypes; each part ``None`` where unavailable."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None)
        self.mallinfo2: Any = getattr(libc, "mallinfo2", None)
        if self.mallinfo2 is not None:
            self.mallinfo2.restype = _MallInfo2
            self.mallinfo2.argtypes = []
        self.malloc_trim: Any = getattr(libc, "malloc_trim", None)
        self.sqlite_used: Any = None
        spec = importlib.util.find_spec("_sqlite3")
        for library in (spec.origin if spec else None, ctypes.util.find_library("sqlite3")):
            try:  # the module's own handle also finds the symbol in the libsqlite3 it links
                used = ctypes.CDLL(library).sqlite3_memory_used if library else None
            except (OSError, AttributeError):
                continue
            if used is not None:
                used.restype, used.argtypes = ctypes.c_int64, []
                self.sqlite_used = used
                break

    def report(self, trim: bool) -> dict[str, int]:
        """This process's memory (KB): ``rss`` and, where available, ``heap``, ``free``, ``sqlite``, ``python``."""
        if trim and self.malloc_trim is not None:
            self.malloc_trim(0)
        state = {"rss": rss_kb()}
        if self.mallinfo2 is not None:
            info = self.mallinfo2()
            state["heap"] = (info.uordblks + info.hblkhd) // 1024
            state["free"] = info.fordblks // 1024
        if self.sqlite_used is not None:
            state["sqlite"] = self.sqlite_used() // 1024
        if tracemalloc.is_tracing():
            state["python"] = tracemalloc.get_traced_memory()[0] // 1024
        return state


def _lines_snapshot(path: Path) -> None:
    """tracemalloc's bytes held by source line (``file:line``), written to ``path`` as JSON."""
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    lines = {
        f"{stat.traceback[0].filename}:{stat.traceback[0].lineno}": stat.size for stat in snapshot.statistics("lineno")
    }
    _write(path, lines)


def _serve(
    kind: str, task_queue: str, address: str, ledger_url: str | None, slots: int, status: str, trace: bool, trim: bool
) -> None:
    """One worker process: serve until the ``<status>.stop`` file appears; report to ``status`` (JSON).

    A ``<status>.<label>.want`` file asks for a :func:`_lines_snapshot` in ``<status>.<label>.lines``.
    """
    if trace:
        tracemalloc.start(1)  # one frame: more made workflow tasks time out

    async def main() -> None:
        from temporalio.worker import Worker

        from agentlease.decisions._activity import DecisionActivities
        from agentlease.runtime.temporal import connect
        from agentlease.settings import AgentLeaseSettings, default_identity
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
        heap = CHeap()
        try:
            async with worker:
                while not Path(f"{status}.stop").exists():
                    if Path(f"{status}.release").exists():
                        Holding.released.set()
                    else:
                        Holding.released.clear()
                    for want in path.parent.glob(f"{path.name}.*.want"):
                        _lines_snapshot(want.with_suffix(".lines"))
                        want.unlink()
                    _write(path, {"in_flight": Holding.in_flight, **heap.report(trim)})
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


def _write(path: Path, state: dict[str, int]) -> None:
    """Replace ``path`` atomically: a reader sees the previous report or this one, never a part."""
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


async def _reading(path: Path, pick: Callable[..., dict[str, int]], trim: bool) -> dict[str, int]:
    """Five reports 0.4 s apart; the one ``pick`` (``min``/``max``) chooses by RSS, with ``held`` added."""
    samples = []
    for _ in range(5):
        await asyncio.sleep(0.4)
        samples.append(await _wait(path, lambda _state: True, 30, "a report"))
    state = dict(pick(samples, key=lambda sample: sample["rss"]))
    state["held"] = state["rss"] - (0 if trim else state.get("free", 0))
    return state


async def _lines(status: Path, label: str) -> dict[str, int]:
    """Ask the worker for its tracemalloc bytes by source line; wait for them."""
    want = status.with_name(f"{status.name}.{label}.want")
    want.touch()
    for _ in range(1500):  # 300 s
        if not want.exists():
            break
        await asyncio.sleep(0.2)
    else:
        raise TimeoutError(f"no {label} snapshot from the worker within 300 s")
    lines: dict[str, int] = json.loads(want.with_suffix(".lines").read_text())
    return lines


@dataclass
class Measured:
    """One side at one N: the idle worker (KB), KB per call by column, and bytes per call by line."""

    idle: dict[str, int]
    per_call: dict[str, float]
    lines: dict[str, float]


async def measure(
    client: Any, side: str, url: str | None, calls: int, opts: argparse.Namespace, work: Path
) -> Measured:
    """The idle worker's memory and what each in-flight call of ``side`` adds at ``calls`` calls."""
    task_queue = f"bench-memory-{side}-{uuid.uuid4().hex[:8]}"
    status = work / f"{task_queue}.json"
    context = multiprocessing.get_context("spawn")
    if opts.heaptrack:
        context.set_executable(str(_heaptrack_wrapper(Path(opts.heaptrack), work, side, calls)))
    kind = PLAIN if side == PLAIN else "leased"
    address = client.service_client.config.target_host
    args = (kind, task_queue, address, url, calls, str(status), opts.trace, opts.trim)
    process = context.Process(target=_serve, args=args, daemon=True)
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
        idle = await _reading(status, min, opts.trim)
        idle_lines = await _lines(status, "idle") if opts.trace else {}
        handles = await run("held", calls)
        await _wait(status, lambda s: s["in_flight"] == calls, 300 + 0.3 * calls, f"{calls} calls holding")
        held = await _reading(status, max, opts.trim)
        held_lines = await _lines(status, "held") if opts.trace else {}
        Path(f"{status}.release").touch()
        await asyncio.gather(*(handle.result() for handle in handles))
        per_call = {column: (held[column] - idle[column]) / calls for column in COLUMNS if column in held}
        lines = {
            line: (held_lines.get(line, 0) - idle_lines.get(line, 0)) / calls for line in {*idle_lines, *held_lines}
        }
        return Measured(idle, per_call, lines)
    finally:
        Path(f"{status}.stop").touch()
        process.join(timeout=600 if opts.heaptrack else 60)
        if process.is_alive():
            process.kill()


def _heaptrack_wrapper(directory: Path, work: Path, side: str, calls: int) -> Path:
    """A script that runs the worker's interpreter under ``heaptrack``, recording to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = work / f"heaptrack-{side}-{calls}.sh"
    record = directory / f"memory-{side}-{calls}"
    wrapper.write_text(f'#!/bin/sh\nexec heaptrack -o "{record}.$$" "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def _short(line: str) -> str:
    """A source line's ``file:line``, without the site-packages or repository prefix."""
    for prefix in ("site-packages/", f"{Path.cwd()}/", f"{os.path.dirname(os.__file__)}/"):
        if prefix in line:
            return line.split(prefix, 1)[1]
    return line


def _print_lines(side: str, calls: int, leased: dict[str, float], plain: dict[str, float], out: Any) -> None:
    """The source lines where a call of ``side`` holds the most beyond a plain one (bytes per call)."""
    over = {line: leased.get(line, 0.0) - plain.get(line, 0.0) for line in {*leased, *plain}}
    print(
        f"\n{side}, {calls} calls: Python bytes held per call, leased {sum(leased.values()):.0f} - plain "
        f"{sum(plain.values()):.0f} = {sum(over.values()):+.0f}; top lines by leased minus plain:",
        file=out,
    )
    for line, extra in sorted(over.items(), key=lambda item: -item[1])[:TOP_LINES]:
        print(
            f"  {extra:>+8.0f} B  (leased {leased.get(line, 0):>7.0f}, plain {plain.get(line, 0):>7.0f})"
            f"  {_short(line)}",
            file=out,
        )


async def bench(opts: argparse.Namespace) -> None:
    out = sys.stdout
    print(f"{os.cpu_count()} CPUs, {_load()}; trace={opts.trace} trim={opts.trim}", file=out)
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
        results: dict[tuple[str, int], Measured] = {}  # by side and index in --calls: a count may repeat
        for index, calls in enumerate(opts.calls):
            for side in rotated(list(sides), index):
                result = results[side, index] = await measure(env.client, side, sides[side], calls, opts, work)
                split = ", ".join(f"{COLUMNS[column]} {kb:.1f}" for column, kb in result.per_call.items())
                print(
                    f"{side:<14} {calls:>5} calls in flight, KB per call: {split} "
                    f"(idle worker {result.idle['rss'] / 1024:.0f} MB; {_load()})",
                    flush=True,
                )
    indexes = range(len(opts.calls))
    columns = [column for column in COLUMNS if all(column in result.per_call for result in results.values())]
    for index, calls in enumerate(opts.calls):
        print(f"\n{calls:>5} calls      " + " ".join(f"{COLUMNS[c]:>10}" for c in columns) + "   KB per call", file=out)
        for side in sides:
            print(f"{side:<16} " + " ".join(f"{results[side, index].per_call[c]:>10.1f}" for c in columns), file=out)
            if side != PLAIN:
                over = [results[side, index].per_call[c] - results[PLAIN, index].per_call[c] for c in columns]
                print(f"{'  over plain':<16} " + " ".join(f"{kb:>+10.1f}" for kb in over), file=out)
    print(
        f"\n{'side':<14} " + " ".join(f"{n:>9}" for n in opts.calls) + "   RSS KB per in-flight call; idle worker MB",
        file=out,
    )
    for side in sides:
        per_call = " ".join(f"{results[side, i].per_call['rss']:>9.1f}" for i in indexes)
        idle = min(results[side, i].idle["rss"] for i in indexes) / 1024
        print(f"{side:<14} {per_call}   {idle:.0f}", file=out)
        if side != PLAIN:
            over = [results[side, i].per_call["rss"] - results[PLAIN, i].per_call["rss"] for i in indexes]
            verdict = "meets" if max(over) <= AIM_OVER_PLAIN_KB else "misses"
            shown = " ".join(f"{kb:>+9.1f}" for kb in over)
            print(f"{'  over plain':<14} {shown}   {verdict} the aim of <= +{AIM_OVER_PLAIN_KB:g} KB", file=out)
    if opts.trace:
        for index, calls in enumerate(opts.calls):
            for side in sides:
                if side != PLAIN:
                    _print_lines(side, calls, results[side, index].lines, results[PLAIN, index].lines, out)
    print(f"{_load()} after", file=out)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _outside_repo(text: str) -> str:
    path = Path(text).resolve()
    if path.is_relative_to(Path(__file__).resolve().parent.parent):
        raise argparse.ArgumentTypeError(f"{path} is inside the repository: give a directory outside it")
    if shutil.which("heaptrack") is None:
        raise argparse.ArgumentTypeError("heaptrack is not installed")
    return str(path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=_ints, default=[100, 500, 1000], help="calls in flight (default 100,500,1000)")
    parser.add_argument("--warmup", type=int, default=20, help="calls run to completion first (default 20)")
    parser.add_argument("--pg-url", default=default_pg_url() or "postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL side")
    parser.add_argument(
        "--trace", action="store_true", help="tracemalloc (1 frame) in the worker: top lines over plain"
    )
    parser.add_argument("--trim", action="store_true", help="the worker calls malloc_trim(0) before each report")
    parser.add_argument(
        "--heaptrack", type=_outside_repo, metavar="DIR", help="run each worker under heaptrack into DIR"
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
