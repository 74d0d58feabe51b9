"""A renewal, the ledger's most frequent write, changes no column that an index of ``tasks`` holds: PostgreSQL
updates the renewed row in place (a HOT update) and writes no index entry for it (``docs/operations.md``,
"The sweeper"). Read from PostgreSQL's own statistics of the table, after real renewals through the ledger.
"""

from __future__ import annotations

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


@pytest.fixture
def ledger_url(pg_url: str) -> str:
    """PostgreSQL only: SQLite has no index-free update to look for."""
    return pg_url


async def test_every_renewal_updates_the_task_in_place(ledger: Ledger, ledger_url: str) -> None:
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
    assert (updated, in_place) == (RENEWALS, RENEWALS)
