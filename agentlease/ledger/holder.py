"""The holder's writes: renew, settle, and the lease ends (release, dead-letter, park) (G2, G5, G6, G10), each
guarded by the held claim; a refused one is recorded (``lease_lost``, ``late_unapplied``) and raised."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from agentlease import limits
from agentlease.clock import duration_ms, from_ms
from agentlease.enums import ErrorClass, EventKind, Stage, TaskStatus
from agentlease.ledger.core import LedgerCore, Refusal, redacted, stored_receipt
from agentlease.ledger.listing import holder_stage
from agentlease.ledger.outages import own_lease_end, own_settle
from agentlease.ledger.rendering import event_params
from agentlease.observability.tracing import annotate_stage
from agentlease.records import Claim, SettlementReceipt, StoredReceipt
from agentlease.security.redaction import redact

_Renewed = tuple[datetime, str | None] | Refusal
_Settled = tuple[StoredReceipt, int] | Refusal


async def renew(
    core: LedgerCore,
    claim: Claim,
    *,
    reason: str,
    stage: Stage | None,
    details: dict[str, Any] | None,
    ttl: timedelta | None,
    now: datetime | None,
) -> datetime:
    """``Ledger.renew``: the new expiry. Raises ``LeaseLostError`` (recorded) or ``ValueError``."""
    if stage is Stage.SETTLED:
        raise ValueError("a renewal does not enter 'settled'; settle with a receipt")
    if not reason.strip():
        raise ValueError("a renewal needs a specific reason")
    if ttl is not None and duration_ms(ttl) < 1:
        raise ValueError(f"a renewal's ttl must be at least 1 ms, not {ttl.total_seconds():g}s: the lease would lapse")
    reason = limits.clip(redact(reason))
    shorter = ttl is not None and ttl < claim.lease_ttl
    params = {
        **core.held(claim, now),
        "new_stage": None if stage is None else stage.value,
        "lease_ttl_override_ms": duration_ms(ttl) if shorter and ttl is not None else None,
        **event_params(reason, redact(details) or {}, claim.trace),
    }
    held_in: list[str | None] = []  # a refused renewal: the stage its holder was in (its generation's last)

    def renewed(row: Any) -> _Renewed:
        expires_at = from_ms(row.lease_expires_at_ms)
        assert expires_at is not None
        return expires_at, row.stage

    def refused(conn: Connection) -> _Renewed:
        held_in.append(stage.value if stage else holder_stage(conn, claim.task_id, claim.generation))
        facts = {"stage": None if stage is None else stage.value, "renew_reason": reason}
        return core.refused(conn, claim, "renew", EventKind.LEASE_LOST, now, facts)

    outcome = await core.write_lease("renew", claim.tool, core.writes.renew, params, granted=renewed, refused=refused)
    lost = isinstance(outcome, Refusal)
    shown = (held_in[-1] if held_in else None) if isinstance(outcome, Refusal) else outcome[1]
    annotate_stage(shown)
    core.metrics.renewal(claim.tool, shown, renewed=not lost)
    return core.granted(claim, "renew", outcome)[0]


async def settle(
    core: LedgerCore,
    claim: Claim,
    receipt: SettlementReceipt,
    *,
    result: dict[str, Any] | None,
    retried: bool,
    reconciled: dict[str, Any] | None,
    now: datetime | None,
) -> StoredReceipt:
    """``Ledger.settle``: the receipt that stands for the key. Raises ``LeaseLostError`` (recorded)."""
    receipt, receipt_json = redacted(receipt)  # docs/security.md, "Retention and redaction"
    result = redact(result)
    reason = f"receipt {receipt.external_system}:{receipt.external_id} ({receipt.status})"
    details: dict[str, Any] = {"receipt": receipt_json}
    if reconciled is not None:  # automatic reconciliation: no person involved
        reason = f"reconciled by the probe, no person involved: {reason}"
        details.update(reconciled_by="probe", evidence=redact(reconciled))
    params = {**core.held(claim, now), "receipt": receipt_json, **event_params(reason, details, claim.trace)}

    def settled(row: Any) -> _Settled:
        if (row.receipt_task_id, row.receipt_generation) != (claim.task_id, claim.generation):
            stored = stored_receipt(row, claim.idempotency_key)
            assert stored is not None
            return stored, row.renewal_count
        ours = StoredReceipt(
            idempotency_key=claim.idempotency_key,
            task_id=claim.task_id,
            claim_generation=claim.generation,
            receipt=receipt,
        )
        return ours, row.renewal_count

    def refused(conn: Connection) -> _Settled:
        stored_now = core.receipt(conn, claim.idempotency_key) if retried else None
        own = own_settle(conn, core.sql, claim, receipt_json, stored_now)
        if own is not None:  # the first try committed, its answer lost in the outage
            return own
        facts = {"receipt": receipt_json, "result": result}
        return core.refused(conn, claim, "settle", EventKind.LATE_UNAPPLIED, now, facts)

    outcome = await core.write_lease("settle", claim.tool, core.writes.settle, params, granted=settled, refused=refused)
    renewals = None if isinstance(outcome, Refusal) else outcome[1]
    core.metrics.settle(claim.tool, settled=renewals is not None, renewals=renewals)
    return core.granted(claim, "settle", outcome)[0]


async def end_lease(
    core: LedgerCore,
    claim: Claim,
    operation: str,
    status: TaskStatus,
    error_class: ErrorClass | str,
    error: str,
    now: datetime | None,
    details: dict[str, Any] | None = None,
    retried: bool = False,
) -> None:
    """``Ledger.release``, ``dead_letter`` and ``await_decision``: end the held lease with ``status``.

    Raises:
        LeaseLostError: the holder no longer holds the lease (recorded as ``lease_lost``).
        ValueError: ``error_class`` is not an :class:`~agentlease.enums.ErrorClass`.
    """
    known = ErrorClass(error_class)  # a known class only: the next attempt's policy reads it
    error = limits.clip(redact(error))
    params = {
        **core.held(claim, now),
        "status": status.value,
        "error_class": known.value,
        "last_error": error,
        "attempts_returned": int(not known.counts_as_attempt),
        **event_params(f"{known.value}: {error}", redact(details), claim.trace),
    }

    def ended(row: Any) -> Refusal | str | None:
        return row.stage  # the stage the ledger keeps

    def refused(conn: Connection) -> Refusal | str | None:
        if retried and own_lease_end(conn, core.sql, claim, status, known, error):
            return None  # the first try committed, its answer lost in the outage
        facts = {"error_class": known.value, "error": error}
        return core.refused(conn, claim, operation, EventKind.LEASE_LOST, now, facts)

    outcome = await core.write_lease(
        operation, claim.tool, core.writes.end_lease, params, granted=ended, refused=refused
    )
    annotate_stage(core.granted(claim, operation, outcome))
    core.metrics.lease_end(claim.tool, status, known)
