"""``sql_upsert`` writes only the tables of ``AGENTLEASE_SQL_ALLOWED_TABLES``, on a real worker.

A table off the list is a permanent tool error before any connection to the target: the step is
dead-lettered with the reason and the table is untouched (``docs/security-input.md``, "Tool authority").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from temporalio.client import Client

from agentlease.demo.downstream import Downstream, prepare_sql_target, running_downstream
from agentlease.enums import TaskStatus
from agentlease.ledger.engine import create_async_database_engine
from agentlease.records import task_id_for
from agentlease.settings import AgentLeaseSettings
from agentlease.tools.builtin.sql_upsert import records_table
from tests.integration.conftest import client, settings  # noqa: F401
from tests.integration.test_builtin_tools import serving

from .tool_runs import start_step, step_ends

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def downstream(tmp_path: Path) -> AsyncIterator[Downstream]:
    async with running_downstream(tmp_path / "downstream") as running:
        await prepare_sql_target(running.sql_target_url, ("inventory", "payroll"))
        yield running


@pytest.fixture
def sql_settings(settings: AgentLeaseSettings, downstream: Downstream) -> AgentLeaseSettings:  # noqa: F811
    """Only ``inventory`` is allowed; ``payroll`` exists in the target too."""
    return settings.model_copy(
        update={"sql_target_url": downstream.sql_target_url, "sql_allowed_tables": ["inventory"]}
    )


async def _rows(url: str, table: str) -> int:
    engine = create_async_database_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(records_table(table)))).scalar_one())
    finally:
        await engine.dispose()


async def test_a_table_off_the_allow_list_is_refused_and_untouched(
    client: Client,  # noqa: F811
    sql_settings: AgentLeaseSettings,
    downstream: Downstream,
) -> None:
    async with serving(client, sql_settings, "worker-sql") as ledger:
        handle = await start_step(client, sql_settings, "sql_upsert", {"table": "payroll", "row": {"salary": 1}})
        view = await step_ends(handle, TaskStatus.DEAD_LETTERED, TaskStatus.SETTLED)
        record = await ledger.get_task(task_id_for(handle.id, "s"))
        await handle.terminate("test over")
    assert view.status == TaskStatus.DEAD_LETTERED, view
    assert record.attempts == 1 and record.last_error is not None, record
    assert "refused to write table 'payroll': not in AGENTLEASE_SQL_ALLOWED_TABLES" in record.last_error
    assert "(allowed: inventory)" in record.last_error
    assert await _rows(downstream.sql_target_url, "payroll") == 0


async def test_no_allow_list_refuses_every_table(
    client: Client,  # noqa: F811
    sql_settings: AgentLeaseSettings,
    downstream: Downstream,
) -> None:
    unlisted = sql_settings.model_copy(update={"sql_allowed_tables": []})
    async with serving(client, unlisted, "worker-sql") as ledger:
        handle = await start_step(client, unlisted, "sql_upsert", {"table": "inventory", "row": {"sku": "A"}})
        view = await step_ends(handle, TaskStatus.DEAD_LETTERED, TaskStatus.SETTLED)
        record = await ledger.get_task(task_id_for(handle.id, "s"))
        await handle.terminate("test over")
    assert view.status == TaskStatus.DEAD_LETTERED, view
    assert record.last_error is not None and "(allowed: none)" in record.last_error, record
    assert await _rows(downstream.sql_target_url, "inventory") == 0


async def test_an_allowed_table_is_written(
    client: Client,  # noqa: F811
    sql_settings: AgentLeaseSettings,
    downstream: Downstream,
) -> None:
    async with serving(client, sql_settings, "worker-sql"):
        handle = await start_step(client, sql_settings, "sql_upsert", {"table": "inventory", "row": {"sku": "A"}})
        result = await handle.result()
    [view] = result.tasks
    assert view.status == TaskStatus.SETTLED, view
    assert await _rows(downstream.sql_target_url, "inventory") == 1
