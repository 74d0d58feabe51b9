"""A renewal, the ledger's most frequent write, changes no column that an index of ``tasks`` holds: PostgreSQL
updates the renewed row in place (a HOT update) and writes no index entry for it (``docs/operations.md``,
"The sweeper"). Read from PostgreSQL's own catalog and statistics of the table, after real renewals through the
ledger.
"""

from __future__ import annotations

import re

import asyncpg
import pytest

from agentlease.enums import Stage
from agentlease.ledger.store import Ledger
from tests.conftest import _asyncpg_dsn
from tests.eventually import assert_eventually

from .test_ledger_guards import make_spec

pytestmark = pytest.mark.postgres

RENEWALS = 60
"""Enough renewals of one row to fill its page several times over (each leaves a dead version behind)."""
RENEWED_COLUMNS = ("lease_expires_at_ms", "renewal_count", "updated_at_ms", "stage")
"""What a renewal writes (``renew`` in ``agentlease/ledger/writes.py``)."""
NOT_IN_PLACE_AT_MOST = 5
"""Renewals PostgreSQL may still move to another page: when the row's page is full and a snapshot open elsewhere
in the database (autovacuum's ANALYZE, under CI's load) keeps it from pruning the dead versions, the next version
goes to another page, which then holds the next dozens. With an index on a renewed column, about 23 of 60 were not
in place (every renewal that moved the expiry)."""


@pytest.fixture
def ledger_url(pg_url: str) -> str:
    """PostgreSQL only: SQLite has no index-free update to look for."""
    return pg_url


async def test_no_index_of_the_tasks_holds_a_column_a_renewal_writes(ledger: Ledger, ledger_url: str) -> None:
    """Keys, expressions and predicates alike: any of them naming a renewed column makes every renewal that
    changes it write index entries."""
    await ledger.db_now()  # the schema is in place
    connection = await asyncpg.connect(_asyncpg_dsn(ledger_url))
    try:
        definitions = await connection.fetch("SELECT indexdef FROM pg_indexes WHERE tablename = 'tasks'")
    finally:
        await connection.close()
    assert definitions
    renewed = re.compile(r"\b(" + "|".join(RENEWED_COLUMNS) + r")\b")
    assert [row["indexdef"] for row in definitions if renewed.search(row["indexdef"])] == []


async def test_the_renewals_update_the_task_in_place(ledger: Ledger, ledger_url: str) -> None:
    claim = await ledger.claim(make_spec(), "w1")
    for n in range(RENEWALS):
        await ledger.renew(claim, stage=Stage.EXTERNAL_CALL, reason=f"still calling ({n})")

    async def updates() -> tuple[int, int]:
        connection = await asyncpg.connect(_asyncpg_dsn(ledger_url))
        try:  # the ledger's sessions report their counts when idle, within seconds
            row = await connection.fetchrow(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tasks'"
            )
        finally:
            await connection.close()
        assert row is not None and row["n_tup_upd"] >= RENEWALS, row
        return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"])

    updated, in_place = await assert_eventually(updates, timeout=60, interval=0.5, message="the renewals counted")
    assert updated == RENEWALS
    assert in_place >= RENEWALS - NOT_IN_PLACE_AT_MOST, (updated, in_place)
