"""A ledger outage as a user meets it: an ``agentlease worker`` on a PostgreSQL ledger that is stopped and
started again under it (a cluster of its own on another port, never the machine's main one).

- A renewal during the outage reaches the tool as ``LedgerUnavailableError`` and marks the context
  (``ctx.ledger_unavailable``); the release that follows is deferred and recorded once the ledger is
  back, giving its attempt back; the next attempt settles. The outage is counted
  (``agentlease_ledger_unavailable_total``) and logged in one line, without a traceback.
- A settle during the outage is tried again while the lease may still be valid and lands once the
  ledger is back: the task settles with the attempt that did the work.

The worker keeps serving throughout: nobody restarts it.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.faults import PostgresCluster
from tests.eventually import assert_eventually_sync

from .fleet import Fleet, Worker
from .runner import Cli, WriteFile, python_path
from .test_cli import free_port

pytestmark = pytest.mark.timeout(240)

TOOLS = '''
import asyncio
import json
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from agentlease.tools._context import LeaseContext
from agentlease.tools._declaration import ToolResult, tool
from agentlease.enums import SideEffectClass, Stage


class Args(BaseModel):
    probe: str
    gate: str


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=10))
async def renew_through_outage(ctx: LeaseContext, args: Args) -> ToolResult:
    """Generation 1 renews until a renewal fails, and writes down what it saw."""
    await ctx.advance(Stage.PREFLIGHT, "starting")
    if ctx.fencing_token == 1:
        while True:
            try:
                await ctx.renew("working through a long job")
            except Exception as exc:
                seen = {"type": type(exc).__name__, "unavailable": ctx.ledger_unavailable, "lost": ctx.lease_lost}
                Path(args.probe).write_text(json.dumps(seen))
                raise
            await asyncio.sleep(0.3)
    await ctx.advance(Stage.VERIFY, "reading back")
    return ToolResult(receipt=ctx.receipt("outage", ctx.idempotency_key, "done"))


@tool(side_effect=SideEffectClass.IDEMPOTENT, lease_ttl=timedelta(seconds=30))
async def settle_in_outage(ctx: LeaseContext, args: Args) -> ToolResult:
    """Works (without renewing) until its gate exists, then returns: its settle meets the outage."""
    await ctx.advance(Stage.PREFLIGHT, "starting")
    while not Path(args.gate).exists():
        await asyncio.sleep(0.1)
    return ToolResult(receipt=ctx.receipt("outage", ctx.idempotency_key, "done"))
'''


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster of its own (``initdb`` in a temporary directory, its own port)."""
    own = PostgresCluster()
    own.init()
    try:
        yield own
    finally:
        own.close()


@contextmanager
def outage(cluster: PostgresCluster) -> Iterator[None]:
    """The ledger's PostgreSQL stopped (as a crash) for the block, started again after it."""
    cluster.stop("immediate")
    try:
        yield
    finally:
        cluster.start()


