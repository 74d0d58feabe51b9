"""`agentlease advise-ttl` as a user runs it, on a ledger with a known renewal history."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from agentlease.recovery.ttl_advice import MIN_GAPS
from tests.integration.test_ttl_advice import (
    STEADY_CALLS,
    bursty_call,
    paused_quick_call,
    quick_call,
    steady_calls,
)

from .runner import Cli
from .test_cli import BAD_INPUT, FAILED, assert_one_error_line


async def fill(url: str) -> None:
    """``steady`` with enough gaps, ``bursty`` with too few, ``quick`` with a holder that came back."""
    ledger = Ledger.from_url(url)
    try:
        await upgrade(ledger.database)
        base = await ledger.db_now()
        await steady_calls(ledger, base)
        await bursty_call(ledger, base + timedelta(seconds=200))
        for n in range(MIN_GAPS // 4 + 1):
            await quick_call(ledger, base + timedelta(seconds=300 + 10 * n))
        await paused_quick_call(ledger, base + timedelta(seconds=500))
    finally:
        await ledger.close()


def test_advise_ttl_shows_counts_and_refuses_to_advise_from_too_few(cli: Cli) -> None:
    url = f"sqlite:///{cli.cwd / 'ledger.db'}"
    env = {"AGENTLEASE_LEDGER_URL": url, "COLUMNS": "120"}
    empty = cli("db", "upgrade", env=env)
    assert empty.returncode == 0, empty
    assert_one_error_line(cli("advise-ttl", env=env), FAILED, "no renewal history")

    asyncio.run(fill(url))
    shown = cli("advise-ttl", env=env)
    assert shown.returncode == 0, shown
    out = shown.stdout
    gaps = 4 * STEADY_CALLS
    assert f"steady: lease TTL 10s, recommended 2s ({gaps} gaps in {STEADY_CALLS} leases)" in out, shown
    assert f"bursty: lease TTL 5s, no recommendation from 5 gaps in 2 leases (needs at least {MIN_GAPS} gaps)" in out
    assert f"not enough history: 5 gaps between holder writes, {MIN_GAPS} needed ({MIN_GAPS - 5} more" in out, shown
    assert "warning: bursty: holders went quiet for up to 4.5s" in out, shown
    assert "TTL 10s: recovery after a crash ~11s" in out, shown
    assert "renewals/min" not in out, shown
    # The sample counts are in the table, not only in --json: the "all" row of steady has its gaps.
    assert re.search(rf"│ all\s+│\s+{gaps} │", out), shown
    # quick's holder came back after its lease lapsed in external_call: never a TTL below its 3 s.
    quick = re.search(r"quick: lease TTL 3s, recommended (\d+)s", out)
    assert quick is not None and int(quick[1]) >= 3, shown
    assert "quick: 1 lease(s) lapsed while the holder was alive (1 in external_call)" in out, shown
    assert re.search(r"│ external_call\s+│.*│ 1 \(1 alive\) │", out), shown

    as_json = cli("advise-ttl", "--tool", "steady", "--json", env=env)
    [steady] = json.loads(as_json.stdout)
    assert (steady["tool"], steady["recommended_ttl_s"], steady["leases"], steady["gaps"]["count"]) == (
        "steady",
        2.0,
        STEADY_CALLS,
        gaps,
    )

    # One tool with too few gaps: its table and counts, then one error line saying what is missing.
    too_few = cli("advise-ttl", "--tool", "bursty", env=env)
    assert_one_error_line(too_few, FAILED, "not enough renewal history", "bursty has 5 gaps", f"needs {MIN_GAPS}")
    assert "bursty: lease TTL 5s, no recommendation from 5 gaps" in too_few.stdout, too_few
    [bursty] = json.loads(cli("advise-ttl", "--tool", "bursty", "--json", env=env).stdout)
    assert (bursty["recommended_ttl_s"], bursty["gaps"]["count"], bursty["min_gaps"]) == (None, 5, MIN_GAPS)

    assert_one_error_line(cli("advise-ttl", "--since", "yesterday", env=env), BAD_INPUT, "bad --since")
