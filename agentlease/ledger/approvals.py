"""Approvals bound to one execution, around the claim that consumes them (``docs/decisions.md``, "Approvals")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from agentlease.clock import NOW_PARAM, duration_ms, from_ms, now_param
from agentlease.enums import EventKind, TaskStatus
from agentlease.errors import ApprovalRefusedError, ApprovalRepeatedError
from agentlease.ledger.compiled import execute
from agentlease.ledger.statements import LeaseStatements
from agentlease.ledger.trail import write_event
from agentlease.records import TaskSpec, TraceLink


def consumed_now(before: Any, granted: Any) -> bool:
    """Whether the claim that made ``granted`` from ``before`` consumed the task's approval."""
    return before.approval_consumed_generation is None and granted.approval_consumed_generation == (
        granted.claim_generation
    )


def approval_remaining(granted: Any, spec: TaskSpec) -> timedelta | None:
    """How long the approval this claim consumed had left (``None``: it consumed none)."""
    if spec.approval_ttl is None or granted.approved_at_ms is None:
        return None
    if granted.approval_consumed_generation != granted.claim_generation:
        return None
    left_ms = granted.approved_at_ms + duration_ms(spec.approval_ttl) - granted.lease_acquired_at_ms
    return timedelta(milliseconds=left_ms)


def approval_refusal(before: Any, spec: TaskSpec, now_ms: int) -> ApprovalRefusedError | None:
    """Why the claim of approval-gated ``spec`` may consume no approval (``None``: it needs none or has one)."""
    if before.approval_consumed_generation is not None or before.claim_generation != 0:
        return None
    assert spec.approval_ttl is not None
    task = spec.task_id
    if before.approved_at_ms is None:
        why = (
            f"approval refused at the claim: no approval of {spec.tool} is recorded for this call; "
            "it runs once approved"
        )
        return ApprovalRefusedError(task, why, "missing")
    if before.approval_tool != spec.tool:
        why = f"approval refused at the claim: the approval was given for tool {before.approval_tool}, not {spec.tool}"
        return ApprovalRefusedError(task, why, "mismatched")
    if before.approval_arguments_sha256 != spec.arguments_sha256:
        why = (
            "approval refused at the claim: the approval was given for other arguments (sha256 "
            f"{(before.approval_arguments_sha256 or '')[:12]}..., this call {(spec.arguments_sha256 or '')[:12]}...): "
            "changed arguments need a new approval"
        )
        return ApprovalRefusedError(task, why, "mismatched")
    expires_ms = before.approved_at_ms + duration_ms(spec.approval_ttl)
    if expires_ms <= now_ms:
        why = (
            f"approval refused at the claim: the approval given at {from_ms(before.approved_at_ms).isoformat()} "
            f"expired at {from_ms(expires_ms).isoformat()} (approval TTL {spec.approval_ttl.total_seconds():g}s, "
            "ledger clock); approve it again"
        )
        return ApprovalRefusedError(task, why, "expired")
    return None


def refuse_approval(
    conn: Connection,
    sql: LeaseStatements,
    spec: TaskSpec,
    before: Any,
    refusal: ApprovalRefusedError,
    now: datetime | None,
) -> ApprovalRefusedError:
    """Send the task back to ``awaiting_approval`` with an ``approval_refused`` entry; the refusal, raised once
    the claim's transaction commits."""
    rows = execute(conn, sql.refuse_approval, {"key_task_id": spec.task_id, **now_param(now)})
    if not rows:  # not pending (a task claimed before approvals were bound)
        return refusal
    write_event(
        conn,
        sql,
        task_id=spec.task_id,
        kind=EventKind.APPROVAL_REFUSED,
        generation=before.claim_generation,
        at_ms=rows[0].updated_at_ms,
        stage=before.stage,
        reason=refusal.why,
        details={
            "refused": refusal.outcome,
            "approved_at_ms": before.approved_at_ms,
            "approval_ttl_ms": duration_ms(spec.approval_ttl) if spec.approval_ttl is not None else None,
            "approved_arguments_sha256": before.approval_arguments_sha256,
            "arguments_sha256": spec.arguments_sha256,
        },
    )
    return refusal


@dataclass(frozen=True)
class CountedApproval:
    """The approvals of a call once one more is counted: ``given`` (``{"by", "at_ms"}`` each, this one last;
    any that lapsed dropped), of ``required``; ``expires_at_ms``: when the first of them lapses (``None``: the
    tool's approval TTL is not known here)."""

    before: Any
    given: list[dict[str, Any]]
    required: int
    expires_at_ms: int | None
    now_ms: int

    @property
    def complete(self) -> bool:
        """Enough different people approved: the call may run."""
        return len(self.given) >= self.required

    def columns(self) -> dict[str, Any]:
        """The bound parameters of the approve statement that records them."""
        return {
            "approvals": self.given,
            "approval_expires_at_ms": self.expires_at_ms,
            "first_approved_at_ms": min(a["at_ms"] for a in self.given),
        }

    def facts(self) -> dict[str, Any]:
        """What the ``approved`` entry records of them: ``{"given": 1, "required": 2, "expires_at_ms": ...}``."""
        return {"given": len(self.given), "required": self.required, "expires_at_ms": self.expires_at_ms}


def count_approval(
    conn: Connection, sql: LeaseStatements, task_id: str, *, by: str, ttl: timedelta | None, now: datetime | None
) -> CountedApproval | None:
    """Count ``by``'s approval of ``task_id`` (the row locked) with those given before and not lapsed (``ttl``:
    the tool's approval TTL, on the ledger's clock). ``None``: the task does not await approval (the decision's
    own statement refuses it).

    Raises:
        ApprovalRepeatedError: ``by`` approved it already; nothing changed.
    """
    before = conn.execute(sql.current_task, {"key_task_id": task_id}).first()
    if before is None or before.status != TaskStatus.AWAITING_APPROVAL.value:
        return None
    now_ms = int(conn.execute(sql.select_now, now_param(now)).scalar_one())
    required = int((before.approval_request or {}).get("approvals_required") or 1)
    ttl_ms = None if ttl is None else duration_ms(ttl)
    given = [
        a for a in before.approvals or [] if isinstance(a, dict) and (ttl_ms is None or a["at_ms"] + ttl_ms > now_ms)
    ]
    if any(a["by"] == by for a in given):
        raise ApprovalRepeatedError(task_id, by, len(given), required)
    given.append({"by": by, "at_ms": now_ms})
    expires_at_ms = None if ttl_ms is None else min(a["at_ms"] for a in given) + ttl_ms
    return CountedApproval(before, given, required, expires_at_ms, now_ms)


def record_partial_approval(
    conn: Connection,
    sql: LeaseStatements,
    counted: CountedApproval,
    *,
    reason: str,
    details: dict[str, Any],
    trace: TraceLink,
) -> Any:
    """Record an approval that is not yet enough (the task still awaits approval) and its ``approved`` entry;
    the row after."""
    before = counted.before
    params = {"key_task_id": before.task_id, "approvals": counted.given, NOW_PARAM: counted.now_ms}
    rows = execute(conn, sql.count_approval, {**params, "approval_expires_at_ms": counted.expires_at_ms})
    write_event(
        conn,
        sql,
        task_id=before.task_id,
        kind=EventKind.APPROVED,
        generation=before.claim_generation,
        at_ms=counted.now_ms,
        stage=before.stage,
        reason=reason,
        details=details,
        trace=trace,
    )
    return rows[0]