def unavailable(address: str, operation: str) -> float:
    """``agentlease_ledger_unavailable_total`` for ``operation`` as the worker serves it; 0 when absent."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    name = "agentlease_ledger_unavailable_total{"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and f'operation="{operation}"' in line
    )


def task_json(cli: Cli, env: dict[str, str], run_id: str) -> dict:
    listed = cli("tasks", "--run", run_id, "--json", env=env)
    assert listed.returncode == 0, listed
    tasks = json.loads(listed.stdout)
    assert len(tasks) == 1, tasks
    return dict(tasks[0])


def run_status(cli: Cli, env: dict[str, str], run_id: str) -> str:
    shown = cli("status", run_id, "--json", env=env)
    assert shown.returncode == 0, shown
    return str(json.loads(shown.stdout)["status"])


def events(cli: Cli, env: dict[str, str], run_id: str) -> list[dict]:
    trail = cli("events", "--run", run_id, "--json", env=env)
    assert trail.returncode == 0, trail
    return list(json.loads(trail.stdout))


def worker_and_env(cli: Cli, cluster: PostgresCluster, temporal_address: str) -> tuple[Worker, dict[str, str], str]:
    queue = f"outage-{uuid.uuid4().hex[:8]}"
    metrics = f"127.0.0.1:{free_port()}"
    env = {
        "AGENTLEASE_TEMPORAL_ADDRESS": temporal_address,
        "AGENTLEASE_TASK_QUEUE": queue,
        "AGENTLEASE_LEDGER_URL": cluster.url,
        "AGENTLEASE_TOOL_MODULES": "outage_tools",
        "PYTHONPATH": python_path(cli.cwd),
    }
    assert cli("db", "upgrade", env=env).returncode == 0
    fleet = Fleet(
        temporal_address,
        cluster.url,
        cli,
        "outage_tools",
        {"PYTHONPATH": python_path(cli.cwd)},
    )
    worker = fleet.start(queue, f"{queue}-worker", AGENTLEASE_METRICS_ADDRESS=metrics)
    return worker, env, metrics


def start_run(cli: Cli, env: dict[str, str], write_file: WriteFile, tool: str) -> tuple[str, Path, Path]:
    run_id = f"{tool}-{uuid.uuid4().hex[:6]}"
    probe, gate = cli.cwd / f"{run_id}.probe", cli.cwd / f"{run_id}.gate"
    step = {"step_id": "job", "tool": tool, "arguments": {"probe": str(probe), "gate": str(gate)}}
    write_file(f"{run_id}.json", json.dumps({"steps": [step]}))
    assert cli("run", f"{run_id}.json", "--run-id", run_id, env=env).returncode == 0
    assert_eventually_sync(lambda: task_json(cli, env, run_id)["stage"] == "preflight", timeout=90)
    return run_id, probe, gate


def test_a_renewal_in_an_outage_reaches_the_tool_typed_and_is_recorded_once_the_ledger_is_back(
    cli: Cli, cluster: PostgresCluster, temporal_address: str, write_file: WriteFile
) -> None:
    write_file("outage_tools.py", TOOLS)
    worker, env, metrics = worker_and_env(cli, cluster, temporal_address)
    try:
        run_id, probe, _ = start_run(cli, env, write_file, "renew_through_outage")
        with outage(cluster):
            assert_eventually_sync(probe.exists, timeout=30, message="the tool's renewal failed")
            assert_eventually_sync(lambda: unavailable(metrics, "renew") >= 1, timeout=10)
        assert json.loads(probe.read_text()) == {"type": "LedgerUnavailableError", "unavailable": True, "lost": False}

        assert_eventually_sync(lambda: run_status(cli, env, run_id) == "completed", timeout=120, message="settled")
        task = task_json(cli, env, run_id)
        trail = events(cli, env, run_id)
        assert worker.alive, worker.stderr_tail()  # nobody restarted it
    finally:
        worker.stop()
    released = [e for e in trail if e["kind"] == "released" and e["claim_generation"] == 1]
    assert len(released) == 1 and released[0]["reason"].startswith("ledger_unavailable: "), trail
    assert (task["status"], task["claim_generation"], task["attempts"]) == ("settled", 2, 1), task
    log = "".join(worker.command.stderr)
    assert "Traceback" not in log, log
    assert re.search(r"ledger unavailable: renewal of \S+ \(generation 1, preflight\) not confirmed", log), log
    assert re.search(r"recorded after the outage: release of \S+ \(generation 1, ledger_unavailable\)", log), log


def test_a_settle_in_an_outage_lands_once_the_ledger_is_back(
    cli: Cli, cluster: PostgresCluster, temporal_address: str, write_file: WriteFile
) -> None:
    write_file("outage_tools.py", TOOLS)
    worker, env, metrics = worker_and_env(cli, cluster, temporal_address)
    try:
        run_id, _, gate = start_run(cli, env, write_file, "settle_in_outage")
        outage_began = time.monotonic()
        with outage(cluster):
            gate.touch()
            message = "the settle was tried during the outage, more than once"
            assert_eventually_sync(lambda: unavailable(metrics, "settle") >= 2, timeout=30, message=message)
        outage_s = time.monotonic() - outage_began
        assert_eventually_sync(lambda: run_status(cli, env, run_id) == "completed", timeout=60, message="settled")
        task = task_json(cli, env, run_id)
        trail = events(cli, env, run_id)
        assert worker.alive, worker.stderr_tail()
    finally:
        worker.stop()
    seen, log = (task["status"], task["claim_generation"], task["attempts"]), "".join(worker.command.stderr)
    assert seen == ("settled", 1, 1), (f"outage of {outage_s:.1f}s", task, trail, log[-4000:])
    assert "Traceback" not in log
