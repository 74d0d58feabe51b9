"""The lease ledger: every lease write is one conditional statement judged on the database's clock.

Guarantees held here (DESIGN.md): G1 at most one valid lease per task; G2 a lapsed or superseded
holder cannot renew, settle, release or dead-letter (zero rows affected raises
:class:`LeaseLostError`); G3 generations are minted only inside the claim statement; G10 a refused
settle is recorded as ``late_unapplied`` evidence.

Every method takes an optional ``now`` (aware datetime) for tests; otherwise the database's clock
decides (STYLE.md, rule 7).
"""

from __future__ import annotations

from dataclasses import dataclass
import time
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.engine import Connection

from agentlease import metrics
from agentlease.clock import duration_ms, from_ms, now_param
from agentlease.enums import EventKind, Stage, TaskStatus
from agentlease.errors import LeaseHeldError, LeaseLostError, TaskClosedError, TaskNotFoundError
from agentlease.ledger.database import LedgerDatabase, open_database
from agentlease.ledger.statements import EVENTS, RECEIPTS, TASKS, held, lease_statements
from agentlease.records import (
    Claim,
    LeaseEvent,
    SettlementReceipt,
    StoredReceipt,
    TaskRecord,
    TaskSpec,
    TraceLink,
)

_R = TypeVar("_R")
_T = TASKS.c


@dataclass(frozen=True)
class _Refusal:
    """Why a guarded write touched no row, read back in the same transaction."""

    current_generation: int | None
    status: str | None


