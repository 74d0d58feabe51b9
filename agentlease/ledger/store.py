"""The lease ledger: every lease write is one conditional statement judged on the database's clock.

Guarantees held here (``docs/guarantees.md``): G1 at most one valid lease per task; G2 a lapsed or
superseded holder cannot renew, settle, release or dead-letter (zero rows affected raises
:class:`LeaseLostError`); G3 generations are minted only inside the claim statement; G6 the
recorded stage never goes back and a receipt, once stored, stands; G8 a decision (cancel among
them) ends any claim in the same statement; G10 a refused settle is recorded as ``late_unapplied``
evidence.

Every method takes an optional ``now`` (aware datetime) for tests; otherwise the database's clock
decides.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from pydantic import SecretStr
from sqlalchemy import ColumnElement
from sqlalchemy.engine import Connection

from agentlease.clock import duration_ms, from_ms, now_param
from agentlease.decisions import DECISIONS
from agentlease.enums import DecisionKind, ErrorClass, EventKind, Stage, TaskStatus
from agentlease.errors import (
    ApprovalRefusedError,
    LeaseHeldError,
    LeaseLostError,
    LeaseTokenMismatchError,
    LedgerUnavailableError,
    TaskClosedError,
    TaskMovedError,
    TaskNotFoundError,
)
from agentlease.ledger.approvals import approval_refusal, approval_remaining, consumed_now, refuse_approval
from agentlease.ledger.compiled import execute
from agentlease.ledger.database import LedgerDatabase, Transaction, open_database
from agentlease.ledger.engine import PG_POOL_SIZE
from agentlease.ledger.listing import TaskFilter, collect, event_pages, holder_stage, task_pages
from agentlease.ledger.outages import check_claim_clock, own_lease_end, own_settle
from agentlease.ledger.statements import LeaseStatements, event_params, held, lease_statements, token_sha256
from agentlease.ledger.trail import write_event, write_holder_event
from agentlease.metrics import LEASE_METRICS, LeaseMetrics
from agentlease.records import (
    Claim,
    LeaseEvent,
    SettlementReceipt,
    StoredReceipt,
    TaskRecord,
    TaskSpec,
    TraceLink,
)
from agentlease.redaction import redact
from agentlease.tracing import annotate_stage, current_trace_id, traced

_R = TypeVar("_R")


@dataclass(frozen=True)
class _Stored:
    """A stored receipt and what it was made for."""

    receipt: StoredReceipt
    tool: str | None
    arguments_sha256: str | None


@dataclass(frozen=True)
class _Refusal:
    """Why a guarded write touched no row, read back in the same transaction."""

    current_generation: int | None
    status: str | None
    token_refused: bool = False
    """Owner and generation were the ledger's, the lease token was not (a rebuilt claim)."""


LEASE_TOKEN_BYTES = 32
"""Random bytes of a lease token (``secrets.token_urlsafe``): 43 URL-safe characters."""


def receipt_mismatch(spec: TaskSpec, tool: str | None, arguments_sha256: str | None) -> str | None:
    """Why a receipt stored for ``spec``'s key (made by ``tool`` with those arguments) does not settle it.

    ``None`` when it does: the same tool, and the same argument fingerprint where both are known.
    """
    if tool is not None and tool != spec.tool:
        return (
            f"idempotency key {spec.idempotency_key!r} already has a settlement receipt of tool {tool!r}, "
            f"not {spec.tool!r}: a key reused for another action is refused (HTTP 422 in Stripe's terms)"
        )
    if arguments_sha256 is not None and spec.arguments_sha256 is not None and arguments_sha256 != spec.arguments_sha256:
        return (
            f"idempotency key {spec.idempotency_key!r} already has a settlement receipt of {spec.tool!r} "
            "with other arguments: a key reused for another action is refused (HTTP 422 in Stripe's terms)"
        )
    return None


