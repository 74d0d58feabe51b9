"""The expired-lease sweeper, shaped like River's rescuer: settings validated at construction, a loop that only
calls :meth:`ExpiredLeaseSweeper.run_once`, which records each lapsed lease and moves its task as the recovery
policy says, with conditional writes (:mod:`agentlease.ledger.expiry`; ``docs/operations.md``, "The sweeper").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agentlease.enums import TaskStatus
from agentlease.errors import one_line
from agentlease.ledger.approval_warnings import warn_expiring_approvals
from agentlease.ledger.expiry import ExpiredLease, Expiry, expired_leases, record_expiries
from agentlease.ledger.store import Ledger
from agentlease.records import DEFAULT_MAX_ATTEMPTS
from agentlease.recovery._policy import RecoveryDecision, decide

logger = logging.getLogger("agentlease.sweeper")

APPROVAL_WARNING = timedelta(minutes=5)
"""How long before an approval lapses the sweeper warns of it, by default."""


@dataclass(frozen=True)
class SweeperSettings:
    """Settings of the sweeper (``ValueError``: a non-positive interval, batch size or limit).

    Attributes:
        interval: pause between two sweeps. Default 5s.
        batch_size: leases read per keyset batch, each recorded by one statement. Default 500.
        default_max_attempts: real attempts of a tool not in ``max_attempts_by_tool`` (per-tool limits). Default 5.
        approval_warning: an approval not yet consumed that lapses within this gets one ``approval_expiring``
            entry (ledger clock). Default 5 minutes.
    """

    interval: timedelta = timedelta(seconds=5)
    batch_size: int = 500
    default_max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_attempts_by_tool: Mapping[str, int] = field(default_factory=dict)
    approval_warning: timedelta = APPROVAL_WARNING

    def __post_init__(self) -> None:
        if self.interval <= timedelta(0):
            raise ValueError("sweeper interval must be positive")
        if self.approval_warning <= timedelta(0):
            raise ValueError("sweeper approval_warning must be positive")
        if self.batch_size < 1:
            raise ValueError("sweeper batch_size must be at least 1")
        if self.default_max_attempts < 1 or any(v < 1 for v in self.max_attempts_by_tool.values()):
            raise ValueError("max attempts must be at least 1")


@dataclass(frozen=True)
class SweepResult:
    """Counts of one :meth:`ExpiredLeaseSweeper.run_once`: expired leases ``examined``, recorded and ``released``,
    parked (``needs_reconciliation``) or ``dead_lettered``, and ``skipped`` (changed meanwhile); approvals about
    to lapse warned of (``approvals_expiring``)."""

    examined: int = 0
    released: int = 0
    needs_reconciliation: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    approvals_expiring: int = 0

    @property
    def recorded(self) -> int:
        return self.released + self.needs_reconciliation + self.dead_lettered


class ExpiredLeaseSweeper:
    """Records and classifies lapsed leases. ``tool_limits``: per-tool max attempts (over the settings'), read the
    first time a lease is classified (for tools costly to load)."""

    def __init__(
        self,
        ledger: Ledger,
        settings: SweeperSettings | None = None,
        *,
        tool_limits: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self._ledger = ledger
        self.settings = settings or SweeperSettings()
        self._tool_limits = tool_limits
        self._limits: Mapping[str, int] | None = None if tool_limits else self.settings.max_attempts_by_tool
        self.failed_sweeps = 0
        """Sweeps of :meth:`run` that raised (logged, then the loop went on)."""

    def _max_attempts(self, tool: str) -> int:
        """The attempts limit of ``tool``; reads ``tool_limits`` on first use (ValueError: a limit below 1)."""
        if self._limits is None:
            assert self._tool_limits is not None
            loaded = {**self.settings.max_attempts_by_tool, **self._tool_limits()}
            if any(v < 1 for v in loaded.values()):
                raise ValueError("max attempts must be at least 1")
            self._limits = loaded
        return self._limits.get(tool, self.settings.default_max_attempts)

    def classify(self, lease: ExpiredLease) -> tuple[TaskStatus, RecoveryDecision]:
        """The status a lapsed lease's task moves to, and the policy rule that chose it."""
        decision = decide(
            lease.side_effect_class,
            lease.stage,
            receipt_present=lease.has_receipt,
            error_class=None,
            real_attempts=lease.attempts,
            max_attempts=self._max_attempts(lease.tool),
        )
        return decision.action.parks_as or TaskStatus.RELEASED, decision

    def _expiry(self, lease: ExpiredLease) -> Expiry:
        status, decision = self.classify(lease)
        return Expiry(lease, status, decision.rule)

    async def run_once(self, *, now: datetime | None = None) -> SweepResult:
        """One sweep over every lease lapsed at ``now`` (default the database's clock), in keyset batches,
        each batch recorded by one conditional statement; then one ``approval_expiring`` entry for each
        approval about to lapse (up to a batch of them)."""
        counts = {"examined": 0, "released": 0, "needs_reconciliation": 0, "dead_lettered": 0, "skipped": 0}
        cursor: tuple[int, str] | None = None
        while True:
            batch = await expired_leases(self._ledger, limit=self.settings.batch_size, after=cursor, now=now)
            expiries = [self._expiry(lease) for lease in batch]
            recorded = await record_expiries(self._ledger, expiries, now=now)
            counts["examined"] += len(batch)
            counts["skipped"] += len(batch) - len(recorded)
            for expiry in expiries:
                if expiry.lease.task_id in recorded:
                    counts[expiry.status.value] += 1
            if len(batch) < self.settings.batch_size:
                break
            cursor = batch[-1].cursor
        warned = await warn_expiring_approvals(
            self._ledger, within=self.settings.approval_warning, limit=self.settings.batch_size, now=now
        )
        return SweepResult(**counts, approvals_expiring=len(warned))

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``interval`` until ``stop`` is set; a sweep that fails is logged in one line and counted
        in :attr:`failed_sweeps`."""
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception as exc:  # noqa: BLE001 - a background loop outlives one failed sweep
                self.failed_sweeps += 1
                logger.warning(
                    "sweep failed, next one in %gs: %s", self.settings.interval.total_seconds(), one_line(exc)
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.interval.total_seconds())
