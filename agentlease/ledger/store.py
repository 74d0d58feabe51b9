"""The lease ledger (:class:`Ledger`): every lease write is one conditional statement judged on the database's
clock, described once in :mod:`agentlease.ledger.writes`; its guarantees: ``docs/guarantees.md``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement

from agentlease.clock import from_ms, now_param
from agentlease.enums import DecisionKind, ErrorClass, Stage, TaskStatus
from agentlease.ledger import claims, decide, holder
from agentlease.ledger.core import LedgerCore
from agentlease.ledger.database import LedgerDatabase, open_database
from agentlease.ledger.engine import PG_POOL_SIZE
from agentlease.ledger.listing import TaskFilter, collect, event_pages, task_pages
from agentlease.ledger.statements import LeaseStatements
from agentlease.observability.metrics import LEASE_METRICS, LeaseMetrics
from agentlease.observability.tracing import traced
from agentlease.records import (
    ApprovalRequest,
    Claim,
    LeaseEvent,
    SettlementReceipt,
    StoredReceipt,
    TaskRecord,
    TaskSpec,
    TraceLink,
)


class Ledger:
    """Lease operations on the ``tasks``, ``lease_events`` and ``receipts`` tables. Each method takes an
    optional ``now`` (aware datetime) for tests; otherwise the database's clock decides.

    Args:
        database: from :func:`open_database`; the ledger owns it.
        metrics: where each operation reports; default the process's lease metrics.
    """

    def __init__(self, database: LedgerDatabase, *, metrics: LeaseMetrics = LEASE_METRICS) -> None:
        self._core = LedgerCore(database, metrics)

    @classmethod
    def from_url(cls, url: str, *, pool_size: int = PG_POOL_SIZE, metrics: LeaseMetrics = LEASE_METRICS) -> Ledger:
        """Open a ledger on ``sqlite:///PATH`` or ``postgresql://...`` (see :func:`open_database`)."""
        return cls(open_database(url, pool_size=pool_size), metrics=metrics)

    @property
    def metrics(self) -> LeaseMetrics:
        """Where this ledger's operations report (the sweeper's expiries report there too)."""
        return self._core.metrics

    @property
    def statements(self) -> LeaseStatements:
        """The prebuilt statements of this ledger's dialect (its lease writes: :mod:`agentlease.ledger.writes`)."""
        return self._core.sql

    @property
    def database(self) -> LedgerDatabase:
        """Where the ledger's transactions run (for migrations and the sweeper's queries)."""
        return self._core.db

    async def close(self) -> None:
        """Close the database's connections (and the SQLite ledger thread)."""
        await self._core.db.dispose()

    @property
    def now_expression(self) -> ColumnElement[int]:
        """The current time in statements: the bound ``now_ms`` (:func:`~agentlease.clock.now_param`) or the clock."""
        return self._core.sql.now

    @traced("claim")
    async def claim(
        self,
        spec: TaskSpec,
        owner: str,
        *,
        trace: TraceLink | None = None,
        heartbeat_timeout: timedelta | None = None,
        now: datetime | None = None,
    ) -> Claim:
        """Claim a task for one attempt, minting the next claim generation (G1, G3): the granted :class:`Claim`,
        with the previous attempt's last durable stage. The task row is created on first sight from ``spec``;
        one whose ``spec`` has an ``approval_ttl`` needs an approval to consume (``docs/decisions.md``).

        Args:
            spec / owner: the task (identity, tool, class, key, lease TTL); the worker that will hold the lease.
            trace: the Temporal attempt this claim belongs to.
            heartbeat_timeout: the attempt's Temporal heartbeat timeout; the ``claimed`` entry records it
                when it differs from the lease's TTL (``docs/ttl.md``). Zero is Temporal's "no heartbeat timeout":
                as ``None``, the lease keeps its TTL.

        Raises:
            LeaseHeldError: another lease is valid; ``retry_after`` is the time until it lapses.
            TaskClosedError: the task is settled, dead-lettered or cancelled.
            ApprovalRefusedError: (a ``TaskClosedError``) no approval to consume; ``awaiting_approval`` again.
            ClockBehindError: SQLite only: this process's clock runs behind the ledger's latest recorded time (G1).
            LedgerUnavailableError: the ledger could not be reached.
            ValueError: ``heartbeat_timeout`` is negative or under 1 ms: the lease would lapse as it is granted.
        """
        return await claims.claim(self._core, spec, owner, trace=trace, heartbeat_timeout=heartbeat_timeout, now=now)

    @traced("renew")
    async def renew(
        self,
        claim: Claim,
        *,
        reason: str,
        stage: Stage | None = None,
        details: dict[str, Any] | None = None,
        ttl: timedelta | None = None,
        now: datetime | None = None,
    ) -> datetime:
        """Extend the lease held by ``claim`` by its own TTL, recording the stage first and a specific reason
        (G2, G5); the recorded stage never goes back (G6). Returns the new expiry (aware, ledger clock).

        Args:
            reason: what the holder is doing ("committed draft, verifying readback"); not blank.
            stage: the stage the holder is entering; ``None`` keeps the current one; never ``settled``.
            details: facts for the ``renewed`` entry (a probe's evidence, a changed heartbeat timeout).
            ttl: extend by this instead of the lease's own TTL when shorter (``docs/ttl.md``); default the lease's.

        Raises:
            LeaseLostError: the lease lapsed, was superseded, or the task was cancelled or settled (recorded).
            LedgerUnavailableError: the ledger could not be reached; the lease is not confirmed.
            ValueError: ``stage`` is ``settled``, ``reason`` is blank, or ``ttl`` is under 1 ms (zero, negative).
        """
        return await holder.renew(self._core, claim, reason=reason, stage=stage, details=details, ttl=ttl, now=now)

    @traced("settle")
    async def settle(
        self,
        claim: Claim,
        receipt: SettlementReceipt,
        *,
        result: dict[str, Any] | None = None,
        retried: bool = False,
        reconciled: dict[str, Any] | None = None,
        now: datetime | None = None,
    ) -> StoredReceipt:
        """Settle the task of ``claim`` with ``receipt``, made after readback (G2, G6, G10); the first receipt of a
        key stands, and is returned.

        Args:
            result: the tool's result, kept as evidence if the settle is refused.
            retried: this call repeats one that raised :class:`LedgerUnavailableError`: its own committed settle
                is recognised and returned. Default false: a second settle is refused like any stale write.
            reconciled: the evidence of the tool's probe that found the action done (``details.evidence``).

        Raises:
            LeaseLostError: the holder no longer holds the lease; the result is recorded as ``late_unapplied``.
            LedgerUnavailableError: the ledger could not be reached; the settle may have committed.
        """
        return await holder.settle(
            self._core, claim, receipt, result=result, retried=retried, reconciled=reconciled, now=now
        )

    @traced("release")
    async def release(
        self,
        claim: Claim,
        *,
        error_class: ErrorClass | str,
        error: str,
        details: dict[str, Any] | None = None,
        retried: bool = False,
        now: datetime | None = None,
    ) -> None:
        """Give the task of ``claim`` back for a retry, recording why; the last durable stage is kept. A class
        that does not count as an attempt (``shutdown``) gives the attempt back (``docs/recovery.md``).

        Args:
            error_class: how the attempt ended (``retryable``, ``shutdown``, ``paused``...).
            error: one line describing the failure.
            details: facts for the ``released`` entry (``cause``: why Temporal cancelled the attempt).
            retried: this call repeats one that raised :class:`LedgerUnavailableError` (its own write is recognised).

        Raises:
            LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
            LedgerUnavailableError: the ledger could not be reached (call again with ``retried=True``).
            ValueError: ``error_class`` is not an :class:`~agentlease.enums.ErrorClass`.
        """
        await holder.end_lease(
            self._core, claim, "release", TaskStatus.RELEASED, error_class, error, now, details, retried
        )

    @traced("dead_letter")
    async def dead_letter(
        self, claim: Claim, *, error_class: ErrorClass | str, error: str, now: datetime | None = None
    ) -> None:
        """Move the task out of circulation for inspection, until a redrive or a cancel.

        Raises:
            LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
        """
        await holder.end_lease(self._core, claim, "dead_letter", TaskStatus.DEAD_LETTERED, error_class, error, now)

    @traced("await_decision")
    async def await_decision(
        self,
        claim: Claim,
        *,
        status: TaskStatus,
        error_class: ErrorClass | str,
        error: str,
        retried: bool = False,
        now: datetime | None = None,
    ) -> None:
        """Park the task until a person decides: ``blocked``, ``needs_reconciliation`` or ``dead_lettered``;
        no claim is granted while it waits. ``retried``: as for :meth:`release`.

        Raises:
            ValueError: ``status`` is not one a holder may park a task in.
            LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
            LedgerUnavailableError: the ledger could not be reached (the park may have committed).
        """
        if not status.awaits_decision or status is TaskStatus.AWAITING_APPROVAL:
            raise ValueError(f"a holder does not park a task as {status.value}")
        await holder.end_lease(self._core, claim, status.value, status, error_class, error, now, retried=retried)

    @traced("decide")
    async def decide(
        self,
        task_id: str,
        kind: DecisionKind,
        *,
        by: str,
        reason: str,
        details: dict[str, Any] | None = None,
        receipt: SettlementReceipt | None = None,
        spec: TaskSpec | None = None,
        expected_generation: int | None = None,
        now: datetime | None = None,
        approval_request: ApprovalRequest | None = None,
    ) -> TaskRecord:
        """Apply the decision ``kind`` of :data:`~agentlease.decisions.table.DECISIONS` to ``task_id``, ending
        any claim in the same statement (G8; ``docs/decisions.md``). Returns the task after the decision.

        Args:
            by / reason: who decided, and why.
            details: facts for the evidence trail.
            receipt: the settlement receipt a settling decision writes; required for those, refused otherwise.
            spec: the task's identity, to create it if absent.
            expected_generation: the generation a signed decision was made for: the task must still be at it
                (checked under the row's lock). Default ``None``: not bound.
            approval_request: with ``await_approval``: the call the person is asked to approve, stored
                redacted (``TaskRecord.approval_request``). Default ``None``.

        Raises:
            TaskMovedError: the task is at another generation than ``expected_generation``; nothing changed.
            TaskNotFoundError: unknown task (and no ``spec``).
            TaskClosedError: the task is not in a status the decision applies to; nothing changed.
            ValueError: ``receipt`` is missing for a decision that settles, or given for one that does not.
        """
        return await decide.decide(
            self._core,
            task_id,
            kind,
            by=by,
            reason=reason,
            details=details,
            receipt=receipt,
            spec=spec,
            expected_generation=expected_generation,
            now=now,
            approval_request=approval_request,
        )

    async def record_refused_decision(
        self, spec: TaskSpec, *, decision: str, by: str | None, refusal: str, now: datetime | None = None
    ) -> None:
        """Write a refused decision signal to the task's trail (``decision_refused``); nothing else changes. A
        task the ledger has not seen yet is created first (``docs/decisions.md``, "Deciding by signal").

        Args:
            spec / decision / by / refusal: the task the signal named, the decision as sent, who sent it (if
                it said), why it was refused.
        """
        await decide.record_refused_decision(self._core, spec, decision=decision, by=by, refusal=refusal, now=now)

    async def get_task(self, task_id: str) -> TaskRecord:
        """The task's current record. Raises :class:`TaskNotFoundError`."""
        return await self._core.db.read(lambda conn: self._core.task(conn, task_id))

    async def list_tasks(self, agent_run_id: str | None = None) -> list[TaskRecord]:
        """Tasks, oldest first, optionally of one agent run, in one list (read in keyset pages)."""
        return await collect(task_pages(self._core.db, TaskFilter(agent_run_id=agent_run_id)))

    async def events(self, task_id: str | None = None, *, agent_run_id: str | None = None) -> list[LeaseEvent]:
        """The evidence trail in order, for one task or one agent run (or all), in one list (read in pages)."""
        return await collect(event_pages(self._core.db, task_id=task_id, agent_run_id=agent_run_id))

    async def receipt(self, idempotency_key: str) -> StoredReceipt | None:
        """The stored settlement receipt for an idempotency key, if any."""
        return await self._core.db.read(lambda conn: self._core.receipt(conn, idempotency_key))

    async def db_now(self) -> datetime:
        """The ledger database's current time (aware)."""
        sql = self._core.sql
        value = await self._core.db.read(lambda conn: conn.execute(sql.select_now, now_param(None)).scalar_one())
        result = from_ms(value)
        assert result is not None
        return result
