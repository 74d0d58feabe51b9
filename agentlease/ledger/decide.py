"""Decisions applied to a task (G8), and a refused decision's entry: ``Ledger.decide`` and
``Ledger.record_refused_decision``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from agentlease.clock import now_param
from agentlease.decisions.table import DECISIONS
from agentlease.enums import DecisionKind, EventKind
from agentlease.errors import TaskClosedError, TaskMovedError
from agentlease.ledger.approvals import count_approval, record_partial_approval
from agentlease.ledger.core import LedgerCore, redacted
from agentlease.ledger.rendering import event_params
from agentlease.ledger.trail import write_event
from agentlease.observability.tracing import current_trace_id
from agentlease.records import ApprovalRequest, SettlementReceipt, TaskRecord, TaskSpec, TraceLink
from agentlease.security.redaction import redact

RESOLVED_BY_PERSON = {
    DecisionKind.CONFIRM: "happened",
    DecisionKind.RETRY: "not_happened",
    DecisionKind.ABANDON: "abandoned",
    DecisionKind.CONFIRM_EFFECT: "happened",
    DecisionKind.ABANDON_EFFECT: "abandoned",
}
"""A person's reconcile decisions: how they resolved an ambiguous task (the metric's ``outcome``)."""


async def decide(
    core: LedgerCore,
    task_id: str,
    kind: DecisionKind,
    *,
    by: str,
    reason: str,
    details: dict[str, Any] | None,
    receipt: SettlementReceipt | None,
    spec: TaskSpec | None,
    expected_generation: int | None,
    now: datetime | None,
    approval_request: ApprovalRequest | None = None,
) -> TaskRecord:
    """``Ledger.decide``: the task after the decision.

    Raises:
        TaskMovedError / TaskNotFoundError / TaskClosedError / ValueError: see ``Ledger.decide``.
    """
    rule = DECISIONS[kind]
    if rule.settles != (receipt is not None):
        raise ValueError(f"{kind.value} {'needs' if rule.settles else 'takes no'} settlement receipt")
    facts = {"by": by, "decision": kind.value, **(redact(details) or {})}
    trace = TraceLink(trace_id=current_trace_id())  # the decision's own trace, while tracing is on
    params = {"key_task_id": task_id, **now_param(now), **event_params(redact(reason), facts, trace)}
    if receipt is not None:
        params["receipt"] = redacted(receipt)[1]
    if kind is DecisionKind.AWAIT_APPROVAL:  # what the person is asked to approve, its secrets masked
        params["approval_request"] = None if approval_request is None else redact(approval_request.model_dump())
    if kind is DecisionKind.APPROVE:  # the approval of this tool and these arguments (docs/recovery.md)
        params["approval_tool"] = spec.tool if spec is not None else None
        params["approval_arguments_sha256"] = spec.arguments_sha256 if spec is not None else None
        params.update(approvals=None, approval_expires_at_ms=None, first_approved_at_ms=None)  # counted below
    write = core.writes.decision(kind)
    approver = str(facts.get("signed_by") or by)  # one person counts once: the verified operator, else the name

    def decide_tx(conn: Connection) -> TaskRecord:
        if spec is not None:
            core.insert_task(conn, spec, now)
        if expected_generation is not None:  # under the row's lock: no claim moves it before the decision
            current = conn.execute(core.sql.current_task, {"key_task_id": task_id}).first()
            if current is not None and current.claim_generation != expected_generation:
                raise TaskMovedError(task_id, expected_generation, current.claim_generation)
        run_params = params
        if kind is DecisionKind.APPROVE:
            ttl = spec.approval_ttl if spec is not None else None
            counted = count_approval(conn, core.sql, task_id, by=approver, ttl=ttl, now=now)
            if counted is not None:
                details = {**facts, "approval": counted.facts()}
                if not counted.complete:
                    trail = {"reason": params["event_reason"], "details": details, "trace": trace}
                    return TaskRecord.from_row(record_partial_approval(conn, core.sql, counted, **trail))
                run_params = {**params, **counted.columns(), "event_details": details}
        rows = write.run(conn, run_params)
        if not rows:
            raise TaskClosedError(task_id, core.task(conn, task_id).status)
        return TaskRecord.from_row(rows[0])

    record = await core.write("decide", spec.tool if spec is not None else "", decide_tx)
    resolved = RESOLVED_BY_PERSON.get(kind)
    if resolved is not None:
        core.metrics.ambiguity_resolved(record.tool, "person", resolved)
    return record


async def record_refused_decision(
    core: LedgerCore, spec: TaskSpec, *, decision: str, by: str | None, refusal: str, now: datetime | None
) -> None:
    """``Ledger.record_refused_decision``: a ``decision_refused`` entry; nothing else changes."""

    def refuse_tx(conn: Connection) -> None:
        core.insert_task(conn, spec, now)
        task = core.task(conn, spec.task_id)
        write_event(
            conn,
            core.sql,
            task_id=spec.task_id,
            kind=EventKind.DECISION_REFUSED,
            generation=task.claim_generation,
            at_ms=conn.execute(core.sql.select_now, now_param(now)).scalar_one(),
            stage=task.stage,
            reason=refusal,
            details={"by": by, "decision": decision, "via": "signal"},
        )

    await core.write("record_refusal", spec.tool, refuse_tx)
