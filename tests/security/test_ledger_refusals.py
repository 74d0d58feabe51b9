"""The ledger refusing a value, and the ledger file changing under a running worker.

A value the database refuses fails the same way on every retry: the step fails at once with the
database's own message instead of being retried forever (``docs/limits.md``).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from agentlease.enums import RunState, StepEnd
from agentlease.records import RunStatus
from agentlease.settings import AgentLeaseSettings
from tests.conftest import pg_url, sqlite_url  # noqa: F401
from tests.eventually import assert_eventually
from tests.integration.conftest import client, settings  # noqa: F401
from tests.integration.test_builtin_tools import serving

from .tool_runs import RUN_TIMEOUT_S, start_step

pytestmark = pytest.mark.timeout(90)


async def test_a_value_postgresql_refuses_fails_the_step_with_its_message(
    client: Client,  # noqa: F811
    settings: AgentLeaseSettings,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> None:
    """A worker identity longer than ``tasks.lease_owner`` (255): every claim is refused by the database."""
    on_pg = settings.model_copy(update={"ledger_url": pg_url})
    async with serving(client, on_pg, "w" * 300):
        handle = await start_step(client, on_pg, "quick", {})
        try:
            result: RunStatus | None = await asyncio.wait_for(handle.result(), timeout=RUN_TIMEOUT_S)
        except WorkflowFailureError:
            result = None
        status = await handle.query("status", result_type=RunStatus)
    assert result is not None and result.status == RunState.FAILED, (result, status)
    [view] = result.tasks
    assert view.status == StepEnd.FAILED, view
    assert view.error is not None and "refused a value" in view.error, view
    assert "value too long" in view.error, view


async def _last_failure(client: Client, workflow_id: str) -> str:  # noqa: F811
    """The message of the latest failed attempt of the run's pending tool call ('' while none failed)."""
    description = await client.get_workflow_handle(workflow_id).describe()
    for pending in description.raw_description.pending_activities:
        if pending.HasField("last_failure"):
            return pending.last_failure.message
    return ""


@pytest.mark.parametrize("change", ["deleted", "replaced"])
async def test_a_sqlite_ledger_file_changed_under_a_worker_stops_its_leases(
    client: Client,  # noqa: F811
    settings: AgentLeaseSettings,  # noqa: F811
    tmp_path: Path,
    change: str,
) -> None:
    path = Path(settings.ledger_url.removeprefix("sqlite:///"))
    async with serving(client, settings, "worker-file"):
        first = await start_step(client, settings, "quick", {})
        assert (await asyncio.wait_for(first.result(), timeout=RUN_TIMEOUT_S)).status == RunState.COMPLETED
        if change == "deleted":
            path.unlink()
        else:
            other = tmp_path / "other.db"
            sqlite3.connect(other).close()
            os.replace(other, path)
        second = await start_step(client, settings, "quick", {})
        await assert_eventually(
            lambda: _last_failure(client, second.id),
            timeout=RUN_TIMEOUT_S,
            message="the second run's call fails",
        )
        message = await _last_failure(client, second.id)
        await second.terminate("test over")
    assert f"the SQLite ledger {path} was {change}" in message, message
    assert "no lease is claimed, renewed or settled" in message, message
    if change == "deleted":
        assert not path.exists(), "a new, empty ledger was created"
    else:
        with sqlite3.connect(path) as db:
            tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        assert tables == [], "the worker wrote into the file that replaced its ledger"
