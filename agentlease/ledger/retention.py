"""Retention: deleting the evidence of final tasks by age, in batches (``agentlease purge``).

A task is purged when its status is final (settled, rejected, abandoned, cancelled) and its last
change (``updated_at_ms``) is older than the cut-off: its evidence trail (``lease_events``), its
task row and, unless receipts are kept, the settlement receipts it stored. Tasks that are open,
waiting for a person or ``cancelled_effect_unknown`` are never purged, however old. Each batch is
one transaction that re-checks the status, so a task redriven meanwhile is left alone. Keeping
receipts (``--keep-receipts``) keeps their idempotency keys answering: a later call with the same
key still settles from the stored receipt instead of acting again. ``docs/security.md``
("Retention and redaction").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import Table, delete, func, select
from sqlalchemy.engine import Connection

from agentlease.clock import to_ms
from agentlease.enums import TaskStatus
from agentlease.ledger.schema import LeaseEventRow, ReceiptRow, TaskRow
from agentlease.ledger.store import Ledger

DEFAULT_BATCH_SIZE = 500
"""Tasks one purge transaction deletes at most. Default 500."""

_FINAL = sorted(s.value for s in TaskStatus if s.is_terminal and s is not TaskStatus.CANCELLED_EFFECT_UNKNOWN)
_T = cast(Table, TaskRow.__table__)
_E = cast(Table, LeaseEventRow.__table__)
_R = cast(Table, ReceiptRow.__table__)


@dataclass(frozen=True)
class PurgeCounts:
    """What a purge deleted (or, in a dry run, would delete).

    Attributes:
        tasks / events / receipts: rows of each table.
        batches: transactions it took (0 in a dry run).
    """

    tasks: int = 0
    events: int = 0
    receipts: int = 0
    batches: int = 0


def _old(cutoff_ms: int) -> Any:
    return (_T.c.status.in_(_FINAL)) & (_T.c.updated_at_ms < cutoff_ms)


async def purge(
    ledger: Ledger,
    older_than: timedelta,
    *,
    keep_receipts: bool = False,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> PurgeCounts:
    """Delete final tasks whose last change is older than ``older_than`` (see the module docstring).

    Args:
        ledger: the ledger.
        older_than: the age, on the ledger's clock, a final task must have. Must be positive.
        keep_receipts: keep the purged tasks' receipts (their keys stay deduplicated). Default false.
        dry_run: count only. Default false.
        batch_size: tasks per transaction (keyset batches by task id). Default 500.

    Returns:
        the counts.

    Raises:
        ValueError: ``older_than`` not positive, or ``batch_size`` below 1.
        LedgerUnavailableError: the ledger could not be reached (batches already done stay done).
    """
    if older_than <= timedelta(0):
        raise ValueError("the age must be positive")
    if batch_size < 1:
        raise ValueError("the batch size must be at least 1")
    cutoff_ms = to_ms(await ledger.db_now()) - int(older_than.total_seconds() * 1000)
    if dry_run:
        return await ledger.database.read(lambda conn: _count(conn, cutoff_ms, keep_receipts))
    total = PurgeCounts()
    after = ""
    while True:

        def batch(conn: Connection, after: str = after) -> tuple[PurgeCounts, str | None]:
            query = (
                select(_T.c.task_id)
                .where(_old(cutoff_ms) & (_T.c.task_id > after))
                .order_by(_T.c.task_id)
                .limit(batch_size)
            )
            if conn.dialect.name == "postgresql":
                query = query.with_for_update(skip_locked=True)  # rows a lease write holds wait for the next run
            ids = list(conn.execute(query).scalars())
            if not ids:
                return PurgeCounts(), None
            events = conn.execute(delete(_E).where(_E.c.task_id.in_(ids))).rowcount
            receipts = 0 if keep_receipts else conn.execute(delete(_R).where(_R.c.task_id.in_(ids))).rowcount
            tasks = conn.execute(delete(_T).where(_T.c.task_id.in_(ids) & _old(cutoff_ms))).rowcount
            return PurgeCounts(tasks, events, receipts, 1), ids[-1]

        done, last = await ledger.database.write(batch)
        if last is None:
            return total
        total = PurgeCounts(
            total.tasks + done.tasks,
            total.events + done.events,
            total.receipts + done.receipts,
            total.batches + 1,
        )
        after = last


def _count(conn: Connection, cutoff_ms: int, keep_receipts: bool) -> PurgeCounts:
    old_ids = select(_T.c.task_id).where(_old(cutoff_ms))
    tasks = conn.execute(select(func.count()).select_from(_T).where(_old(cutoff_ms))).scalar_one()
    events = conn.execute(select(func.count()).select_from(_E).where(_E.c.task_id.in_(old_ids))).scalar_one()
    receipts = (
        0
        if keep_receipts
        else conn.execute(select(func.count()).select_from(_R).where(_R.c.task_id.in_(old_ids))).scalar_one()
    )
    return PurgeCounts(tasks, events, receipts, 0)


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or ``2w`` as a duration.

    Raises:
        ValueError: anything else, or not positive.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    if unit not in units or not number.isdigit() or int(number) <= 0:
        raise ValueError(f"bad age {text!r}: a positive whole number and a unit s, m, h, d or w (30d)")
    return timedelta(seconds=int(number) * units[unit])


__all__ = ["DEFAULT_BATCH_SIZE", "PurgeCounts", "parse_age", "purge"]
