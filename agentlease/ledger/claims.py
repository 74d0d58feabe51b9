"""The claim (``Ledger.claim``): a task taken for one attempt, minting its next claim generation (G1, G3, G6)."""

from __future__ import annotations

import functools
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import SecretStr
from sqlalchemy.engine import Connection

from agentlease.clock import duration_ms, from_ms, now_param
from agentlease.enums import TaskStatus
from agentlease.errors import ApprovalRefusedError, LeaseHeldError, TaskClosedError
from agentlease.ledger.approvals import approval_refusal, approval_remaining, consumed_now, refuse_approval
from agentlease.ledger.compiled import execute
from agentlease.ledger.core import LedgerCore, stored_receipt, task_values
from agentlease.ledger.outages import check_claim_clock
from agentlease.ledger.rendering import event_params, trace_params
from agentlease.ledger.statements import token_sha256
from agentlease.ledger.writes import expired_entry
from agentlease.records import Claim, TaskSpec, TraceLink

LEASE_TOKEN_BYTES = 32
"""Random bytes of a lease token (``secrets.token_urlsafe``): 43 URL-safe characters."""

Claimed = tuple[Claim, bool, str | None]
"""A granted claim, whether it superseded a lapsed lease, and that lease's stage."""

_Granted = tuple[Any, str | None, bool, str | None]
"""The granted row, the previous attempt's error class, and :data:`Claimed`'s last two."""

_NO_TRACE = TraceLink()  # a claim outside Temporal (frozen: shared)


def receipt_mismatch(spec: TaskSpec, tool: str | None, arguments_sha256: str | None) -> str | None:
    """Why a receipt stored for ``spec``'s key (made by ``tool`` with those arguments) does not settle it;
    ``None`` when it does (the same tool, and the same arguments where both are known)."""
    if tool is not None and tool != spec.tool:
        what = f"of tool {tool!r}, not {spec.tool!r}"
    elif arguments_sha256 is not None and spec.arguments_sha256 not in (None, arguments_sha256):
        what = f"of {spec.tool!r} with other arguments"
    else:
        return None
    return (
        f"idempotency key {spec.idempotency_key!r} already has a settlement receipt {what}: a key reused for "
        "another action is refused (HTTP 422 in Stripe's terms)"
    )


