"""A worker on a SQLite ledger stops cleanly with many calls in flight, every time.

Each round starts an ``agentlease worker`` process (as a user runs it, on this session's dev server
and one SQLite ledger file), gives it :data:`CALLS` agent runs whose tool holds its lease, and once
every call holds, sends SIGTERM. The worker must exit 0 with nothing on stderr but its banner (no
``Fatal Python error``, no traceback, no ledger error), having released every lease through the
ledger's thread on the way out: each task ``released`` with ``error_class`` ``shutdown``, none left
``running`` for the sweeper.

A process that has used Temporal's client and then finalizes the interpreter may abort in its last
moments ("PyGILState_Release: thread state ... must be current", temporalio/sdk-python#300: a
thread of the SDK's Rust runtime calls into Python while it finalizes; 1 in 40 short client-only
processes here, no ledger involved). The command line leaves with ``os._exit`` once everything it
started has stopped, so this test fails if that path, or the ledger thread's shutdown before it,
ever regresses.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import TASKS
from agentlease.records import AgentRunPlan, PlanStep
from agentlease.workflow._plan import AgentRunWorkflow
from tests.acceptance.fleet import Fleet, wait_polling
from tests.acceptance.runner import Cli
from tests.eventually import assert_eventually

pytestmark = pytest.mark.timeout(300)

ROUNDS = 4
CALLS = 100
"""Calls in flight when each round's worker is told to stop."""

BANNER = ("worker on ", "tools: ", "decisions in ", "warning: open decision mode")
"""The lines a worker prints on stderr when it starts; anything else on a clean stop is a failure."""


def _statuses(prefix: str) -> Callable[[Connection], dict[tuple[str, str | None], int]]:
    """Tasks of the runs named ``prefix...`` counted by (status, error class)."""

    def count(conn: Connection) -> dict[tuple[str, str | None], int]:
        query = (
            select(TASKS.c.status, TASKS.c.error_class, func.count())
            .where(TASKS.c.task_id.startswith(prefix))
            .group_by(TASKS.c.status, TASKS.c.error_class)
        )
        return {(status, error_class): n for status, error_class, n in conn.execute(query)}

    return count


async def test_a_worker_stops_cleanly_with_many_calls_in_flight(temporal_address: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger.from_url(url)
    (tmp_path / "data").mkdir()
    fleet = Fleet(temporal_address, url, Cli(cwd=tmp_path, data_dir=tmp_path / "data"), "bench.recovery_tools")
    client = await Client.connect(temporal_address, data_converter=pydantic_data_converter)
    try:
        await upgrade(ledger.database)
        for round_ in range(ROUNDS):
            queue = f"shutdown-{uuid.uuid4().hex[:8]}"
            worker = fleet.start(queue, f"{queue}-worker", slots=CALLS + 10)
            await wait_polling(client, queue, worker, timeout=90)
            for n in range(CALLS):
                step = PlanStep(
                    step_id="hold",
                    tool="recovery_hold_10s",
                    arguments={"release_file": str(tmp_path / "never")},  # generation 1 holds until stopped
                )
                run_id = f"{queue}-{n}"
                plan = AgentRunPlan(agent_run_id=run_id, steps=[step])
                await client.start_workflow(AgentRunWorkflow.run, plan, id=run_id, task_queue=queue)

            async def all_hold(prefix: str = queue) -> None:
                counts = await ledger.database.read(_statuses(prefix))
                assert counts == {("running", None): CALLS}, counts

            await assert_eventually(all_hold, timeout=120, interval=0.25, message=f"round {round_}: {CALLS} hold")
            code = await asyncio.to_thread(worker.stop, signal.SIGTERM, timeout=90)
            stderr = "".join(worker.command.stderr)
            unexpected = [line for line in worker.command.stderr if not line.startswith(BANNER)]
            assert (code, unexpected) == (0, []), f"round {round_}: exit {code}\n{stderr}"
            counts = await ledger.database.read(_statuses(queue))
            assert counts == {("released", "shutdown"): CALLS}, f"round {round_}: {counts}"
    finally:
        await fleet.stop_all()
        await ledger.close()
