"""The sweeper's loop outlives a failed sweep, as a background service must: it logs one line,
counts the failure, and sweeps again after its interval."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

import pytest

from agentlease.errors import LedgerUnavailableError
from agentlease.recovery._sweeper import ExpiredLeaseSweeper, SweeperSettings, SweepResult


class FlakySweeper(ExpiredLeaseSweeper):
    """Fails its first two sweeps as an unreachable ledger would, then succeeds."""

    def __init__(self, stop_after: int) -> None:
        super().__init__(ledger=None, settings=SweeperSettings(interval=timedelta(milliseconds=1)))  # type: ignore[arg-type]
        self.calls = 0
        self.stop = asyncio.Event()
        self.stop_after = stop_after

    async def run_once(self, *, now: datetime | None = None) -> SweepResult:
        self.calls += 1
        if self.calls >= self.stop_after:
            self.stop.set()
        if self.calls <= 2:
            raise LedgerUnavailableError("ledger postgresql://db/ledger: connection refused")
        return SweepResult(examined=1, released=1)


async def test_the_loop_goes_on_after_a_failed_sweep(caplog: pytest.LogCaptureFixture) -> None:
    sweeper = FlakySweeper(stop_after=4)
    with caplog.at_level(logging.WARNING, logger="agentlease.sweeper"):
        await asyncio.wait_for(sweeper.run(sweeper.stop), timeout=30)
    assert (sweeper.calls, sweeper.failed_sweeps) == (4, 2)
    lines: list[Any] = [r.getMessage() for r in caplog.records]
    cause = "LedgerUnavailableError: ledger postgresql://db/ledger: connection refused"
    assert lines == [f"sweep failed, next one in 0.001s: {cause}"] * 2
    assert all(r.exc_info is None for r in caplog.records)  # one line each, no traceback
