"""The sweeper's batch write reads through the primary key on a large ledger, with its batch as one parameter.

:func:`agentlease.ledger.expiry.record_statement` unpacks its batch from one JSON parameter
(``json_each`` on SQLite, ``json_to_recordset`` on PostgreSQL) so that it is compiled once; the
database must still find each task by its key, never by reading ``tasks`` whole (the plan check of
:mod:`tests.integration.test_query_plans`, on the same bulk-filled ledger).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.engine import Connection

from agentlease.clock import now_param
from agentlease.ledger.expiry import batch_params, record_statement
from agentlease.ledger.store import Ledger
from bench.fill import Fill, fill_ledger
from tests.integration.test_query_plans import ROWS, full_scans, plan


async def test_the_batch_write_finds_each_task_by_its_key(ledger: Ledger) -> None:
    await fill_ledger(ledger.database, Fill(tasks=ROWS, expired=ROWS // 100))
    dialect = ledger.database.dialect
    rows = [
        {
            "task_id": f"fill-{n}/s{n % 10}",
            "claim_generation": 1,
            "lease_expires_at_ms": 1_700_000_030_000 + n,
            "status": "released",
            "last_error": "lease lapsed in stage external_call",
        }
        for n in range(50)
    ]
    params = {**batch_params(dialect, rows), **now_param(datetime.now(UTC))}

    def explain(conn: Connection) -> str:
        return plan(conn, record_statement(dialect), params)

    text = await ledger.database.read(explain)
    assert full_scans(dialect, text) == [], text
    key = "sqlite_autoindex_tasks_1" if dialect == "sqlite" else "pk_tasks"
    assert key in text, text
