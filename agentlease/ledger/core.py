"""What every ledger operation shares: where its transaction runs, and how a refused holder write is
recorded and raised (G2, G10)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from agentlease.clock import duration_ms, now_param
from agentlease.enums import EventKind, TaskStatus
from agentlease.errors import LeaseLostError, LeaseTokenMismatchError, LedgerUnavailableError, TaskNotFoundError
from agentlease.ledger.compiled import execute
from agentlease.ledger.database import LedgerDatabase, Transaction
from agentlease.ledger.rendering import Rendered
from agentlease.ledger.statements import held, lease_statements, token_sha256
from agentlease.ledger.trail import write_event
from agentlease.ledger.writes import lease_writes
from agentlease.observability.metrics import LeaseMetrics
from agentlease.records import Claim, SettlementReceipt, StoredReceipt, TaskRecord, TaskSpec
from agentlease.security.redaction import redact

R = TypeVar("R")


@dataclass(frozen=True)
class Refusal:
    """Why a guarded write touched no row.

    Attributes:
        current_generation / status: the task's, as the ledger has them.
        token_refused: owner and generation were the ledger's, the lease token was not (a rebuilt claim).
    """

    current_generation: int | None
    status: str | None
    token_refused: bool = False


def task_values(spec: TaskSpec, now: datetime | None) -> dict[str, Any]:
    """The parameters of a new task row for ``spec``."""
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


def stored_receipt(row: Any, idempotency_key: str) -> StoredReceipt | None:
    """The receipt a lease write read for the key (:data:`~agentlease.ledger.rendering.RECEIPT_COLUMNS`)."""
    if row.receipt_task_id is None:
        return None
    return StoredReceipt(
        idempotency_key=idempotency_key,
        task_id=row.receipt_task_id,
        claim_generation=row.receipt_generation,
        receipt=row.stored_receipt,
    )


def redacted(receipt: SettlementReceipt) -> tuple[SettlementReceipt, dict[str, Any]]:
    """``receipt`` with the secrets in its text masked, and its JSON form (``receipt`` itself when it holds none)."""
    dumped = receipt.model_dump(mode="json")
    masked = redact(dumped)
    if masked == dumped:
        return receipt, dumped
    receipt = SettlementReceipt.model_validate(masked)
    return receipt, receipt.model_dump(mode="json")


class LedgerCore:
    """The database, statements, lease writes and metrics of one :class:`~agentlease.ledger.store.Ledger`.

    Args:
        database / metrics: where the transactions run (owned by the ledger), where each operation reports.
    """

    def __init__(self, database: LedgerDatabase, metrics: LeaseMetrics) -> None:
        self.db = database
        self.sql = lease_statements(database.dialect)
        self.writes = lease_writes(database.dialect)
        self.metrics = metrics

    async def write(self, operation: str, tool: str, transaction: Transaction[R], *, one: bool = False) -> R:
        """One write transaction (``one``: its change is one statement, :meth:`LedgerDatabase.write_one`).

        Raises:
            LedgerUnavailableError: counted (``agentlease_ledger_unavailable_total``); the write may have committed.
        """
        try:
            return await (self.db.write_one if one else self.db.write)(transaction)
        except LedgerUnavailableError:
            self.metrics.ledger_unavailable(tool, operation)
            raise

    async def write_statement(self, operation: str, tool: str, statement: Any, params: dict[str, Any]) -> list[Any]:
        """One prebuilt statement alone (:meth:`LedgerDatabase.write_statement`): its rows; outages as :meth:`write`."""
        try:
            return await self.db.write_statement(statement, params)
        except LedgerUnavailableError:
            self.metrics.ledger_unavailable(tool, operation)
            raise

    async def write_lease(
        self,
        operation: str,
        tool: str,
        write: Rendered,
        params: dict[str, Any],
        *,
        granted: Callable[[Any], R],
        refused: Transaction[R],
    ) -> R:
        """A lease write alone: ``granted`` of the row it changed (run off SQLite's ledger thread), or
        ``refused`` (a transaction; on PostgreSQL one of its own after the write) when it changed none."""
        if write.statement is not None:
            rows = await self.write_statement(operation, tool, write.statement, params)
            return granted(rows[0]) if rows else await self.write(operation, tool, refused, one=True)

        def transaction(conn: Connection) -> tuple[bool, Any]:
            rows = write.run(conn, params)
            return (True, rows[0]) if rows else (False, refused(conn))

        changed, outcome = await self.write(operation, tool, transaction, one=True)
        return granted(outcome) if changed else outcome

    @staticmethod
    def held(claim: Claim, now: datetime | None) -> dict[str, Any]:
        """Parameters of the guard of every holder write (G2)."""
        token = token_sha256(claim.lease_token.get_secret_value())
        return {**held(claim.task_id, claim.owner, claim.generation, token), **now_param(now)}

    def refused(
        self, conn: Connection, claim: Claim, operation: str, kind: EventKind, now: datetime | None, details: Any
    ) -> Refusal:
        """Record a refused holder write (a ``lease_lost`` or ``late_unapplied`` entry) and say why it was refused."""
        guard = self.held(claim, now)
        row = conn.execute(self.sql.refused, guard).one()
        token_refused = (row.claim_generation, row.lease_owner) == (claim.generation, claim.owner) and (
            row.lease_token_sha256 != guard["held_token_sha256"]
        )
        refusal = Refusal(row.claim_generation, row.status, token_refused)
        reason = f"{operation} refused: ledger has generation {refusal.current_generation}, status {refusal.status}"
        still_ours = (row.claim_generation, row.lease_owner, row.status) == (
            claim.generation,
            claim.owner,
            TaskStatus.RUNNING.value,
        )
        lapsed_ms = None if row.lease_expires_at_ms is None else row.now_ms - row.lease_expires_at_ms
        if still_ours and not token_refused and lapsed_ms is not None and lapsed_ms >= 0:
            lapsed_s = lapsed_ms / 1000
            reason = (
                f"{operation} refused: the lease of generation {claim.generation} lapsed {lapsed_s:.1f}s earlier "
                "(no renewal within its TTL); nobody has claimed the task since"
            )
        if token_refused:
            reason = (
                f"{operation} refused: the claim of generation {claim.generation} did not present the lease token "
                "the ledger minted with it (a claim rebuilt from listings or the trail cannot write)"
            )
        facts = {"operation": operation, **({"lease_token": "refused"} if token_refused else {}), **details}
        write_event(
            conn,
            self.sql,
            task_id=claim.task_id,
            kind=kind,
            generation=claim.generation,
            at_ms=row.now_ms,
            owner=claim.owner,
            reason=reason,
            details=facts,
            trace=claim.trace,
        )
        return refusal

    @staticmethod
    def granted(claim: Claim, operation: str, outcome: R | Refusal) -> R:
        """The outcome of a holder write; a refusal (already recorded) raises.

        Raises:
            LeaseTokenMismatchError: (a ``LeaseLostError``) the claim did not present its lease token.
            LeaseLostError: the write was refused (G2).
        """
        if isinstance(outcome, Refusal) and outcome.token_refused:
            raise LeaseTokenMismatchError(claim.task_id, claim.generation, operation=operation, status=outcome.status)
        if isinstance(outcome, Refusal):
            raise LeaseLostError(
                claim.task_id,
                claim.generation,
                operation=operation,
                current_generation=outcome.current_generation,
                status=outcome.status,
            )
        return outcome

    def insert_task(self, conn: Connection, spec: TaskSpec, now: datetime | None) -> None:
        """Create the task row (``pending``) on first sight; an existing row is left as it is."""
        conn.execute(self.sql.insert_task, task_values(spec, now))

    def task(self, conn: Connection, task_id: str) -> TaskRecord:
        """The task's row. Raises :class:`TaskNotFoundError`."""
        row = conn.execute(self.sql.select_task, {"key_task_id": task_id}).first()
        if row is None:
            raise TaskNotFoundError(task_id)
        return TaskRecord.from_row(row)

    def receipt(self, conn: Connection, idempotency_key: str) -> StoredReceipt | None:
        """The receipt stored for the key, if any."""
        rows = execute(conn, self.sql.select_receipt, {"key_idempotency_key": idempotency_key})
        return stored_receipt(rows[0], idempotency_key) if rows else None
