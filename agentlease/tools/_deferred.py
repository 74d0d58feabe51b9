"""Ledger writes a worker could not make during an outage (guarded holder writes), retried in the background until
the ledger is back; what is pending when the worker stops is left to the sweeper (``docs/recovery.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from agentlease.errors import LeaseLostError, LedgerUnavailableError, one_line
from agentlease.observability.metrics import LEASE_METRICS, LeaseMetrics

logger = logging.getLogger("agentlease.lease")

RETRY_FIRST = timedelta(milliseconds=500)
"""First pause before a deferred write is tried again. Default 0.5 s."""
RETRY_MOST = timedelta(seconds=5)
"""Longest pause between two tries. Default 5 s."""


@dataclass(frozen=True)
class DeferredWrite:
    """One write waiting for the ledger: ``what`` it is (for logs), ``write`` makes it."""

    what: str
    write: Callable[[], Awaitable[object]]


class DeferredWrites:
    """The writes of one worker waiting for the ledger to come back."""

    def __init__(self, metrics: LeaseMetrics = LEASE_METRICS) -> None:
        self._metrics = metrics
        self._pending: list[DeferredWrite] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, what: str, write: Callable[[], Awaitable[object]]) -> None:
        """Keep ``write`` until the ledger answers it (call from the worker's event loop)."""
        self._pending.append(DeferredWrite(what, write))
        self._metrics.deferred_writes(len(self._pending))
        logger.warning("ledger unavailable: %s deferred until the ledger is back", what)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="agentlease-deferred-writes")

    async def flush(self) -> int:
        """Try every pending write once now; returns how many are still pending."""
        for item in list(self._pending):
            try:
                await item.write()
            except LedgerUnavailableError:
                continue
            except LeaseLostError:
                logger.info("recorded after the outage, refused as evidence: %s", item.what)
            except Exception as exc:  # noqa: BLE001 - a write that can never succeed is dropped, once
                logger.warning("deferred ledger write dropped: %s: %s", item.what, one_line(exc))
            else:
                logger.info("recorded after the outage: %s", item.what)
            self._pending.remove(item)
        self._metrics.deferred_writes(len(self._pending))
        return len(self._pending)

    async def _drain(self) -> None:
        pause = RETRY_FIRST
        while self._pending:
            await asyncio.sleep(pause.total_seconds())
            before = len(self._pending)
            left = await self.flush()
            pause = RETRY_FIRST if left < before else min(pause * 2, RETRY_MOST)

    async def close(self) -> None:
        """Stop retrying; what is still pending is logged in one line and left to the sweeper."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._pending:
            logger.warning(
                "%d ledger write(s) not recorded, left to the sweeper: %s",
                len(self._pending),
                "; ".join(item.what for item in self._pending),
            )
        self._pending.clear()
        self._metrics.deferred_writes(0)


__all__ = ["DeferredWrite", "DeferredWrites"]
