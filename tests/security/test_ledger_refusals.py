"""The ledger refusing a value, and the ledger file changing under a running worker.

A value the database refuses fails the same way on every retry: the step fails at once with the
database's own message instead of being retried forever (``docs/limits.md``).
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client, WorkflowFailureError

from agentlease.enums import RunState, StepEnd
from agentlease.records import RunStatus
from agentlease.settings import AgentLeaseSettings
from tests.conftest import pg_url  # noqa: F401
from tests.integration.conftest import client, settings, temporal_address  # noqa: F401
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