@dataclass(frozen=True)
class _Claimer:
    """One claim call: what its statements bind, and the :class:`Claim` a granted row makes."""

    spec: TaskSpec
    owner: str
    trace: TraceLink
    heartbeat_timeout: timedelta | None
    now: datetime | None
    lease_token: str = field(default_factory=lambda: secrets.token_urlsafe(LEASE_TOKEN_BYTES))

    @property
    def gated(self) -> bool:
        """The claim must consume an approval (and never inserts the task)."""
        return self.spec.approval_ttl is not None

    @property
    def key(self) -> dict[str, Any]:
        return {"key_task_id": self.spec.task_id, **now_param(self.now)}

    def _minted(self) -> dict[str, Any]:
        minted = {"lease_owner": self.owner, "lease_token_sha256": token_sha256(self.lease_token)}
        return {**minted, **trace_params(self.trace)[0]}

    def new_task(self) -> dict[str, Any]:
        """The parameters of :func:`~agentlease.ledger.writes.claim_new`, its entry's among them."""
        note = self.note(1, duration_ms(self.spec.lease_ttl))
        return {**task_values(self.spec, self.now), **self._minted(), **event_params(*note, self.trace)}

    def existing_task(self) -> dict[str, Any]:
        """The parameters of :func:`~agentlease.ledger.writes.claim` (its entry's come once it changed the row)."""
        spec, timeout = self.spec, self.heartbeat_timeout
        # Temporal's heartbeat timeout, changed below the lease TTL: the lease follows the shorter.
        shorter = duration_ms(timeout) if timeout is not None and timeout < spec.lease_ttl else None
        return {
            **self.key,
            **self._minted(),
            "claim_needs_approval": self.gated,
            "claim_tool": spec.tool,
            "claim_arguments_sha256": spec.arguments_sha256,
            "claim_approval_ttl_ms": duration_ms(spec.approval_ttl) if spec.approval_ttl is not None else 0,
            "lease_ttl_override_ms": shorter,
        }

    def note(
        self, attempts: int, lease_ttl_ms: int, consumed: Any = None, consumed_by: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The ``claimed`` entry's reason and details: the attempt, the approval consumed (``consumed``: the row
        before) or the generation that did (``consumed_by``), a heartbeat timeout other than the lease's TTL."""
        reason = f"attempt {attempts}"
        details: dict[str, Any] = {}
        if consumed is not None:
            reason += f"; consumed the approval given at {from_ms(consumed.approved_at_ms).isoformat()}"
            details["approval"] = {
                "approved_at_ms": consumed.approved_at_ms,
                "arguments_sha256": consumed.approval_arguments_sha256,
            }
        elif self.gated:
            details["approval"] = {"consumed_by_generation": consumed_by}
        timeout = self.heartbeat_timeout
        if timeout is not None and duration_ms(timeout) != lease_ttl_ms:
            shorter = duration_ms(timeout) < lease_ttl_ms
            follows = "the lease follows the shorter heartbeat timeout" if shorter else "the lease keeps its TTL"
            reason += (
                f"; Temporal's heartbeat timeout ({timeout.total_seconds():g}s) is not the lease "
                f"TTL ({lease_ttl_ms / 1000:g}s): {follows}"
            )
            details.update(heartbeat_timeout_ms=duration_ms(timeout), lease_ttl_ms=lease_ttl_ms)
        if consumed is None and self.gated and consumed_by is not None:
            reason += (
                f"; the approval was consumed by generation {consumed_by}: this attempt follows the recovery policy"
            )
        return reason, details

    def granted(self, row: Any, previous_error_class: str | None) -> Claim:
        """The claim of a granted row (with the receipt stored for its key)."""
        stored = stored_receipt(row, row.idempotency_key)
        refused = (
            None if stored is None else receipt_mismatch(self.spec, row.receipt_tool, row.receipt_arguments_sha256)
        )
        return Claim(
            task_id=self.spec.task_id,
            tool=row.tool,
            generation=row.claim_generation,
            owner=self.owner,
            acquired_at=from_ms(row.lease_acquired_at_ms),
            expires_at=from_ms(row.lease_expires_at_ms),
            lease_ttl=timedelta(milliseconds=row.lease_ttl_ms),
            attempts=row.attempts,
            previous_stage=row.stage,
            previous_error_class=previous_error_class,
            idempotency_key=row.idempotency_key,
            trace=self.trace,
            receipt=None if refused is not None else stored,
            receipt_refused=refused,
            lease_token=SecretStr(self.lease_token),
            approval_remaining=approval_remaining(row, self.spec),
        )


async def claim(
    core: LedgerCore,
    spec: TaskSpec,
    owner: str,
    *,
    trace: TraceLink | None,
    heartbeat_timeout: timedelta | None,
    now: datetime | None,
) -> Claim:
    """``Ledger.claim``: claim ``spec`` for ``owner``, reporting the outcome to the ledger's metrics."""
    if heartbeat_timeout == timedelta(0):
        heartbeat_timeout = None  # Temporal's zero: no heartbeat timeout, so the lease keeps its TTL
    elif heartbeat_timeout is not None and duration_ms(heartbeat_timeout) < 1:
        raise ValueError(
            f"a claim's heartbeat timeout must be at least 1 ms (or zero: none), not "
            f"{heartbeat_timeout.total_seconds():g}s: the lease would lapse as it is granted"
        )
    claimer = _Claimer(spec, owner, trace or _NO_TRACE, heartbeat_timeout, now)
    started = time.perf_counter()
    try:
        granted, superseded, superseded_stage = await _claim_once(core, claimer)
    except ApprovalRefusedError as exc:
        core.metrics.claim(spec.tool, "closed")
        core.metrics.approval(spec.tool, exc.outcome)
        raise
    except LeaseHeldError:
        core.metrics.claim(spec.tool, "held")
        raise
    except TaskClosedError:
        core.metrics.claim(spec.tool, "closed")
        raise
    core.metrics.claim(
        granted.tool,
        "granted",
        seconds=time.perf_counter() - started,
        superseded=superseded,
        superseded_stage=superseded_stage,
        traced=claimer.trace.workflow_id is not None,
    )
    if granted.approval_remaining is not None:
        core.metrics.approval(granted.tool, "consumed", remaining_s=granted.approval_remaining.total_seconds())
    return granted


