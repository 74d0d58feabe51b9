"""This repository's own application (``worker.py``, ``activities/``, ``workflows/``), copied into a
directory of its own and run as a user runs it: ``python worker.py`` beside ``agentlease dev``."""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.client import Client

from agentlease import Ledger, TaskStatus

from .runner import Background, Cli
from .test_cli import free_port
from .test_cli_completeness import exports

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


async def test_the_application_worker_serves_its_own_workflow_and_tools(
    cli: Cli, background: Callable[..., Background]
) -> None:
    shutil.copy(ROOT / "worker.py", cli.cwd)
    for package in ("activities", "workflows"):
        shutil.copytree(ROOT / package, cli.cwd / package, ignore=shutil.ignore_patterns("__pycache__"))
    dev = background("dev", "--port", str(free_port()), "--ui-port", str(free_port()))
    shell = exports(dev)
    queue = f"app-{uuid.uuid4().hex[:8]}"
    env = {**shell, "AGENTLEASE_TASK_QUEUE": queue, "PYTHONPATH": str(cli.cwd)}
    worker = Background(cli, "worker.py", env=env, program=Path(sys.executable))
    try:
        client = await Client.connect(shell["AGENTLEASE_TEMPORAL_ADDRESS"])
        handle = await client.start_workflow("RestockWorkflow", 100, id=f"restock-{queue}", task_queue=queue)
        try:
            reserved = await asyncio.wait_for(handle.result(), timeout=120)
        except TimeoutError:
            pytest.fail(f"the run did not finish; worker.py said:\n{''.join(worker.stderr)}")
        assert reserved == ["B-2040", "C-3300"]  # below 100 units in the demo's inventory
        ledger = Ledger.from_url(shell["AGENTLEASE_LEDGER_URL"])
        try:
            tasks = await ledger.list_tasks(agent_run_id=handle.id)
        finally:
            await ledger.close()
        assert {(t.tool, t.status) for t in tasks} == {
            ("low_stock", TaskStatus.SETTLED),
            ("sql_upsert", TaskStatus.SETTLED),
        }
        assert len(tasks) == 3
    finally:
        worker.stop()
