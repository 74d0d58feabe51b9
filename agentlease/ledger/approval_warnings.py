"""Approvals about to lapse: the sweeper's ``approval_expiring`` warning (``docs/decisions.md``, "When an
approval lapses"), written once per approval while there is time to act on it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, Select, and_, bindparam, exists, select
from sqlalchemy.engine import Connection

from agentlease.clock import bound_now_ms, duration_ms, from_ms, now_param
from agentlease.enums import EventKind, TaskStatus
from agentlease.ledger.store import Ledger
from agentlease.ledger.tables import EVENTS, TASKS
from agentlease.ledger.trail import write_event

_T, _E = TASKS.c, EVENTS.c


@dataclass(frozen=True)
class ExpiringApproval:
    """An approval the sweeper warned of: its task and tool, and whether it waits for more approvals
    (``person``) or for its call's claim (``claim``)."""

    task_id: str
    tool: str
    waiting_for: str


def expiring_query(dialect_name: str) -> Select[Any]:
    """Tasks whose approval, not consumed, lapses within ``within_ms`` of now and was not warned of in that
    window, soonest first (``limit`` of them), locked for the warning's transaction."""
    now = bound_now_ms(dialect_name)
    within = bindparam("within_ms", type_=BigInteger)
    warned = exists().where(
        _E.task_id == _T.task_id,
        _E.kind == EventKind.APPROVAL_EXPIRING.value,
        _E.at_ms >= _T.approval_expires_at_ms - within,
    )
    waiting = (TaskStatus.PENDING.value, TaskStatus.AWAITING_APPROVAL.value)
    return (
        select(TASKS)
        .where(
            and_(_T.approval_expires_at_ms > now, _T.approval_expires_at_ms <= now + within),
            _T.approval_consumed_generation.is_(None),
            _T.status.in_(waiting),
            ~warned,
        )
        .order_by(_T.approval_expires_at_ms, _T.task_id)
        .limit(bindparam("limit"))
        .with_for_update(of=TASKS, skip_locked=True)
    )


def _warning(row: Any, now_ms: int) -> tuple[str, str, dict[str, Any]]:
    """What waits (``person`` or ``claim``), the entry's reason and its details."""
    given = [a for a in row.approvals or [] if isinstance(a, dict)]
    required = int((row.approval_request or {}).get("approvals_required") or 1)
    by = ", ".join(str(a.get("by")) for a in given) or "?"
    left_s = max(0, row.approval_expires_at_ms - now_ms) / 1000
    lapses = f"lapses at {from_ms(row.approval_expires_at_ms).isoformat()} (in {left_s:g}s, ledger clock)"
    if row.status == TaskStatus.AWAITING_APPROVAL.value:
        waiting_for = "person"
        reason = (
            f"{len(given)} of {required} approvals ({by}): the first {lapses}; the others must approve before, "
            "or it is asked again"
        )
    else:
        waiting_for = "claim"
        reason = f"the approval ({by}) {lapses} before its call claimed it; then the call waits to be approved again"
    details = {
        "expires_at_ms": row.approval_expires_at_ms,
        "approved_by": [a.get("by") for a in given],
        "approvals_required": required,
        "waiting_for": waiting_for,
    }
    return waiting_for, reason, details


async def warn_expiring_approvals(
    ledger: Ledger, *, within: timedelta, limit: int, now: datetime | None = None
) -> list[ExpiringApproval]:
    """Write one ``approval_expiring`` entry for each approval (up to ``limit``, soonest first) that lapses
    within ``within`` of ``now`` (default the database's clock) and was not warned of yet; count each in
    ``agentlease_approvals_expiring_total``. Returns the approvals warned of."""
    query = expiring_query(ledger.database.dialect)
    params = {"within_ms": duration_ms(within), "limit": limit, **now_param(now)}
    sql = ledger.statements

    def warn_tx(conn: Connection) -> list[ExpiringApproval]:
        rows = conn.execute(query, params).all()
        if not rows:
            return []
        now_ms = int(conn.execute(sql.select_now, now_param(now)).scalar_one())
        warned = []
        for row in rows:
            waiting_for, reason, details = _warning(row, now_ms)
            write_event(
                conn,
                sql,
                task_id=row.task_id,
                kind=EventKind.APPROVAL_EXPIRING,
                generation=row.claim_generation,
                at_ms=now_ms,
                stage=row.stage,
                reason=reason,
                details=details,
            )
            warned.append(ExpiringApproval(row.task_id, row.tool, waiting_for))
        return warned

    warned = await ledger.database.write(warn_tx)
    for approval in warned:
        ledger.metrics.approval_expiring(approval.tool, approval.waiting_for)
    return warned
