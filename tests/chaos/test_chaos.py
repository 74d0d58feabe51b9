"""The chaos run's short form (``bench/chaos.py``): agent runs over three worker processes while workers
are killed, paused and restarted, the Temporal dev server is restarted on its database file and the
PostgreSQL ledger (a cluster of its own) is stopped and started. Counted from the downstream's and the
ledger's own records: no duplicate effect, no stale write accepted, no task settled twice, no run lost.

The long form is ``python -m bench.chaos --runs 1000`` (docs/recovery.md).
"""

from __future__ import annotations

import pytest

from bench.chaos import FAULTS, ChaosOptions, chaos
from tests.conftest import PG_ADMIN_URL

pytestmark = [pytest.mark.chaos, pytest.mark.postgres, pytest.mark.timeout(600)]


async def test_chaos_short_form() -> None:
    report = await chaos(
        ChaosOptions(
            runs=30,
            in_flight=6,
            faults_every=4.0,
            seed=2026,
            work_s=1.0,
            heal_s=240.0,
            min_faults=5,
            downstream_pg_url=PG_ADMIN_URL,
        )
    )
    summary = "\n".join(report.lines())
    assert set(report.faults) == set(FAULTS), summary  # every kind of fault happened
    assert report.duplicates == {}, summary
    assert report.stale_accepted == [], summary
    assert report.settled_twice == [], summary
    assert (report.lost, report.failed) == ([], []), summary
    assert report.completed + sum(report.waiting.values()) == report.runs, summary
    assert set(report.waiting) <= {"needs_reconciliation"}, summary  # only interrupted unsafe sends wait
