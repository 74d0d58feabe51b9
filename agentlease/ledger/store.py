"""The lease ledger: every lease write is one conditional statement judged on the database's clock.

Guarantees held here (``docs/guarantees.md``): G1 at most one valid lease per task; G2 a lapsed or
superseded holder cannot renew, settle, release or dead-letter (zero rows affected raises
:class:`LeaseLostError`); G3 generations are minted only inside the claim statement; G6 the
recorded stage never goes back and a receipt, once stored, stands; G8 a decision (cancel among
them) ends any claim in the same statement; G10 a refused settle is recorded as ``late_unapplied``
evidence.

:class:`Ledger` is the public face. Each lease write is described once in
:mod:`agentlease.ledger.writes` and run by the module of its job: :mod:`~agentlease.ledger.claims`,
:mod:`~agentlease.ledger.holder` (renew, settle, lease ends), :mod:`~agentlease.ledger.decide`.
Every method takes an optional ``now`` (aware datetime) for tests; otherwise the database's clock
decides.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement

from agentlease.clock import from_ms, now_param
from agentlease.enums import DecisionKind, ErrorClass, Stage, TaskStatus
from agentlease.ledger import claims, decide, holder
from agentlease.ledger.core import LedgerCore, task_values
from agentlease.ledger.database import LedgerDatabase, open_database
from agentlease.ledger.engine import PG_POOL_SIZE
from agentlease.ledger.listing import TaskFilter, collect, event_pages, task_pages
from agentlease.ledger.statements import LeaseStatements
from agentlease.observability.metrics import LEASE_METRICS, LeaseMetrics
from agentlease.observability.tracing import traced
from agentlease.records import (
    Claim,
    LeaseEvent,
    SettlementReceipt,
    StoredReceipt,
    TaskRecord,
    TaskSpec,
    TraceLink,
)


class Ledger:
    """Lease operations on the ``tasks``, ``lease_events`` and ``receipts`` tables.

    Each operation is one transaction run by a :class:`LedgerDatabase` (on SQLite, one hop to the
    ledger's thread; see :mod:`agentlease.ledger.database`); on PostgreSQL a lease write that is one
    statement is sent alone, in autocommit.

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
        """The current time in statements: the bound ``now_ms`` (see :func:`~agentlease.clock.now_param`),
        or the database clock."""
        return self._core.sql.now

    @staticmethod
    def task_values(spec: TaskSpec, now: datetime | None) -> dict[str, Any]:
        """The parameters of :attr:`LeaseStatements.insert_task` for ``spec``."""
        return task_values(spec, now)

    # -- claim ---------------------------------------------------------------------------------

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
        """Claim a task for one attempt, minting the next claim generation (G1, G3).

        The task row is created on first sight from ``spec``. The claim is one conditional UPDATE:
        it succeeds only if the task is pending or released, or running with a lease that has
        lapsed on the ledger's clock; it sets ``claim_generation = claim_generation + 1`` and
        ``attempts = attempts + 1`` in the same statement. No caller chooses a generation.

        A task whose ``spec`` carries an ``approval_ttl`` (its tool requires approval) is claimed only
        with an approval it may consume: of this tool and these arguments, given less than
        ``approval_ttl`` ago on the ledger's clock, not consumed yet. The claim consumes it (records its
        generation), so a later attempt of the task runs on the recovery policy, never on a second
        approved execution. Without one the claim is refused: the task goes back to
        ``awaiting_approval`` with one ``approval_refused`` entry (``docs/recovery.md``, "Approvals").

        Args:
            spec: the task's identity, tool, class, idempotency key and lease TTL.
            owner: the worker identity that will hold the lease.
            trace: the Temporal attempt this claim belongs to.
            heartbeat_timeout: the attempt's Temporal heartbeat timeout; when it differs from the
                lease's TTL (``temporal activity update-options`` changed it) the ``claimed`` entry
                records both (``details.heartbeat_timeout_ms``): Temporal and the ledger then give up
                on a silent attempt at different times.
            now: injected time; default the database's clock.

        Returns:
            The granted :class:`Claim`, with the previous attempt's last durable stage.

        Raises:
            LeaseHeldError: another lease is valid; ``retry_after`` is the time until it lapses.
            TaskClosedError: the task is settled, dead-lettered or cancelled.
            ApprovalRefusedError: (a ``TaskClosedError``) an approval-gated task has no approval the
                claim may consume; it is ``awaiting_approval`` again.
            ClockBehindError: SQLite only: this process's clock runs behind the ledger's latest
                recorded time (G1: one host, one clock).
            LedgerUnavailableError: the ledger could not be reached.
        """
        return await claims.claim(self._core, spec, owner, trace=trace, heartbeat_timeout=heartbeat_timeout, now=now)

    # -- holder writes -------------------------------------------------------------------------

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
        """Extend the lease by its own TTL, recording the stage first and a specific reason (G2, G5).

        The recorded stage never goes back (G6): a ``stage`` before the one the ledger holds (an
        earlier attempt reached further) leaves it as it is, whoever renews.

        Args:
            claim: the lease held.
            reason: what the holder is doing ("committed draft, verifying readback"); not blank.
            stage: the stage the holder is entering; ``None`` keeps the current one. Never
                ``settled``: only :meth:`settle` settles.
            details: facts for the ``renewed`` entry (a probe's evidence, a changed heartbeat timeout).
            ttl: extend by this instead of the lease's own TTL, when shorter (the lease follows
                Temporal's heartbeat timeout an operator shortened); ``None`` or longer: the lease's TTL.
            now: injected time; default the database's clock.

        Returns:
            The new expiry (aware, ledger clock).

        Raises:
            LeaseLostError: the lease lapsed, was superseded, or the task was cancelled or settled.
                A ``lease_lost`` event is recorded before raising.
            LedgerUnavailableError: the ledger could not be reached; the lease is not confirmed.
            ValueError: ``stage`` is ``settled``, or ``reason`` is blank.
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
        """Settle the task with a receipt made after readback (G2, G6, G10).

        The receipt is stored once per idempotency key; the first stored receipt stands.

        Args:
            claim: the lease held.
            receipt: the settlement receipt.
            result: the tool's result, kept as evidence if the settle is refused.
            retried: this call repeats one that raised :class:`LedgerUnavailableError`: a settle of
                this claim with this receipt that committed all the same is recognised and returned,
                not refused. Default false: a second settle is refused like any stale write.
            reconciled: the tool's probe found the action done: its evidence. The ``settled`` entry then
                says the task was reconciled by the probe (``details.reconciled_by``, ``details.evidence``).
            now: injected time; default the database's clock.

        Returns:
            The stored receipt for the task's idempotency key.

        Raises:
            LeaseLostError: the holder no longer holds the lease; the result is recorded as a
                ``late_unapplied`` event and nothing else changes.
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
        """Give the task back for a retry, recording why (``docs/guarantees.md``, "release for retry").

        The last durable stage is kept so the next attempt can read it. ``attempts`` counts real
        attempts only: a release whose class does not count as an attempt (``shutdown``, a worker
        that ran out of time to finish) gives its attempt back in the same statement.

        Args:
            claim: the lease held.
            error_class: how the attempt ended (``retryable``, ``shutdown``, ``paused``...).
            error: one line describing the failure.
            details: facts for the ``released`` entry (``cause``: why Temporal cancelled the attempt).
            retried: this call repeats one that raised :class:`LedgerUnavailableError`: the same
                release that committed all the same is recognised, not refused.
            now: injected time; default the database's clock.

        Raises:
            LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
            LedgerUnavailableError: the ledger could not be reached (the release may have committed;
                call again with ``retried=True``).
            ValueError: ``error_class`` is not an :class:`~agentlease.enums.ErrorClass`.
        """
        await holder.end_lease(
            self._core, claim, "release", TaskStatus.RELEASED, error_class, error, now, details, retried
        )

    @traced("dead_letter")
    async def dead_letter(
        self,
        claim: Claim,
        *,
        error_class: ErrorClass | str,
        error: str,
        now: datetime | None = None,
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
        """Park the task until a person decides: ``blocked``, ``needs_reconciliation`` or ``dead_lettered``.

        No claim is granted while it waits (``docs/recovery.md``, "Recovery classification").
        ``retried``: as for :meth:`release`.

        Raises:
            ValueError: ``status`` is not one a holder may park a task in.
            LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
            LedgerUnavailableError: the ledger could not be reached (the park may have committed).
        """
        if not status.awaits_decision or status is TaskStatus.AWAITING_APPROVAL:
            raise ValueError(f"a holder does not park a task as {status.value}")
        await holder.end_lease(self._core, claim, status.value, status, error_class, error, now, retried=retried)

    # -- decisions -----------------------------------------------------------------------------

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
    ) -> TaskRecord:
        """Apply a decision of the decision table (:data:`~agentlease.decisions.table.DECISIONS`), ending any claim.

        One conditional UPDATE from one of the statuses the decision applies to (row count
        checked) plus an evidence entry naming who decided and why. Ending the claim in the same
        statement is what makes a cancel stick (G8): the old generation can no longer renew or
        settle, and expiry never moves a cancelled task again. A decision that settles (``confirm``)
        stores ``receipt`` once per idempotency key. With ``spec`` a task the ledger has not seen
        yet is created first.

        Args:
            task_id: the task.
            kind: the decision.
            by / reason: who decided, and why.
            details: facts for the evidence trail.
            receipt: the settlement receipt a settling decision writes; required for those, refused otherwise.
            spec: the task's identity, to create it if absent.
            expected_generation: the claim generation the decision was made for (a signed
                decision's): a precondition, never written; the task must still be at it, checked
                under the row's lock in the same transaction. Default ``None``: not bound.
            now: injected time; default the database's clock.

        Returns:
            The task after the decision.

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
        )

    async def record_refused_decision(
        self, spec: TaskSpec, *, decision: str, by: str | None, refusal: str, now: datetime | None = None
    ) -> None:
        """Write a refused decision signal to the task's evidence trail (``decision_refused``); nothing else changes.

        A decision sent as an update is refused before it is accepted and leaves no history; one
        sent as a signal cannot be refused to its sender, so its refusal is evidence
        (``docs/operator-views.md``). A task the ledger has not seen yet is created first.

        Args:
            spec: the task the signal named.
            decision: the decision it asked for, as sent.
            by: who sent it, if it said.
            refusal: why it was refused.
            now: injected time; default the database's clock.
        """
        await decide.record_refused_decision(self._core, spec, decision=decision, by=by, refusal=refusal, now=now)

    # -- reads ---------------------------------------------------------------------------------

    async def get_task(self, task_id: str) -> TaskRecord:
        """The task's current record. Raises :class:`TaskNotFoundError`."""
        return await self._core.db.read(lambda conn: self._core.task(conn, task_id))

    async def list_tasks(self, agent_run_id: str | None = None) -> list[TaskRecord]:
        """Tasks, oldest first, optionally of one agent run, in one list.

        Read in keyset pages (:mod:`agentlease.ledger.listing`, which streams them for listings
        of any size).
        """
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