class Ledger:
    """Lease operations on the ``tasks``, ``lease_events`` and ``receipts`` tables.

    Each operation is one transaction run by a :class:`LedgerDatabase` (on SQLite, one hop to the
    ledger's thread; see :mod:`agentlease.ledger.database`).

    Args:
        database: from :func:`open_database`; the ledger owns it.
    """

    def __init__(self, database: LedgerDatabase) -> None:
        self._db = database
        self._sql = lease_statements(database.dialect)

    @classmethod
    def from_url(cls, url: str, *, pool_size: int = 10) -> Ledger:
        """Open a ledger on ``sqlite:///PATH`` or ``postgresql://...`` (see :func:`open_database`)."""
        return cls(open_database(url, pool_size=pool_size))

    @property
    def database(self) -> LedgerDatabase:
        """Where the ledger's transactions run (for migrations and the sweeper's queries)."""
        return self._db

    async def close(self) -> None:
        """Close the database's connections (and the SQLite ledger thread)."""
        await self._db.dispose()

    # -- helpers -------------------------------------------------------------------------------

    @property
    def now_expression(self) -> ColumnElement[int]:
        """The current time in statements: the bound ``now_ms`` (:func:`~agentlease.clock.now_param`) or the database clock."""
        return self._sql.now

    def _insert_task(self, conn: Connection, spec: TaskSpec, now: datetime | None) -> None:
        """Create the task row (``pending``) on first sight; an existing row is left as it is."""
        conn.execute(
            self._sql.insert_task,
            {
                "task_id": spec.task_id,
                "agent_run_id": spec.agent_run_id,
                "step_id": spec.step_id,
                "tool": spec.tool,
                "side_effect_class": spec.side_effect_class.value,
                "lease_ttl_ms": duration_ms(spec.lease_ttl),
                "idempotency_key": spec.idempotency_key,
                **now_param(now),
            },
        )

    def _store_receipt(
        self,
        conn: Connection,
        idempotency_key: str,
        task_id: str,
        generation: int,
        receipt_json: dict[str, Any],
        at_ms: int,
    ) -> bool:
        """Store a receipt unless one already stands for the key (the first stands). Returns whether it did."""
        inserted = conn.execute(
            self._sql.insert_receipt,
            {
                "idempotency_key": idempotency_key,
                "task_id": task_id,
                "claim_generation": generation,
                "receipt": receipt_json,
                "created_at_ms": at_ms,
            },
        )
        return inserted.first() is not None

    def _event(
        self,
        conn: Connection,
        *,
        task_id: str,
        kind: EventKind,
        generation: int,
        at_ms: int,
        owner: str | None = None,
        stage: Stage | str | None = None,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        trace: TraceLink | None = None,
    ) -> None:
        """Append one entry to the evidence trail (``lease_events``)."""
        conn.execute(
            self._sql.insert_event,
            {
                "task_id": task_id,
                "kind": kind.value,
                "claim_generation": generation,
                "lease_owner": owner,
                "stage": None if stage is None else str(stage),
                "reason": reason,
                "details": details,
                "at_ms": at_ms,
                **(trace or TraceLink()).columns(),
            },
        )

    def _holder_event(
        self,
        conn: Connection,
        claim: Claim,
        kind: EventKind,
        *,
        at_ms: int,
        stage: Stage | str | None = None,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """An evidence-trail entry written on behalf of the holder of ``claim``."""
        self._event(
            conn,
            task_id=claim.task_id,
            kind=kind,
            generation=claim.generation,
            at_ms=at_ms,
            owner=claim.owner,
            stage=stage,
            reason=reason,
            details=details,
            trace=claim.trace,
        )

    @staticmethod
    def _held(claim: Claim, now: datetime | None) -> dict[str, Any]:
        """Parameters of the guard of every holder write (G2): same owner, same generation, lease valid."""
        return {**held(claim.task_id, claim.owner, claim.generation), **now_param(now)}

    def _refused(
        self,
        conn: Connection,
        claim: Claim,
        *,
        operation: str,
        kind: EventKind,
        now: datetime | None,
        details: dict[str, Any] | None = None,
    ) -> _Refusal:
        row = conn.execute(self._sql.refused, self._held(claim, now)).one()
        refusal = _Refusal(row.claim_generation, row.status)
        self._holder_event(
            conn,
            claim,
            kind,
            at_ms=row.now_ms,
            reason=f"{operation} refused: ledger has generation {refusal.current_generation}, status {refusal.status}",
            details={"operation": operation, **(details or {})},
        )
        return refusal

    @staticmethod
    def _granted(claim: Claim, operation: str, outcome: _R | _Refusal) -> _R:
        """The outcome of a holder write; a refusal (already recorded and committed) raises.

        Raises:
            LeaseLostError: the write was refused (G2).
        """
        if isinstance(outcome, _Refusal):
            raise LeaseLostError(
                claim.task_id,
                claim.generation,
                operation=operation,
                current_generation=outcome.current_generation,
                status=outcome.status,
            )
        return outcome

    # -- claim ---------------------------------------------------------------------------------

    async def claim(
        self, spec: TaskSpec, owner: str, *, trace: TraceLink | None = None, now: datetime | None = None
    ) -> Claim:
        """Claim a task for one attempt, minting the next claim generation (G1, G3).

        The task row is created on first sight from ``spec``. The claim is one conditional UPDATE:
        it succeeds only if the task is pending or released, or running with a lease that has
        lapsed on the ledger's clock; it sets ``claim_generation = claim_generation + 1`` and
        ``attempts = attempts + 1`` in the same statement. No caller chooses a generation.

        Args:
            spec: the task's identity, tool, class, idempotency key and lease TTL.
            owner: the worker identity that will hold the lease.
            trace: the Temporal attempt this claim belongs to.
            now: injected time; default the database's clock.

        Returns:
            The granted :class:`Claim`, with the previous attempt's last durable stage.

        Raises:
            LeaseHeldError: another lease is valid; ``retry_after`` is the time until it lapses.
            TaskClosedError: the task is settled, dead-lettered or cancelled.
        """
        trace = trace or TraceLink()
        key = {"key_task_id": spec.task_id, **now_param(now)}

        def claim_tx(conn: Connection) -> tuple[Claim, str | None]:
            """The claim, and the stage of the lapsed lease it superseded (if any)."""
            self._insert_task(conn, spec, now)
            before = conn.execute(self._sql.current_task, key).one()
            status = TaskStatus(before.status)
            if status.is_terminal or status.awaits_decision:
                raise TaskClosedError(spec.task_id, before.status)
            granted = conn.execute(self._sql.claim, {**key, "lease_owner": owner, **trace.columns()}).first()
            if granted is None:
                # Measured now, not at ``before``: on PostgreSQL that read may have waited for the row lock.
                refused_at_ms = conn.execute(select(self._sql.now), key).scalar_one()
                raise LeaseHeldError(
                    spec.task_id,
                    retry_after=timedelta(milliseconds=max(0, (before.lease_expires_at_ms or 0) - refused_at_ms)),
                    holder=before.lease_owner,
                    generation=before.claim_generation,
                )
            if before.status == TaskStatus.RUNNING.value:
                # The previous holder neither settled nor released: record why its lease ended.
                self._event(
                    conn,
                    task_id=spec.task_id,
                    kind=EventKind.EXPIRED,
                    generation=before.claim_generation,
                    at_ms=granted.lease_acquired_at_ms,
                    owner=before.lease_owner,
                    stage=before.stage,
                    reason=(
                        f"lease lapsed at {from_ms(before.lease_expires_at_ms).isoformat()} without renewal; "
                        f"superseded by generation {granted.claim_generation} ({owner})"
                    ),
                    details={"lease_expires_at_ms": before.lease_expires_at_ms},
                    trace=TraceLink.from_mapping(before._mapping),
                )
            self._event(
                conn,
                task_id=spec.task_id,
                kind=EventKind.CLAIMED,
                generation=granted.claim_generation,
                at_ms=granted.lease_acquired_at_ms,
                owner=owner,
                stage=granted.stage,
                reason=f"attempt {granted.attempts}",
                details={"lease_expires_at_ms": granted.lease_expires_at_ms},
                trace=trace,
            )
            stored = self._receipt(conn, spec.idempotency_key)
            superseded = metrics.stage_label(before.stage) if before.status == TaskStatus.RUNNING.value else None
            claim = Claim(
                task_id=spec.task_id,
                tool=granted.tool,
                generation=granted.claim_generation,
                owner=owner,
                acquired_at=from_ms(granted.lease_acquired_at_ms),
                expires_at=from_ms(granted.lease_expires_at_ms),
                lease_ttl=timedelta(milliseconds=granted.lease_ttl_ms),
                attempts=granted.attempts,
                previous_stage=granted.stage,
                previous_error_class=before.error_class,
                idempotency_key=granted.idempotency_key,
                trace=trace,
                receipt=stored,
            )
            return claim, superseded

        started = time.perf_counter()
        try:
            claim, superseded = await self._db.write(claim_tx)
        except LeaseHeldError:
            metrics.LEASE_CLAIMS.labels(spec.tool, "held").inc()
            raise
        except TaskClosedError:
            metrics.LEASE_CLAIMS.labels(spec.tool, "closed").inc()
            raise
        metrics.LEASE_CLAIMS.labels(claim.tool, "granted").inc()
        metrics.LEASE_ACQUISITION.labels(claim.tool).observe(time.perf_counter() - started)
        if superseded is not None:
            metrics.LEASES_EXPIRED.labels(claim.tool, superseded, "takeover").inc()
        if trace.workflow_id is None:
            metrics.CLAIMS_WITHOUT_TRACE.labels(claim.tool).inc()
        return claim

    # -- holder writes -------------------------------------------------------------------------

    async def renew(
        self, claim: Claim, *, reason: str, stage: Stage | None = None, now: datetime | None = None
    ) -> datetime:
        """Extend the lease by its own TTL, recording the stage first and a specific reason (G2, G5).

        Args:
            claim: the lease held.
            reason: what the holder is doing ("committed draft, verifying readback").
            stage: the stage the holder is entering; ``None`` keeps the current one.
            now: injected time; default the database's clock.

        Returns:
            The new expiry (aware, ledger clock).

        Raises:
            LeaseLostError: the lease lapsed, was superseded, or the task was cancelled or settled.
                A ``lease_lost`` event is recorded before raising.
        """
        params = {**self._held(claim, now), "new_stage": None if stage is None else stage.value}

        def renew_tx(conn: Connection) -> tuple[datetime, str | None] | _Refusal:
            row = conn.execute(self._sql.renew, params).first()
            if row is None:
                return self._refused(
                    conn,
                    claim,
                    operation="renew",
                    kind=EventKind.LEASE_LOST,
                    now=now,
                    details={"stage": None if stage is None else stage.value, "renew_reason": reason},
                )
            self._holder_event(
                conn,
                claim,
                EventKind.RENEWED,
                at_ms=row.updated_at_ms,
                stage=row.stage,
                reason=reason,
                details={"lease_expires_at_ms": row.lease_expires_at_ms},
            )
            expires_at = from_ms(row.lease_expires_at_ms)
            assert expires_at is not None
            return expires_at, row.stage

        outcome = await self._db.write(renew_tx)
        if isinstance(outcome, _Refusal):
            metrics.LEASE_RENEWALS.labels(claim.tool, metrics.stage_label(stage), "lost").inc()
        else:
            metrics.LEASE_RENEWALS.labels(claim.tool, metrics.stage_label(outcome[1]), "renewed").inc()
        return self._granted(claim, "renew", outcome)[0]

    async def settle(
        self,
        claim: Claim,
        receipt: SettlementReceipt,
        *,
        result: dict[str, Any] | None = None,
        now: datetime | None = None,
    ) -> StoredReceipt:
        """Settle the task with a receipt made after readback (G2, G6, G10).

        The receipt is stored once per idempotency key; the first stored receipt stands.

        Args:
            claim: the lease held.
            receipt: the settlement receipt.
            result: the tool's result, kept as evidence if the settle is refused.
            now: injected time; default the database's clock.

        Returns:
            The stored receipt for the task's idempotency key.

        Raises:
            LeaseLostError: the holder no longer holds the lease; the result is recorded as a
                ``late_unapplied`` event and nothing else changes.
        """
        receipt_json = receipt.model_dump(mode="json")
        params = {**self._held(claim, now), "receipt": receipt_json}

        def settle_tx(conn: Connection) -> tuple[StoredReceipt, int] | _Refusal:
            """The stored receipt and the task's renewal count, or the refusal."""
            row = conn.execute(self._sql.settle, params).first()
            if row is None:
                return self._refused(
                    conn,
                    claim,
                    operation="settle",
                    kind=EventKind.LATE_UNAPPLIED,
                    now=now,
                    details={"receipt": receipt_json, "result": result},
                )
            inserted = self._store_receipt(
                conn, claim.idempotency_key, claim.task_id, claim.generation, receipt_json, row.updated_at_ms
            )
            self._holder_event(
                conn,
                claim,
                EventKind.SETTLED,
                at_ms=row.updated_at_ms,
                stage=Stage.SETTLED,
                reason=f"receipt {receipt.external_system}:{receipt.external_id} ({receipt.status})",
                details={"receipt": receipt_json},
            )
            if inserted:
                stored: StoredReceipt | None = StoredReceipt(
                    idempotency_key=claim.idempotency_key,
                    task_id=claim.task_id,
                    claim_generation=claim.generation,
                    receipt=receipt,
                )
            else:
                stored = self._receipt(conn, claim.idempotency_key)  # the first receipt stands
            assert stored is not None
            return stored, row.renewal_count

        outcome = await self._db.write(settle_tx)
        if isinstance(outcome, _Refusal):
            metrics.SETTLEMENTS.labels(claim.tool, EventKind.LATE_UNAPPLIED.value).inc()
        else:
            metrics.SETTLEMENTS.labels(claim.tool, TaskStatus.SETTLED.value).inc()
            metrics.RENEWALS_PER_TASK.labels(claim.tool).observe(outcome[1])
        return self._granted(claim, "settle", outcome)[0]

    async def release(
        self,
        claim: Claim,
        *,
        error_class: str,
        error: str,
        capacity_release: bool = False,
        now: datetime | None = None,
    ) -> None:
        """Give the task back for a retry, recording why (DESIGN.md, "release for retry").

        The last durable stage is kept so the next attempt can read it. ``attempts`` counts real
        attempts only: a release for lack of capacity (``capacity_release=True``, e.g. the worker
        shut down) gives its attempt back in the same statement.

        Args:
            claim: the lease held.
            error_class: a short class name (``retryable``, ``shutdown``...).
            error: one line describing the failure.
            capacity_release: the attempt ended for lack of capacity and does not count against the
                tool's ``max_attempts``. Default false.
            now: injected time; default the database's clock.

        Raises:
            LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
        """
        await self._end_lease(
            claim, "release", TaskStatus.RELEASED, EventKind.RELEASED, error_class, error, now, capacity_release
        )

    async def dead_letter(
        self,
        claim: Claim,
        *,
        error_class: str,
        error: str,
        now: datetime | None = None,
    ) -> None:
        """Move the task out of circulation for inspection (DESIGN.md, "dead-letter").

        Raises:
            LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
        """
        await self._end_lease(
            claim, "dead_letter", TaskStatus.DEAD_LETTERED, EventKind.DEAD_LETTERED, error_class, error, now
        )

    async def await_decision(
        self,
        claim: Claim,
        *,
        status: TaskStatus,
        error_class: str,
        error: str,
        now: datetime | None = None,
    ) -> None:
        """Park the task until a person decides: ``blocked`` or ``needs_reconciliation``.

        No claim is granted while it waits (seed 1, "Recovery needs a policy").

        Raises:
            ValueError: ``status`` is neither ``blocked`` nor ``needs_reconciliation``.
            LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
        """
        if not status.awaits_decision:
            raise ValueError(f"{status.value} is not a status that awaits a decision")
        await self._end_lease(claim, status.value, status, EventKind(status.value), error_class, error, now)

    async def _end_lease(
        self,
        claim: Claim,
        operation: str,
        status: TaskStatus,
        kind: EventKind,
        error_class: str,
        error: str,
        now: datetime | None,
        attempt_returned: bool = False,
    ) -> None:
        params = {
            **self._held(claim, now),
            "status": status.value,
            "error_class": error_class,
            "last_error": error,
            "attempts_returned": int(attempt_returned),
        }

        def end_lease_tx(conn: Connection) -> None | _Refusal:
            row = conn.execute(self._sql.end_lease, params).first()
            if row is None:
                return self._refused(
                    conn,
                    claim,
                    operation=operation,
                    kind=EventKind.LEASE_LOST,
                    now=now,
                    details={"error_class": error_class, "error": error},
                )
            self._holder_event(
                conn, claim, kind, at_ms=row.updated_at_ms, stage=row.stage, reason=f"{error_class}: {error}"
            )
            return None

        self._granted(claim, operation, await self._db.write(end_lease_tx))
        if status is TaskStatus.RELEASED:
            metrics.LEASE_RELEASES.labels(claim.tool, error_class).inc()
        else:
            metrics.TASKS_PARKED.labels(claim.tool, status.value).inc()

    # -- operator writes -----------------------------------------------------------------------

    async def transition(
        self,
        task_id: str,
        *,
        allowed: frozenset[TaskStatus] | set[TaskStatus],
        to: TaskStatus,
        kind: EventKind,
        by: str,
        reason: str,
        values: dict[str, Any] | None = None,
        details: dict[str, Any] | None = None,
        receipt: SettlementReceipt | None = None,
        spec: TaskSpec | None = None,
        now: datetime | None = None,
    ) -> TaskRecord:
        """An operator's decision: move a task from one of ``allowed`` to ``to``, ending any claim.

        One conditional UPDATE (row count checked) plus an evidence entry naming who decided and
        why. With ``receipt`` the task is settled by the decision and the receipt stored once per
        idempotency key. With ``spec`` a task the ledger has not seen yet is created first.

        Args:
            task_id: the task.
            allowed: the statuses the decision applies to.
            to: the new status.
            kind: the evidence-trail entry.
            by / reason: who decided, and why.
            values: further column values (``attempts=0`` for a redrive...).
            details: facts for the evidence trail.
            receipt: the settlement receipt of a ``confirm``.
            spec: the task's identity, to create it if absent.
            now: injected time; default the database's clock.

        Returns:
            The task after the decision.

        Raises:
            TaskNotFoundError: unknown task (and no ``spec``).
            TaskClosedError: the task is not in one of ``allowed``; nothing changed.
        """
        receipt_json = None if receipt is None else receipt.model_dump(mode="json")
        decision = (
            update(TASKS)
            .where(_T.task_id == task_id, _T.status.in_([s.value for s in allowed]))
            .values(
                status=to.value,
                lease_owner=None,
                lease_expires_at_ms=None,
                updated_at_ms=self._sql.now,
                **({"receipt": receipt_json, "stage": Stage.SETTLED.value} if receipt_json else {}),
                **(values or {}),
            )
            .returning(*TASKS.c)
        )

        def transition_tx(conn: Connection) -> TaskRecord:
            if spec is not None:
                self._insert_task(conn, spec, now)
            row = conn.execute(decision, now_param(now)).first()
            if row is None:
                current = self._task(conn, task_id)
                raise TaskClosedError(task_id, current.status)
            if receipt_json is not None:
                self._store_receipt(
                    conn, row.idempotency_key, task_id, row.claim_generation, receipt_json, row.updated_at_ms
                )
            self._event(
                conn,
                task_id=task_id,
                kind=kind,
                generation=row.claim_generation,
                at_ms=row.updated_at_ms,
                stage=row.stage,
                reason=reason,
                details={"by": by, **(details or {})},
            )
            return TaskRecord.from_row(row)

        return await self._db.write(transition_tx)

    async def cancel(
        self, task_id: str, *, by: str, reason: str, spec: TaskSpec | None = None, now: datetime | None = None
    ) -> TaskRecord:
        """Cancel a task: end any claim so its generation can no longer renew or settle (G8).

        Cancelled stays cancelled: no claim, renewal, settle or expiry moves it again.

        Raises:
            TaskNotFoundError: unknown task (and no ``spec`` to create it).
            TaskClosedError: the task is already settled, cancelled, rejected or abandoned.
        """
        return await self.transition(
            task_id,
            allowed={s for s in TaskStatus if not s.is_terminal},
            to=TaskStatus.CANCELLED,
            kind=EventKind.CANCELLED,
            by=by,
            reason=reason,
            spec=spec,
            now=now,
        )

    # -- reads ---------------------------------------------------------------------------------

    def _task(self, conn: Connection, task_id: str) -> TaskRecord:
        row = conn.execute(select(TASKS).where(_T.task_id == task_id)).first()
        if row is None:
            raise TaskNotFoundError(task_id)
        return TaskRecord.from_row(row)

    def _receipt(self, conn: Connection, idempotency_key: str) -> StoredReceipt | None:
        row = conn.execute(self._sql.select_receipt, {"key_idempotency_key": idempotency_key}).first()
        if row is None:
            return None
        return StoredReceipt(
            idempotency_key=row.idempotency_key,
            task_id=row.task_id,
            claim_generation=row.claim_generation,
            receipt=row.receipt,
        )

    async def get_task(self, task_id: str) -> TaskRecord:
        """The task's current record. Raises :class:`TaskNotFoundError`."""
        return await self._db.read(lambda conn: self._task(conn, task_id))

    async def list_tasks(self, agent_run_id: str | None = None) -> list[TaskRecord]:
        """Tasks, oldest first, optionally of one agent run."""
        query = select(TASKS).order_by(_T.created_at_ms, _T.task_id)
        if agent_run_id is not None:
            query = query.where(_T.agent_run_id == agent_run_id)
        return await self._db.read(lambda conn: [TaskRecord.from_row(row) for row in conn.execute(query)])

    async def events(self, task_id: str | None = None, *, agent_run_id: str | None = None) -> list[LeaseEvent]:
        """The evidence trail in order, for one task or one agent run (or all)."""
        ev = EVENTS.c
        query = select(EVENTS).order_by(ev.event_id)
        if task_id is not None:
            query = query.where(ev.task_id == task_id)
        if agent_run_id is not None:
            query = query.where(ev.task_id.in_(select(_T.task_id).where(_T.agent_run_id == agent_run_id)))
        return await self._db.read(lambda conn: [LeaseEvent.from_row(row) for row in conn.execute(query)])

    def receipt_keys(self, conn: Connection, keys: set[str]) -> set[str]:
        """Which of ``keys`` have a stored settlement receipt (within ``conn``'s transaction)."""
        key = RECEIPTS.c.idempotency_key
        rows = conn.execute(select(key).where(key.in_(sorted(keys))))
        return {row.idempotency_key for row in rows}

    async def receipt(self, idempotency_key: str) -> StoredReceipt | None:
        """The stored settlement receipt for an idempotency key, if any."""
        return await self._db.read(lambda conn: self._receipt(conn, idempotency_key))

    async def db_now(self) -> datetime:
        """The ledger database's current time (aware)."""
        value = await self._db.read(lambda conn: conn.execute(select(self._sql.now), now_param(None)).scalar_one())
        result = from_ms(value)
        assert result is not None
        return result