async def _claim_once(core: LedgerCore, claimer: _Claimer) -> Claimed:
    # The parameters are made here, not on SQLite's ledger thread, which runs every transaction in turn.
    new_task = None if claimer.gated else claimer.new_task()  # an approval-gated claim never inserts its task
    if new_task is not None and core.writes.claim_new.statement is not None:  # PostgreSQL: in one statement
        rows = await core.write_statement("claim", claimer.spec.tool, core.writes.claim_new.statement, new_task)
        if rows:
            return claimer.granted(rows[0], None), False, None
        new_task = None  # the task exists
    claim_tx = functools.partial(_claim_tx, core, claimer, new_task, claimer.existing_task())
    outcome = await core.write("claim", claimer.spec.tool, claim_tx)
    if isinstance(outcome, ApprovalRefusedError):
        raise outcome
    row, previous_error_class, superseded, superseded_stage = outcome
    return claimer.granted(row, previous_error_class), superseded, superseded_stage


def _claim_tx(
    core: LedgerCore, claimer: _Claimer, new_task: dict[str, Any] | None, params: dict[str, Any], conn: Connection
) -> _Granted | ApprovalRefusedError:
    """The granted claim, or the approval refusal it recorded; ``new_task``: a first claim to try (SQLite)."""
    spec = claimer.spec
    check_claim_clock(conn, core.sql, core.db.dialect, spec.task_id, claimer.now)
    if new_task is not None:  # a task the ledger has not seen: created claimed (generation 1)
        rows = core.writes.claim_new.run(conn, new_task)
        if rows:
            return rows[0], None, False, None
    if claimer.gated:
        core.insert_task(conn, spec, claimer.now)  # an approval-gated task is claimed only once approved
    before = conn.execute(core.sql.current_task, claimer.key).one()
    status = TaskStatus(before.status)
    if status.is_terminal or status.awaits_decision:
        raise TaskClosedError(spec.task_id, before.status)
    rows = execute(conn, core.writes.claim.change, params)
    if not rows:
        return _refused(core, claimer, conn, before)
    granted = rows[0]
    superseded = before.status == TaskStatus.RUNNING.value
    if superseded:  # the previous holder neither settled nor released: record why its lease ended
        lapsed = expired_entry(
            task_id=spec.task_id,
            generation=before.claim_generation,
            owner=before.lease_owner,
            stage=before.stage,
            expires_at_ms=before.lease_expires_at_ms,
            at_ms=granted.lease_acquired_at_ms,
            trace=TraceLink.from_mapping(before._mapping),
            by="takeover",
            outcome=f" without renewal; superseded by generation {granted.claim_generation} ({claimer.owner})",
        )
        execute(conn, core.sql.insert_event, lapsed)
    consumed = before if consumed_now(before, granted) else None
    note = claimer.note(granted.attempts, granted.lease_ttl_ms, consumed, granted.approval_consumed_generation)
    [row] = core.writes.claim.finish(conn, rows, {**params, **event_params(*note, claimer.trace)})
    return row, before.error_class, superseded, before.stage


def _refused(core: LedgerCore, claimer: _Claimer, conn: Connection, before: Any) -> ApprovalRefusedError:
    """An approval refusal (recorded; raised after the commit), else raises ``LeaseHeldError`` with the time left."""
    # Measured now, not at ``before``: on PostgreSQL that read may have waited for the row lock.
    refused_at_ms = conn.execute(core.sql.select_now, claimer.key).scalar_one()
    refusal = approval_refusal(before, claimer.spec, refused_at_ms) if claimer.gated else None
    if refusal is not None:
        return refuse_approval(conn, core.sql, claimer.spec, before, refusal, claimer.now)
    raise LeaseHeldError(
        claimer.spec.task_id,
        retry_after=timedelta(milliseconds=max(0, (before.lease_expires_at_ms or 0) - refused_at_ms)),
        holder=before.lease_owner,
        generation=before.claim_generation,
    )
