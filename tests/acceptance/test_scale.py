"""Operator commands on a large PostgreSQL ledger stay bounded: CPU time and peak memory per command.

The slow tier (``-m scale``). The ledger gets ``AGENTLEASE_SCALE_ROWS`` tasks (default 20,000;
``.ci/run`` uses 100,000) inserted in bulk by :mod:`bench.fill`: ten per run, 1 % waiting for a
person, 1 % running with a lapsed lease, the rest settled with a receipt, two evidence entries
each. The full size is a command (``CONTRIBUTING.md``)::

    AGENTLEASE_SCALE_ROWS=1000000 .venv/bin/pytest -q -m scale tests/acceptance/test_scale.py

Each command runs as a user runs it (the console script, in a subprocess). Its peak resident memory
stays under :data:`PEAK_MB` whatever the ledger's size: a streamed listing keeps one page in memory.
Its CPU and wall times (from ``wait4``) are printed with ``-s`` for ``bench/README.md``: figures,
not assertions (a loaded machine moves them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from bench.fill import Fill, fill_ledger

from .conftest import fresh_pg_database
from .runner import AGENTLEASE, Cli

pytestmark = [pytest.mark.scale, pytest.mark.postgres, pytest.mark.timeout(1800)]

ROWS = int(float(os.environ.get("AGENTLEASE_SCALE_ROWS", "20000")))
EXPIRED = ROWS // 100
PEAK_MB = 150.0
"""Peak resident memory of any listing command (the aim: under 150 MB at a million tasks)."""


@dataclass(frozen=True)
class Measured:
    returncode: int
    cpu_s: float
    wall_s: float
    peak_mb: float
    stdout: Path
    stderr: str


_RUSAGE = """
import json, os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_pid, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump({"status": status, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_kb": usage.ru_maxrss}, out)
"""
"""Runs the command and writes its rusage. A small interpreter of its own starts it: a child's peak
RSS counts what its forked parent had resident, and the test process is large."""


def measured(cli: Cli, env: dict[str, str], *args: str, keep_output: bool = True) -> Measured:
    """Run ``agentlease *args`` and read its rusage: CPU time and peak RSS of that one process."""
    out = cli.cwd / f"out-{time.monotonic_ns()}.txt"
    usage_file = cli.cwd / f"usage-{time.monotonic_ns()}.json"
    with out.open("w") if keep_output else open(os.devnull, "w") as sink:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-S", "-c", _RUSAGE, str(usage_file), str(AGENTLEASE), *args],
            cwd=cli.cwd,
            env=cli.env(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        wall = time.monotonic() - started
    usage = json.loads(usage_file.read_text())
    result = Measured(
        os.waitstatus_to_exitcode(usage["status"]), usage["cpu_s"], wall, usage["peak_kb"] / 1024, out, done.stderr
    )
    print(f"\nagentlease {' '.join(args)}: {result.wall_s:.2f}s wall, {result.cpu_s:.2f}s CPU, {result.peak_mb:.0f} MB")
    return result


@pytest.fixture(scope="module")
def large_ledger() -> Iterator[dict[str, str]]:
    """The environment of a PostgreSQL ledger holding :data:`ROWS` tasks."""
    with fresh_pg_database("agentlease_scale") as url:

        async def fill() -> None:
            ledger = Ledger.from_url(url)
            try:
                await upgrade(ledger.database)
                await fill_ledger(ledger.database, Fill(tasks=ROWS, expired=EXPIRED))
            finally:
                await ledger.close()

        asyncio.run(fill())
        yield {"AGENTLEASE_LEDGER_URL": url}


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("waiting",), id="waiting"),
        pytest.param(("tasks",), id="tasks"),
        pytest.param(("tasks", "--status", "running", "--limit", "50"), id="tasks-status"),
        pytest.param(("tasks", "--run", "fill-5", "--json"), id="tasks-run-json"),
        pytest.param(("events", "--run", "fill-5", "--json"), id="events-run-json"),
        pytest.param(("events", "fill-5/s3"), id="events-task"),
        pytest.param(("runs",), id="runs"),
        pytest.param(("runs", "--waiting", "--limit", "20", "--json"), id="runs-waiting-json"),
    ],
)
def test_a_bounded_command_stays_in_bounded_memory_at_any_size(
    cli: Cli, large_ledger: dict[str, str], args: tuple[str, ...]
) -> None:
    result = measured(cli, large_ledger, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.stat().st_size > 0
    assert result.peak_mb < PEAK_MB, result


def test_waiting_json_streams_every_waiting_task_with_its_commands(cli: Cli, large_ledger: dict[str, str]) -> None:
    result = measured(cli, large_ledger, "waiting", "--json")
    assert result.returncode == 0, result.stderr
    waiting = json.loads(result.stdout.read_text())
    assert len(waiting) == Fill(tasks=ROWS, expired=EXPIRED).waiting
    assert all(task["suggested_commands"] for task in waiting)
    assert result.peak_mb < PEAK_MB, result


def test_every_task_streams_in_bounded_memory(cli: Cli, large_ledger: dict[str, str]) -> None:
    result = measured(cli, large_ledger, "tasks", "--json", keep_output=False)
    assert result.returncode == 0, result.stderr
    assert result.peak_mb < PEAK_MB, result


def test_the_sweeper_records_every_lapsed_lease_in_bounded_memory(cli: Cli, large_ledger: dict[str, str]) -> None:
    result = measured(cli, large_ledger, "sweep", "--once")
    assert result.returncode == 0, result.stderr
    summary = result.stdout.read_text()
    assert f"examined {EXPIRED}: released {EXPIRED}," in summary, summary
    assert result.peak_mb < PEAK_MB, result