class Ledger:
    """Lease operations on the ``tasks``, ``lease_events`` and ``receipts`` tables.

    Each operation is one transaction run by a :class:`LedgerDatabase` (on SQLite, one hop to the
    ledger's thread; see :mod:`agentlease.ledger.database`).

    Args:
        database: from :func:`open_database`; the ledger owns it.
        metrics: where each operation reports; default the process's lease metrics.
    """

    def __init__(self, database: LedgerDatabase, *, metrics: LeaseMetrics = LEASE_METRICS) -> None:
        self._db = database
        self._sql = lease_statements(database.dialect)
        self._metrics = metrics

    @classmethod
    def from_url(cls, url: str, *, pool_size: int = PG_POOL_SIZE, metrics: LeaseMetrics = LEASE_METRICS) -> Ledger:
        """Open a ledger on ``sqlite:///PATH`` or ``postgresql://...`` (see :func:`open_database`)."""
        return cls(open_database(url, pool_size=pool_size), metrics=metrics)

    @property
    def metrics(self) -> LeaseMetrics:
        """Where this ledger's operations report (the sweeper's expiries report there too)."""
        return self._metrics

    @property
    def statements(self) -> LeaseStatements:
        """The prebuilt statements of this ledger's dialect."""
        return self._sql

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
        """The current time in statements: the bound ``now_ms`` (see :func:`~agentlease.clock.now_param`),
        or the database clock."""
        return self._sql.now

    @staticmethod
    def task_values(spec: TaskSpec, now: datetime | None) -> dict[str, Any]:
        """The parameters of :attr:`LeaseStatements.insert_task` for ``spec``."""
        return Ledger._task_values(spec, now)

    @staticmethod
    def _task_values(spec: TaskSpec, now: datetime | None) -> dict[str, Any]:
        return {
            "task_id": spec.task_id,
            "agent_run_id": spec.agent_run_id,
            "step_id": spec.step_id,
            "tool": spec.tool,
            "side_effect_class": spec.side_effect_class.value,
            "lease_ttl_ms": duration_ms(spec.lease_ttl),
            "idempotency_key": spec.idempotency_key,
            "arguments_sha256": spec.arguments_sha256,
            **now_param(now),
        }

    def _insert_task(self, conn: Connection, spec: TaskSpec, now: datetime | None) -> None:
        """Create the task row (``pending``) on first sight; an existing row is left as it is."""
        conn.execute(self._sql.insert_task, self._task_values(spec, now))

    def _store_receipt(
        self,
        conn: Connection,
        idempotency_key: str,
        task_id: str,
        generation: int,
        receipt_json: dict[str, Any],
        at_ms: int,
        tool: str | None = None,
        arguments_sha256: str | None = None,
    ) -> bool:
        """Store a receipt unless one already stands for the key (the first stands). Returns whether it did."""
        inserted = execute(
            conn,
            self._sql.insert_receipt,
            {
                "idempotency_key": idempotency_key,
                "task_id": task_id,
                "claim_generation": generation,
                "receipt": receipt_json,
                "created_at_ms": at_ms,
                "tool": tool,
                "arguments_sha256": arguments_sha256,
            },
        )
        return bool(inserted)

    @staticmethod
    def _held(claim: Claim, now: datetime | None) -> dict[str, Any]:
        """Parameters of the guard of every holder write (G2): same owner, same generation, the lease
        token minted with it, lease valid."""
        token = token_sha256(claim.lease_token.get_secret_value())
        return {**held(claim.task_id, claim.owner, claim.generation, token), **now_param(now)}

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
        guard = self._held(claim, now)
        row = conn.execute(self._sql.refused, guard).one()
        token_refused = (row.claim_generation, row.lease_owner) == (claim.generation, claim.owner) and (
            row.lease_token_sha256 != guard["held_token_sha256"]
        )
        refusal = _Refusal(row.claim_generation, row.status, token_refused)
        reason = f"{operation} refused: ledger has generation {refusal.current_generation}, status {refusal.status}"
        if token_refused:
            reason = (
                f"{operation} refused: the claim of generation {claim.generation} did not present the lease token "
                "the ledger minted with it (a claim rebuilt from listings or the trail cannot write)"
            )
        write_holder_event(
            conn,
            self._sql,
            claim,
            kind,
            at_ms=row.now_ms,
            reason=reason,
            details={
                "operation": operation,
                **({"lease_token": "refused"} if token_refused else {}),
                **(details or {}),
            },
        )
        return refusal

    @staticmethod
    def _granted(claim: Claim, operation: str, outcome: _R | _Refusal) -> _R:
        """The outcome of a holder write; a refusal (already recorded and committed) raises.

        Raises:
            LeaseLostError: the write was refused (G2).
        """
        if isinstance(outcome, _Refusal) and outcome.token_refused:
            raise LeaseTokenMismatchError(claim.task_id, claim.generation, operation=operation, status=outcome.status)
        if isinstance(outcome, _Refusal):
            raise LeaseLostError(
                claim.task_id,
                claim.generation,
                operation=operation,
                current_generation=outcome.current_generation,
                status=outcome.status,
            )
        return outcome

    async def _write(self, operation: str, tool: str, transaction: Transaction[_R], *, one: bool = False) -> _R:
        """One write transaction; an outage is counted (``agentlease_ledger_unavailable_total``) and raised.

        ``one``: the transaction's change is one statement (:meth:`LedgerDatabase.write_one`).

        Raises:
            LedgerUnavailableError: the database could not be reached; the write may or may not have
                committed (settle and lease ends retried after one recognise their own write).
        """
        try:
            return await (self._db.write_one if one else self._db.write)(transaction)
        except LedgerUnavailableError:
            self._metrics.ledger_unavailable(tool, operation)
            raise

    async def _write_statement(self, operation: str, tool: str, statement: Any, params: dict[str, Any]) -> list[Any]:
        """One prebuilt statement alone (:meth:`LedgerDatabase.write_statement`): its rows; an outage is
        counted and raised as by :meth:`_write`."""
        try:
            return await self._db.write_statement(statement, params)
        except LedgerUnavailableError:
            self._metrics.ledger_unavailable(tool, operation)
            raise

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
        trace = trace or TraceLink()
        key = {"key_task_id": spec.task_id, **now_param(now)}
        lease_token = secrets.token_urlsafe(LEASE_TOKEN_BYTES)
        minted = {"lease_owner": owner, "lease_token_sha256": token_sha256(lease_token), **trace.columns()}
        fresh = {**self._task_values(spec, now), **minted}
        gated = spec.approval_ttl is not None  # the claim must consume an approval (and never inserts the task)
        # Temporal's heartbeat timeout, changed below the lease TTL: the lease follows the shorter.
        shorter = heartbeat_timeout is not None and heartbeat_timeout < spec.lease_ttl
        claim_ttl = {"lease_ttl_override_ms": duration_ms(heartbeat_timeout) if shorter and heartbeat_timeout else None}
        approval = {
            "claim_needs_approval": gated,
            "claim_tool": spec.tool,
            "claim_arguments_sha256": spec.arguments_sha256,
            "claim_approval_ttl_ms": duration_ms(spec.approval_ttl) if spec.approval_ttl is not None else 0,
        }

        def granted_claim(granted: Any, previous_error_class: str | None, stored: _Stored | None) -> Claim:
            refused = None if stored is None else receipt_mismatch(spec, stored.tool, stored.arguments_sha256)
            return Claim(
                task_id=spec.task_id,
                tool=granted.tool,
                generation=granted.claim_generation,
                owner=owner,
                acquired_at=from_ms(granted.lease_acquired_at_ms),
                expires_at=from_ms(granted.lease_expires_at_ms),
                lease_ttl=timedelta(milliseconds=granted.lease_ttl_ms),
                attempts=granted.attempts,
                previous_stage=granted.stage,
                previous_error_class=previous_error_class,
                idempotency_key=granted.idempotency_key,
                trace=trace,
                receipt=None if stored is None or refused is not None else stored.receipt,
                receipt_refused=refused,
                lease_token=SecretStr(lease_token),
                approval_remaining=approval_remaining(granted, spec),
            )

        def claimed_note(attempts: int, lease_ttl_ms: int, consumed: Any = None) -> tuple[str, dict[str, Any]]:
            """The ``claimed`` entry's reason and details: the attempt, the approval it consumed (the row
            before the claim: ``consumed``), and a heartbeat timeout that is not the lease's TTL."""
            reason = f"attempt {attempts}"
            details: dict[str, Any] = {}
            if consumed is not None:
                reason += f"; consumed the approval given at {from_ms(consumed.approved_at_ms).isoformat()}"
                details["approval"] = {
                    "approved_at_ms": consumed.approved_at_ms,
                    "arguments_sha256": consumed.approval_arguments_sha256,
                }
            elif gated:
                details["approval"] = {"consumed_by_generation": None}
            if heartbeat_timeout is None or duration_ms(heartbeat_timeout) == lease_ttl_ms:
                return reason, details
            follows = (
                "the lease follows the shorter heartbeat timeout"
                if duration_ms(heartbeat_timeout) < lease_ttl_ms
                else "the lease keeps its TTL"
            )
            reason += (
                f"; Temporal's heartbeat timeout ({heartbeat_timeout.total_seconds():g}s) is not the lease "
                f"TTL ({lease_ttl_ms / 1000:g}s): {follows}"
            )
            return reason, {
                **details,
                "heartbeat_timeout_ms": duration_ms(heartbeat_timeout),
                "lease_ttl_ms": lease_ttl_ms,
            }

        def claimed_event(conn: Connection, granted: Any, before: Any = None) -> None:
            consumed = before if before is not None and consumed_now(before, granted) else None
            reason, details = claimed_note(granted.attempts, granted.lease_ttl_ms, consumed)
            if gated and consumed is None and granted.approval_consumed_generation is not None:
                details["approval"] = {"consumed_by_generation": granted.approval_consumed_generation}
                reason += (
                    f"; the approval was consumed by generation {granted.approval_consumed_generation}: "
                    "this attempt follows the recovery policy"
                )
            write_event(
                conn,
                self._sql,
                task_id=spec.task_id,
                kind=EventKind.CLAIMED,
                generation=granted.claim_generation,
                at_ms=granted.lease_acquired_at_ms,
                owner=owner,
                stage=granted.stage,
                reason=reason,
                details={"lease_expires_at_ms": granted.lease_expires_at_ms, **details},
                trace=trace,
            )

        async def first_claim() -> Claim | None:
            """PostgreSQL: a task the ledger has not seen, claimed with its evidence in one statement."""
            assert self._sql.claim_new_evidenced is not None
            params = {**fresh, **event_params(*claimed_note(1, fresh["lease_ttl_ms"]), trace)}
            rows = await self._write_statement("claim", spec.tool, self._sql.claim_new_evidenced, params)
            if not rows:
                return None  # the task exists: claimed by the conditional UPDATE below
            granted = rows[0]
            stored = None
            if granted.receipt_task_id is not None:
                receipt = StoredReceipt(
                    idempotency_key=granted.idempotency_key,
                    task_id=granted.receipt_task_id,
                    claim_generation=granted.receipt_generation,
                    receipt=granted.stored_receipt,
                )
                stored = _Stored(receipt, granted.receipt_tool, granted.receipt_arguments_sha256)
            return granted_claim(granted, None, stored)

        def claim_tx(conn: Connection) -> tuple[Claim, bool, str | None] | ApprovalRefusedError:
            """The claim, whether it superseded a lapsed lease, and that lease's stage; or the approval
            refusal it recorded (raised once the transaction committed)."""
            check_claim_clock(conn, self._sql, self._db.dialect, spec.task_id, now)
            if self._sql.claim_new_evidenced is None and not gated:
                created = execute(conn, self._sql.claim_new, fresh)
                if created:  # a task the ledger had not seen: created claimed (generation 1)
                    granted = created[0]
                    claimed_event(conn, granted)
                    return granted_claim(granted, None, self._stored(conn, spec.idempotency_key)), False, None
            if gated:
                self._insert_task(conn, spec, now)  # an approval-gated task is claimed only once approved
            before = conn.execute(self._sql.current_task, key).one()
            status = TaskStatus(before.status)
            if status.is_terminal or status.awaits_decision:
                raise TaskClosedError(spec.task_id, before.status)
            granted = conn.execute(self._sql.claim, {**key, **minted, **approval, **claim_ttl}).first()
            if granted is None:
                # Measured now, not at ``before``: on PostgreSQL that read may have waited for the row lock.
                refused_at_ms = conn.execute(self._sql.select_now, key).scalar_one()
                refusal = approval_refusal(before, spec, refused_at_ms) if gated else None
                if refusal is not None:
                    return refuse_approval(conn, self._sql, spec, before, refusal, now)
                raise LeaseHeldError(
                    spec.task_id,
                    retry_after=timedelta(milliseconds=max(0, (before.lease_expires_at_ms or 0) - refused_at_ms)),
                    holder=before.lease_owner,
                    generation=before.claim_generation,
                )
            superseded = before.status == TaskStatus.RUNNING.value
            if superseded:
                # The previous holder neither settled nor released: record why its lease ended.
                write_event(
                    conn,
                    self._sql,
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
                    details={"lease_expires_at_ms": before.lease_expires_at_ms, "by": "takeover"},
                    trace=TraceLink.from_mapping(before._mapping),
                )
            claimed_event(conn, granted, before)
            stored = self._stored(conn, spec.idempotency_key)
            return granted_claim(granted, before.error_class, stored), superseded, before.stage

        async def claim_once() -> tuple[Claim, bool, str | None]:
            if self._sql.claim_new_evidenced is not None and not gated:
                first = await first_claim()
                if first is not None:
                    return first, False, None
            outcome = await self._write("claim", spec.tool, claim_tx)
            if isinstance(outcome, ApprovalRefusedError):
                raise outcome
            return outcome

        started = time.perf_counter()
        try:
            claim, superseded, superseded_stage = await claim_once()
        except ApprovalRefusedError as exc:
            self._metrics.claim(spec.tool, "closed")
            self._metrics.approval(spec.tool, exc.outcome)
            raise
        except LeaseHeldError:
            self._metrics.claim(spec.tool, "held")
            raise
        except TaskClosedError:
            self._metrics.claim(spec.tool, "closed")
            raise
        self._metrics.claim(
            claim.tool,
            "granted",
            seconds=time.perf_counter() - started,
            superseded=superseded,
            superseded_stage=superseded_stage,
            traced=trace.workflow_id is not None,
        )
        if claim.approval_remaining is not None:
            self._metrics.approval(claim.tool, "consumed", remaining_s=claim.approval_remaining.total_seconds())
        return claim

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
        if stage is Stage.SETTLED:
            raise ValueError("a renewal does not enter 'settled'; settle with a receipt")
        if not reason.strip():
            raise ValueError("a renewal needs a specific reason")
        reason = redact(reason)
        details = redact(details) or {}
        shorter = ttl is not None and ttl < claim.lease_ttl
        params = {
            **self._held(claim, now),
            "new_stage": None if stage is None else stage.value,
            "lease_ttl_override_ms": duration_ms(ttl) if shorter and ttl is not None else None,
        }

        evidenced = self._sql.renew_evidenced
        if evidenced is not None:
            params.update(event_params(reason, details, claim.trace))

        def renew_refused(conn: Connection) -> _Refusal:
            held_in.append(stage.value if stage else holder_stage(conn, claim.task_id, claim.generation))
            return self._refused(
                conn,
                claim,
                operation="renew",
                kind=EventKind.LEASE_LOST,
                now=now,
                details={"stage": None if stage is None else stage.value, "renew_reason": reason},
            )

        def renew_tx(conn: Connection) -> tuple[datetime, str | None] | _Refusal:
            rows = execute(conn, self._sql.renew, params)
            row = rows[0] if rows else None
            if row is None:
                return renew_refused(conn)
            if evidenced is None:
                write_holder_event(
                    conn,
                    self._sql,
                    claim,
                    EventKind.RENEWED,
                    at_ms=row.updated_at_ms,
                    stage=row.stage,
                    reason=reason,
                    details={**details, "lease_expires_at_ms": row.lease_expires_at_ms},
                )
            expires_at = from_ms(row.lease_expires_at_ms)
            assert expires_at is not None
            return expires_at, row.stage

        held_in: list[str | None] = []  # a refused renewal: the stage its holder was in (its generation's last)
        outcome: tuple[datetime, str | None] | _Refusal
        if evidenced is None:
            outcome = await self._write("renew", claim.tool, renew_tx, one=True)
        else:  # PostgreSQL: the renewal and its entry are one statement; a refusal is recorded after it
            rows = await self._write_statement("renew", claim.tool, evidenced, params)
            if rows:
                expires_at = from_ms(rows[0].lease_expires_at_ms)
                assert expires_at is not None
                outcome = expires_at, rows[0].stage
            else:
                outcome = await self._write("renew", claim.tool, renew_refused, one=True)
        lost = isinstance(outcome, _Refusal)
        shown = held_in[-1] if lost and held_in else None if lost else outcome[1]  # type: ignore[index]
        annotate_stage(shown)
        self._metrics.renewal(claim.tool, shown, renewed=not lost)
        return self._granted(claim, "renew", outcome)[0]

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
        receipt, receipt_json = _redacted(receipt)  # docs/security.md, "Retention and redaction"
        result = redact(result)
        params = {**self._held(claim, now), "receipt": receipt_json}

        reason = f"receipt {receipt.external_system}:{receipt.external_id} ({receipt.status})"
        event_details: dict[str, Any] = {"receipt": receipt_json}
        if reconciled is not None:  # automatic reconciliation: no person involved
            reason = f"reconciled by the probe, no person involved: {reason}"
            event_details.update(reconciled_by="probe", evidence=redact(reconciled))
        evidenced = self._sql.settle_evidenced

        def ours() -> StoredReceipt:
            return StoredReceipt(
                idempotency_key=claim.idempotency_key,
                task_id=claim.task_id,
                claim_generation=claim.generation,
                receipt=receipt,
            )

        async def settle_evidenced() -> tuple[StoredReceipt, int] | _Refusal:
            """PostgreSQL: the settle, the receipt that stands and the entry in one statement."""
            assert evidenced is not None
            event = event_params(reason, event_details, claim.trace)
            rows = await self._write_statement("settle", claim.tool, evidenced, {**params, **event})
            if not rows:
                return await self._write("settle", claim.tool, refused, one=True)
            row = rows[0]
            if (row.receipt_task_id, row.receipt_generation) == (claim.task_id, claim.generation):
                return ours(), row.renewal_count  # the receipt stored is this one
            stored = StoredReceipt(
                idempotency_key=claim.idempotency_key,
                task_id=row.receipt_task_id,
                claim_generation=row.receipt_generation,
                receipt=row.stored_receipt,
            )
            return stored, row.renewal_count

        def refused(conn: Connection) -> tuple[StoredReceipt, int] | _Refusal:
            stored_now = self._receipt(conn, claim.idempotency_key) if retried else None
            own = own_settle(conn, self._sql, claim, receipt_json, stored_now)
            if own is not None:  # the first try committed, its answer lost in the outage
                return own
            return self._refused(
                conn,
                claim,
                operation="settle",
                kind=EventKind.LATE_UNAPPLIED,
                now=now,
                details={"receipt": receipt_json, "result": result},
            )

        def settle_tx(conn: Connection) -> tuple[StoredReceipt, int] | _Refusal:
            """The stored receipt and the task's renewal count, or the refusal."""
            rows = execute(conn, self._sql.settle, params)
            if not rows:
                return refused(conn)
            row = rows[0]
            inserted = self._store_receipt(
                conn,
                claim.idempotency_key,
                claim.task_id,
                claim.generation,
                receipt_json,
                row.updated_at_ms,
                row.tool,
                row.arguments_sha256,
            )
            write_holder_event(
                conn,
                self._sql,
                claim,
                EventKind.SETTLED,
                at_ms=row.updated_at_ms,
                stage=Stage.SETTLED,
                reason=reason,
                details=event_details,
            )
            if inserted:
                return ours(), row.renewal_count
            # The first receipt stored for the key stands; the task shows that one too.
            stored = self._receipt(conn, claim.idempotency_key)
            assert stored is not None
            conn.execute(
                self._sql.set_receipt,
                {"key_task_id": claim.task_id, "receipt": stored.receipt.model_dump(mode="json")},
            )
            assert stored is not None
            return stored, row.renewal_count

        if evidenced is None:
            outcome = await self._write("settle", claim.tool, settle_tx)
        else:
            outcome = await settle_evidenced()
        settled = not isinstance(outcome, _Refusal)
        self._metrics.settle(claim.tool, settled=settled, renewals=outcome[1] if settled else None)  # type: ignore[index]
        return self._granted(claim, "settle", outcome)[0]

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
        await self._end_lease(claim, "release", TaskStatus.RELEASED, error_class, error, now, details, retried)

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
        await self._end_lease(claim, "dead_letter", TaskStatus.DEAD_LETTERED, error_class, error, now)

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
        await self._end_lease(claim, status.value, status, error_class, error, now, retried=retried)

    async def _end_lease(
        self,
        claim: Claim,
        operation: str,
        status: TaskStatus,
        error_class: ErrorClass | str,
        error: str,
        now: datetime | None,
        details: dict[str, Any] | None = None,
        retried: bool = False,
    ) -> None:
        known = ErrorClass(error_class)  # a known class only: the next attempt's policy reads it
        error, details = redact(error), redact(details)
        params = {
            **self._held(claim, now),
            "status": status.value,
            "error_class": known.value,
            "last_error": error,
            "attempts_returned": int(not known.counts_as_attempt),
        }
        kind = EventKind(status.value)

        def end_lease_tx(conn: Connection) -> _Refusal | str | None:
            """The refusal, or the stage the ledger keeps (``None``: a retried end found its own write)."""
            rows = execute(conn, self._sql.end_lease, params)
            row = rows[0] if rows else None
            if row is None:
                if retried and own_lease_end(conn, self._sql, claim, status, known, error):
                    return None  # the first try committed, its answer lost in the outage
                return self._refused(
                    conn,
                    claim,
                    operation=operation,
                    kind=EventKind.LEASE_LOST,
                    now=now,
                    details={"error_class": known.value, "error": error},
                )
            write_holder_event(
                conn,
                self._sql,
                claim,
                kind,
                at_ms=row.updated_at_ms,
                stage=row.stage,
                reason=f"{known.value}: {error}",
                details=details,
            )
            return row.stage

        annotate_stage(self._granted(claim, operation, await self._write(operation, claim.tool, end_lease_tx)))
        self._metrics.lease_end(claim.tool, status, known)

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
        """Apply a decision of the decision table (:data:`~agentlease.decisions.DECISIONS`), ending any claim.

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
        rule = DECISIONS[kind]
        if rule.settles != (receipt is not None):
            raise ValueError(f"{kind.value} {'needs' if rule.settles else 'takes no'} settlement receipt")
        reason, details = redact(reason), redact(details)
        receipt = None if receipt is None else _redacted_receipt(receipt)
        receipt_json = None if receipt is None else receipt.model_dump(mode="json")
        params = {"key_task_id": task_id, **now_param(now), **({"receipt": receipt_json} if receipt_json else {})}
        if kind is DecisionKind.APPROVE:  # the approval of this tool and these arguments (docs/recovery.md)
            params["approval_tool"] = spec.tool if spec is not None else None
            params["approval_arguments_sha256"] = spec.arguments_sha256 if spec is not None else None
        trace = TraceLink(trace_id=current_trace_id())  # the decision's own trace, while tracing is on

        def decide_tx(conn: Connection) -> TaskRecord:
            if spec is not None:
                self._insert_task(conn, spec, now)
            if expected_generation is not None:  # under the row's lock: no claim moves it before the decision
                current = conn.execute(self._sql.select_task.with_for_update(), {"key_task_id": task_id}).first()
                if current is not None and current.claim_generation != expected_generation:
                    raise TaskMovedError(task_id, expected_generation, current.claim_generation)
            row = conn.execute(self._sql.decisions[kind], params).first()
            if row is None:
                raise TaskClosedError(task_id, self._task(conn, task_id).status)
            if receipt_json is not None:
                self._store_receipt(
                    conn,
                    row.idempotency_key,
                    task_id,
                    row.claim_generation,
                    receipt_json,
                    row.updated_at_ms,
                    row.tool,
                    row.arguments_sha256,
                )
            facts = {"by": by, "decision": kind.value, **(details or {})}
            if rule.to_if_effect_unknown is not None and row.status == rule.to_if_effect_unknown.value:
                facts["effect"] = "unknown"  # only a person can say whether the side effect happened
            write_event(
                conn,
                self._sql,
                task_id=task_id,
                kind=rule.event,
                generation=row.claim_generation,
                at_ms=row.updated_at_ms,
                stage=row.stage,
                reason=reason,
                details=facts,
                trace=trace,
            )
            return TaskRecord.from_row(row)

        record = await self._write("decide", spec.tool if spec is not None else "", decide_tx)
        resolved = _RESOLVED_BY_PERSON.get(kind)
        if resolved is not None:
            self._metrics.ambiguity_resolved(record.tool, "person", resolved)
        return record

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

        def refuse_tx(conn: Connection) -> None:
            self._insert_task(conn, spec, now)
            task = self._task(conn, spec.task_id)
            write_event(
                conn,
                self._sql,
                task_id=spec.task_id,
                kind=EventKind.DECISION_REFUSED,
                generation=task.claim_generation,
                at_ms=conn.execute(self._sql.select_now, now_param(now)).scalar_one(),
                stage=task.stage,
                reason=refusal,
                details={"by": by, "decision": decision, "via": "signal"},
            )

        await self._write("record_refusal", spec.tool, refuse_tx)

    # -- reads ---------------------------------------------------------------------------------

    def _task(self, conn: Connection, task_id: str) -> TaskRecord:
        row = conn.execute(self._sql.select_task, {"key_task_id": task_id}).first()
        if row is None:
            raise TaskNotFoundError(task_id)
        return TaskRecord.from_row(row)

    def _stored(self, conn: Connection, idempotency_key: str) -> _Stored | None:
        """The receipt stored for the key with what it was made for (tool, argument fingerprint)."""
        rows = execute(conn, self._sql.select_receipt, {"key_idempotency_key": idempotency_key})
        if not rows:
            return None
        row = rows[0]
        receipt = StoredReceipt(
            idempotency_key=row.idempotency_key,
            task_id=row.task_id,
            claim_generation=row.claim_generation,
            receipt=row.receipt,
        )
        return _Stored(receipt, row.tool, row.arguments_sha256)

    def _receipt(self, conn: Connection, idempotency_key: str) -> StoredReceipt | None:
        rows = execute(conn, self._sql.select_receipt, {"key_idempotency_key": idempotency_key})
        if not rows:
            return None
        row = rows[0]
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
        """Tasks, oldest first, optionally of one agent run, in one list.

        Read in keyset pages (:mod:`agentlease.ledger.listing`, which streams them for listings
        of any size).
        """
        return await collect(task_pages(self._db, TaskFilter(agent_run_id=agent_run_id)))

    async def events(self, task_id: str | None = None, *, agent_run_id: str | None = None) -> list[LeaseEvent]:
        """The evidence trail in order, for one task or one agent run (or all), in one list (read in pages)."""
        return await collect(event_pages(self._db, task_id=task_id, agent_run_id=agent_run_id))

    async def receipt(self, idempotency_key: str) -> StoredReceipt | None:
        """The stored settlement receipt for an idempotency key, if any."""
        return await self._db.read(lambda conn: self._receipt(conn, idempotency_key))

    async def db_now(self) -> datetime:
        """The ledger database's current time (aware)."""
        value = await self._db.read(lambda conn: conn.execute(self._sql.select_now, now_param(None)).scalar_one())
        result = from_ms(value)
        assert result is not None
        return result


_RESOLVED_BY_PERSON = {
    DecisionKind.CONFIRM: "happened",
    DecisionKind.RETRY: "not_happened",
    DecisionKind.ABANDON: "abandoned",
    DecisionKind.CONFIRM_EFFECT: "happened",
    DecisionKind.ABANDON_EFFECT: "abandoned",
}
"""A person's reconcile decisions: how they resolved an ambiguous task (the metric's ``outcome``)."""


def _redacted(receipt: SettlementReceipt) -> tuple[SettlementReceipt, dict[str, Any]]:
    """``receipt`` with the secrets in its text masked (:mod:`agentlease.redaction`), and its JSON form;
    ``receipt`` itself when it holds none (no second validation on the settle path)."""
    dumped = receipt.model_dump(mode="json")
    redacted = redact(dumped)
    if redacted == dumped:
        return receipt, dumped
    receipt = SettlementReceipt.model_validate(redacted)
    return receipt, receipt.model_dump(mode="json")


def _redacted_receipt(receipt: SettlementReceipt) -> SettlementReceipt:
    """``receipt`` with the secrets in its text masked (:mod:`agentlease.redaction`)."""
    return _redacted(receipt)[0]
