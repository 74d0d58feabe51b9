"""`agentlease advise-ttl` as a user runs it, on a ledger with a known renewal history."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from agentlease.ledger.migrate import upgrade
from agentlease.ledger.store import Ledger
from tests.integration.test_ttl_advice import bursty_call, steady_call

from .runner import Cli
from .test_cli import BAD_INPUT, FAILED, assert_one_error_line


async def fill(url: str) -> None:
    ledger = Ledger.from_url(url)
    try:
        await upgrade(ledger.database)
        base = await ledger.db_now()
        await steady_call(ledger, base)
        await bursty_call(ledger, base + timedelta(seconds=60))
    finally:
        await ledger.close()


def test_advise_ttl_prints_gaps_a_recommendation_and_warnings(cli: Cli) -> None:
    url = f"sqlite:///{cli.cwd / 'ledger.db'}"
    env = {"AGENTLEASE_LEDGER_URL": url}
    empty = cli("db", "upgrade", env=env)
    assert empty.returncode == 0, empty
    assert_one_error_line(cli("advise-ttl", env=env), FAILED, "no renewal history")

    asyncio.run(fill(url))
    shown = cli("advise-ttl", env=env)
    assert shown.returncode == 0, shown
    assert "bursty: lease TTL 5s, recommended 9s" in shown.stdout, shown
    assert "steady: lease TTL 10s, recommended 2s" in shown.stdout, shown
    assert "warning: bursty: holders went quiet for up to 4.5s" in shown.stdout, shown
    assert "TTL 10s: recovery after a crash ~11s" in shown.stdout, shown

    as_json = cli("advise-ttl", "--tool", "bursty", "--json", env=env)
    [bursty] = json.loads(as_json.stdout)
    assert (bursty["tool"], bursty["recommended_ttl_s"], bursty["gaps"]["max"]) == ("bursty", 9.0, 4.5)

    assert_one_error_line(cli("advise-ttl", "--since", "yesterday", env=env), BAD_INPUT, "bad --since")
